"""ncnn models (the ncnn stage's zip of model.ncnn.param and model.ncnn.bin) in ncnn's Python binding, as an app's
ncnn runs them: on its CPU path, or (the vulkan route, runtime name plan.VULKAN_RUNTIME) on its Vulkan compute path
with fp16 storage and arithmetic on, as ncnn runs on a phone's GPU. Where the host has no GPU, Mesa's software Vulkan
driver (llvmpipe) runs that path: its numbers are ncnn's Vulkan kernels', its speed is not a phone GPU's.

How the nets are made and fed (fp16 options, a batch one sample at a time, integer inputs as int32, blob order) is
guest.py's, which the emulated aarch64 Python runs too; this module adds the Vulkan device, one-line errors and
the facts verify records.

config: "timing": {"threads": n} is ncnn's num_threads; one where unset.
"""

import collections
import re
import zipfile
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.ncnn.plan import VULKAN_RUNTIME
from mobilebuild.routes.ncnn.worker import guest, int8
from mobilebuild.worker import quiet

PARAM, BIN = guest.PARAM, guest.BIN
NO_VULKAN = ("ncnn finds no Vulkan device on this host (ncnn.get_gpu_count() is 0): install a Vulkan driver, Debian's "
             "mesa-vulkan-drivers (Mesa's llvmpipe runs ncnn's Vulkan path on the CPU), or build this target on a "
             "host with a GPU")
_DEVICE = re.compile(r"^\[\d+ (?P<name>.+?)\]\s")


def threads_for(config):
    return int((getattr(config, "timing", None) or {}).get("threads") or 1)


def vulkan_for(config):
    return getattr(config, "runtime", None) == VULKAN_RUNTIME


_gpu = {}


def gpu():
    """(the number of Vulkan devices ncnn finds, the first one's name or None). ncnn creates its Vulkan instance on
    the first call and writes four lines about the device to file descriptor 2: they are read here, not shown."""
    if not _gpu:
        import ncnn

        said = []
        with quiet.native_stderr(kept=said, kept_prefix=(b"",)):
            count = ncnn.get_gpu_count()
        names = [found["name"] for line in said if (found := _DEVICE.match(line))]
        _gpu.update(count=count, name=names[0] if names else None)
    return _gpu["count"], _gpu["name"]


def read(path):
    """({name: bytes} of the zip's two files, its precision); one line where it is not the ncnn stage's zip."""
    try:
        return guest.read(path)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise MobileBuildError(f"{Path(path).name} is not an ncnn model zip ({PARAM} and {BIN}): {exc}",
                               field="targets") from None


def net(path, threads=1, vulkan=False):
    """An ncnn.Net of the zip at `path` (guest.net); one line where the host has no Vulkan device for it, or ncnn
    cannot load it."""
    files, precision = read(path)
    if vulkan and gpu()[0] == 0:
        raise MobileBuildError(NO_VULKAN, field="targets")
    kept = []
    try:
        with quiet.native_stderr(kept=kept, kept_prefix=(b"",)):
            return guest.net(files, precision, threads, vulkan)
    except RuntimeError:
        said = "; ".join(line.strip() for line in kept if line.strip()) or "no reason given"
        raise MobileBuildError(f"ncnn cannot load {Path(path).name}: {said}", field="targets") from None


class NcnnModel:
    """An ncnn.Net as a callable from input tensors, in forward's order, to a tensor (a tuple for several)."""

    def __init__(self, found):
        self.run = guest.runner(found)

    def __call__(self, *tensors):
        if len(tensors) != len(self.run.inputs):
            raise MobileBuildError(f"the ncnn model takes {len(self.run.inputs)} input(s), not {len(tensors)}",
                                   field="inputs")
        found = [torch.from_numpy(array) for array in self.run([t.detach().cpu().numpy() for t in tensors])]
        return found[0] if len(found) == 1 else tuple(found)


def load(path, config):
    return NcnnModel(net(path, threads_for(config), vulkan_for(config)))


def output_blobs(param_text):
    """The blobs pnnx names as the model's outputs (out0, out1...), in order."""
    tops = [top for layer in int8.parse(param_text) for top in layer.tops]
    return guest.numbered(top for top in tops if re.fullmatch(r"out\d+", top))


def inspect(path, config):
    """Facts read from the zip without running it: layers by type, the weights' storage, inputs and outputs, sizes;
    for the Vulkan route, the host's Vulkan device."""
    files, precision = read(path)
    layers = int8.parse(files[PARAM].decode())
    kinds = [layer.type for layer in layers if layer.type != "Input"]
    facts = {"layers": len(kinds), "layer_types": dict(sorted(collections.Counter(kinds).items())),
             "precision": precision,
             "inputs": [layer.name for layer in layers if layer.type == "Input"],
             "outputs": output_blobs(files[PARAM].decode()),
             "param_bytes": len(files[PARAM]), "bin_bytes": len(files[BIN])}
    if precision == "int8":  # the layers given int8 scales, of those with weights; the others run in fp32
        int8.spans(layers, files[BIN])
        facts["int8_layers"] = sum(1 for layer in layers if int8.is_int8(layer))
        facts["weighted_layers"] = sum(1 for layer in layers if layer.data)
    if vulkan_for(config):
        count, name = gpu()
        facts["vulkan_device"] = name if count else None
    return facts

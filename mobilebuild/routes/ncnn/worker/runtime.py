"""ncnn models (the ncnn stage's zip of model.ncnn.param and model.ncnn.bin) in ncnn's Python binding, as an app's
ncnn runs them: on its CPU path, or (the vulkan route, runtime name plan.VULKAN_RUNTIME) on its Vulkan compute path
with fp16 storage and arithmetic on, as ncnn runs on a phone's GPU. Where the host has no GPU, Mesa's software Vulkan
driver (llvmpipe) runs that path: its numbers are ncnn's Vulkan kernels', its speed is not a phone GPU's.

The CPU path keeps ncnn's fp16 options (packed, storage, arithmetic) off, so that fp32 weights compute in fp32 (on
ARM they would round activations to fp16: the options default to on); with fp16 weights (`ncnn: {weights: fp16}`)
they are on, as an app shipping fp16 weights would set them.

ncnn's blobs have no batch axis: a batch goes one sample at a time (ncnn.Mat(array, batch_index=0) keeps the first
sample only, without a word), and the outputs are stacked again. Integer inputs (token ids) go in as int32: ncnn's
Embed reads int64 or float ids as garbage, with no error. Inputs are in0, in1... and outputs out0, out1... in
forward's order.

config: "timing": {"threads": n} is ncnn's num_threads; one where unset.
"""

import collections
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy
import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.ncnn.plan import VULKAN_RUNTIME
from mobilebuild.worker import quiet

PARAM, BIN = "model.ncnn.param", "model.ncnn.bin"
NO_VULKAN = ("ncnn finds no Vulkan device on this host (ncnn.get_gpu_count() is 0): install a Vulkan driver, Debian's "
             "mesa-vulkan-drivers (Mesa's llvmpipe runs ncnn's Vulkan path on the CPU), or build this target on a "
             "host with a GPU")
FP16_TAG = b"\x47\x6b\x30\x01"  # 0x01306B47 little-endian: an fp16 weight array in the .bin
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
    """{name: bytes} of the zip's two files; one line where it is not the ncnn stage's zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            files = {name: archive.read(name) for name in (PARAM, BIN)}
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise MobileBuildError(f"{Path(path).name} is not an ncnn model zip ({PARAM} and {BIN}): {exc}",
                               field="targets") from None
    return files


def fp16_weights(data):
    """Whether the .bin's weights are fp16: its first weight array's tag (each tagged array starts with one)."""
    return data[:4] == FP16_TAG


def net(path, threads=1, vulkan=False):
    """An ncnn.Net of the zip at `path`, its options set before loading (they decide the kernels it picks)."""
    import ncnn

    files = read(path)
    if vulkan and gpu()[0] == 0:
        raise MobileBuildError(NO_VULKAN, field="targets")
    found = ncnn.Net()
    options = found.opt
    options.num_threads = threads
    options.use_vulkan_compute = vulkan
    half = vulkan or fp16_weights(files[BIN])  # a phone GPU's fp16, or what fp16 weights ask for on the CPU
    options.use_fp16_packed = options.use_fp16_storage = options.use_fp16_arithmetic = half
    kept = []
    with tempfile.TemporaryDirectory(prefix="mobilebuild-ncnn-") as folder:
        for name, data in files.items():
            Path(folder, name).write_bytes(data)
        # ncnn copies the weights as it loads: the files can go once it has
        with quiet.native_stderr(kept=kept, kept_prefix=(b"",)):
            loaded = (found.load_param(os.path.join(folder, PARAM)), found.load_model(os.path.join(folder, BIN)))
    if loaded != (0, 0):
        said = "; ".join(line.strip() for line in kept if line.strip()) or "no reason given"
        raise MobileBuildError(f"ncnn cannot load {Path(path).name}: {said}", field="targets")
    return found


def as_blob(tensor):
    """One sample of an input as ncnn takes it: float32, or int32 for integers."""
    array = tensor.detach().cpu().contiguous().numpy()
    if array.dtype.kind in "iub":
        return array.astype(numpy.int32)
    return array.astype(numpy.float32, copy=False)


def numbered(names):
    """Blob names in the order of their number (out2 before out10)."""
    return sorted(names, key=lambda name: (int(re.sub(r"\D", "", name) or -1), name))


class NcnnModel:
    """An ncnn.Net as a callable from input tensors, in forward's order, to a tensor (a tuple for several)."""

    def __init__(self, found):
        self.net = found
        # pnnx numbers them in forward's order (in0, in1...; out0, out1...); ncnn lists them in its own
        self.input_names, self.output_names = numbered(found.input_names()), numbered(found.output_names())

    def __call__(self, *tensors):
        import ncnn

        if len(tensors) != len(self.input_names):
            raise MobileBuildError(f"the ncnn model takes {len(self.input_names)} input(s), not {len(tensors)}",
                                   field="inputs")
        batch = len(tensors[0]) if tensors and tensors[0].dim() else 1
        produced = [[] for _ in self.output_names]
        for sample in range(batch):
            extractor = self.net.create_extractor()
            for name, tensor in zip(self.input_names, tensors):
                blob = as_blob(tensor[sample:sample + 1])
                extractor.input(name, ncnn.Mat(blob, batch_index=0).clone())
            for index, name in enumerate(self.output_names):
                status, mat = extractor.extract(name)
                if status != 0:
                    raise RuntimeError(f"ncnn could not compute {name} (extract returned {status})")
                produced[index].append(numpy.array(mat.numpy(batch_index=0)))
        found = [torch.from_numpy(numpy.concatenate(parts)) for parts in produced]
        return found[0] if len(found) == 1 else tuple(found)


def load(path, config):
    return NcnnModel(net(path, threads_for(config), vulkan_for(config)))


def layer_lines(param_text):
    """The .param's layer lines as (type, name, bottoms, tops)."""
    lines = param_text.splitlines()
    found = []
    for line in lines[2:]:
        fields = line.split()
        if len(fields) < 4:
            continue
        bottoms, tops = int(fields[2]), int(fields[3])
        found.append((fields[0], fields[1], fields[4:4 + bottoms], fields[4 + bottoms:4 + bottoms + tops]))
    return found


def output_blobs(param_text):
    """The blobs pnnx names as the model's outputs (out0, out1...), in order."""
    tops = [top for _, _, _, layer_tops in layer_lines(param_text) for top in layer_tops]
    return numbered(top for top in tops if re.fullmatch(r"out\d+", top))


def inspect(path, config):
    """Facts read from the zip without running it: layers by type, the weights' storage, inputs and outputs, sizes;
    for the Vulkan route, the host's Vulkan device."""
    files = read(path)
    layers = layer_lines(files[PARAM].decode())
    facts = {"layers": sum(1 for kind, *_ in layers if kind != "Input"),
             "layer_types": dict(sorted(collections.Counter(kind for kind, *_ in layers if kind != "Input").items())),
             "weights": "fp16" if fp16_weights(files[BIN]) else "fp32",
             "inputs": [name for kind, name, _, _ in layers if kind == "Input"],
             "outputs": output_blobs(files[PARAM].decode()),
             "param_bytes": len(files[PARAM]), "bin_bytes": len(files[BIN])}
    if vulkan_for(config):
        count, name = gpu()
        facts["vulkan_device"] = name if count else None
    return facts

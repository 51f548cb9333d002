"""ncnn runs the ncnn stage's zip (model.ncnn.param, model.ncnn.bin) as an app does: its options set before loading,
one sample at a time (ncnn's blobs have no batch axis: ncnn.Mat(array, batch_index=0) keeps the first sample only,
without a word), integer inputs as int32 (its Embed reads int64 or float ids as garbage, with no error), inputs in0,
in1... and outputs out0, out1... in forward's order. Its fp16 options (packed, storage, arithmetic) are on for an
fp16 artifact only, as an app shipping one would set them (they default to on, and on ARM they would round an fp32
model's activations to fp16): the zip's comment names its precision. The host's runtime module
(routes/ncnn/worker/runtime.py) runs its nets through the same functions; in the emulated aarch64 Python this file
is the runner (the standard library, numpy and ncnn only)."""

import os
import re
import tempfile
import zipfile

import ncnn
import numpy

PARAM, BIN = "model.ncnn.param", "model.ncnn.bin"
PRECISION = "precision="  # the zip's comment names the precision it was converted for: precision=fp16


def read(path):
    """({name: bytes} of the zip's two files, its precision) (zipfile.BadZipFile, KeyError where it is not the ncnn
    stage's zip)."""
    with zipfile.ZipFile(path) as archive:
        comment = archive.comment.decode(errors="replace")
        precision = comment[len(PRECISION):] if comment.startswith(PRECISION) else "fp32"
        return {name: archive.read(name) for name in (PARAM, BIN)}, precision


def numbered(names):
    """Blob names in the order of their number (out2 before out10): ncnn lists them in its own."""
    return sorted(names, key=lambda name: (int(re.sub(r"\D", "", name) or -1), name))


def net(files, precision, threads=1, vulkan=False):
    """An ncnn.Net of the zip's `files`, its options set before loading (they decide the kernels it picks): fp16
    storage and arithmetic for `precision` fp16, as a phone's GPU and an ARMv8.2 CPU run it; with `vulkan`, on
    ncnn's Vulkan compute path. RuntimeError where ncnn cannot load them (it says why on file descriptor 2)."""
    found = ncnn.Net()
    options = found.opt
    options.num_threads = threads
    options.use_vulkan_compute = vulkan
    half = precision == "fp16"
    options.use_fp16_packed = options.use_fp16_storage = options.use_fp16_arithmetic = half
    with tempfile.TemporaryDirectory(prefix="mobilebuild-ncnn-") as folder:
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as handle:
                handle.write(data)
        # ncnn copies the weights as it loads: the files can go once it has
        loaded = (found.load_param(os.path.join(folder, PARAM)), found.load_model(os.path.join(folder, BIN)))
    if loaded != (0, 0):
        raise RuntimeError(f"load_param and load_model returned {loaded}")
    return found


def as_blob(array):
    """One sample of an input as ncnn takes it: float32, or int32 for integers."""
    array = numpy.ascontiguousarray(array)
    return array.astype(numpy.int32) if array.dtype.kind in "iub" else array.astype(numpy.float32, copy=False)


def mat(sample):
    """One sample (an array with a batch axis of one) as an ncnn.Mat without it."""
    return ncnn.Mat(as_blob(sample), batch_index=0).clone()


def runner(found):
    """arrays (forward's inputs, a batch each) -> [the outputs' arrays], a sample at a time."""
    inputs, outputs = numbered(found.input_names()), numbered(found.output_names())

    def run(arrays):
        batch = len(arrays[0]) if arrays and numpy.ndim(arrays[0]) else 1
        produced = [[] for _ in outputs]
        for sample in range(batch):
            extractor = found.create_extractor()
            for name, array in zip(inputs, arrays, strict=True):
                extractor.input(name, mat(array[sample:sample + 1]))
            for index, name in enumerate(outputs):
                status, found_mat = extractor.extract(name)
                if status != 0:
                    raise RuntimeError(f"ncnn could not compute {name} (extract returned {status})")
                produced[index].append(numpy.array(found_mat.numpy(batch_index=0)))
        return [numpy.concatenate(parts) for parts in produced]

    run.inputs = inputs
    return run


def load(path, threads):
    """The emulated run: the zip at `path` on ncnn's CPU path."""
    return runner(net(*read(path), threads))


if __name__ == "__main__":  # python guest.py ZIP INPUTS.npz: the conversion's first run (worker/convert.first_run)
    import sys

    with numpy.load(sys.argv[2]) as saved:
        load(sys.argv[1], 1)([saved[f"arr_{index}"] for index in range(len(saved.files))])

"""PyTorch's aarch64 lite interpreter runs a .ptl as the host's runtime module does
(routes/torchscript/worker/runtime.py):
`threads` intra-op threads, and QNNPACK's int8 kernels, the engine of the only int8 .ptl route (this wheel's default
engine is x86's, even on aarch64; the engine must be set before loading, which packs the int8 weights). Outputs come
back flattened as worker/outputs.py flattens them: tuples and lists by position, dicts in order."""

import numpy
import torch
from torch.jit.mobile import _load_for_lite_interpreter

ENGINE = "qnnpack"


def _leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return []  # not a tensor: not compared


def _array(tensor):
    tensor = tensor.detach()
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    if tensor.is_floating_point():
        tensor = tensor.float()
    return tensor.contiguous().numpy()


def load(path, threads):
    torch.set_num_threads(threads)
    if ENGINE in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = ENGINE
    module = _load_for_lite_interpreter(path)

    def run(arrays):
        with torch.no_grad():
            found = module(*[torch.from_numpy(numpy.ascontiguousarray(array)) for array in arrays])
        return [_array(leaf) for leaf in _leaves(found)]

    return run

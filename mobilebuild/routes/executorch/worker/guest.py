"""ExecuTorch's runtime runs a .pte on its CPU path (the XNNPACK delegate and the portable kernels), `threads`
threads in its pool, each input laid out in the dim order the program took it in (the runtime copies an input's
bytes whatever its strides say). The host reads those dim orders from the program (routes/executorch/worker/runtime.py's
arm64_options) and sends them with the request.

The binding is imported alone: `executorch.runtime` and the binding's Python wrapper import ExecuTorch's exporter
(exir), about 20 s under emulation, for nothing a run needs. The binding links libtorch, so torch comes first."""

import numpy
import torch
from executorch.extension.pybindings import _portable_lib

CHANNELS_LAST_DIM_ORDER = [0, 2, 3, 1]


def _in_dim_order(array, dim_order):
    tensor = torch.from_numpy(numpy.ascontiguousarray(array))
    if list(dim_order) == CHANNELS_LAST_DIM_ORDER and tensor.dim() == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def _array(value):
    if not isinstance(value, torch.Tensor):
        return numpy.asarray(value)
    value = value.detach()
    return (value.float() if value.is_floating_point() else value).contiguous().numpy().copy()


def load(path, threads, dim_orders):
    _portable_lib._unsafe_reset_threadpool(int(threads))
    with open(path, "rb") as handle:
        data = handle.read()
    module = _portable_lib._load_for_executorch_from_buffer(data)

    def run(arrays, _data=data):  # the module reads the program's bytes in place: keep them alive with it
        inputs = [_in_dim_order(array, order) for array, order in zip(arrays, dim_orders, strict=True)]
        return [_array(value) for value in module.run_method("forward", inputs)]

    return run

"""The PyTorch Mobile lite interpreter (.ptl), as the host build of libtorch runs it."""

import torch
from torch.jit.mobile import _load_for_lite_interpreter


def load(path, config):
    if config.engine:
        torch.backends.quantized.engine = config.engine  # int8 kernels come from the target's engine
    return _load_for_lite_interpreter(str(path))

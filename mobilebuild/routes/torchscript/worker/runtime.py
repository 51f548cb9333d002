"""The PyTorch Mobile lite interpreter (.ptl), as the host build of libtorch runs it."""

import torch
from torch.jit.mobile import _load_for_lite_interpreter

from mobilebuild.routes.torchscript.worker import script


def load(path, config):
    if config.engine:
        torch.backends.quantized.engine = config.engine  # int8 kernels come from the target's engine
    return _load_for_lite_interpreter(str(path))


def inspect(path, config):
    """How the artifact was made, where it was not as the recipe asked (the script stage's traced fallback)."""
    record = script.record_of(path)
    return {"torchscript": record} if record is not None else None

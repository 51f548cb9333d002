"""Making the installed ExecuTorch usable before anything lowers a model or reads a .pte.

Why each is needed (ExecuTorch 1.3.1's flatc lookup; its XNNPACK layout pass and softmax, measured on timm's
EfficientFormerV2): docs/toolchain.md. No torch or executorch import at this module's top: any entry point can call
`ensure_flatc` early.
"""

import contextlib
import importlib.util
import os
from pathlib import Path

FLATC_VARIABLE = "FLATC_EXECUTABLE"


def shipped_flatc():
    """The `flatc` inside the installed executorch package, or None (executorch missing, or a wheel without it)."""
    try:
        spec = importlib.util.find_spec("executorch")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "data" / "bin" / "flatc"
        if candidate.is_file():
            return candidate
    return None


def ensure_flatc():
    """Set FLATC_EXECUTABLE to the shipped flatc unless the user chose one; return the flatc that will be used
    (None when executorch falls back to PATH). ExecuTorch reads the variable at its first serialization and then
    caches it, so this must run before the first lowering or .pte read in the process."""
    if os.environ.get(FLATC_VARIABLE):
        return os.environ[FLATC_VARIABLE]
    flatc = shipped_flatc()
    if flatc is None:
        return None
    if not os.access(flatc, os.X_OK):  # a wheel unpacked without its mode bits
        with contextlib.suppress(OSError):  # then executorch's own error says what is wrong
            flatc.chmod(flatc.stat().st_mode | 0o111)
    os.environ[FLATC_VARIABLE] = str(flatc)
    return str(flatc)


def softmax_in_nchw():
    """Make ExecuTorch's XNNPACK channels-last pass give softmax its input in NCHW (see above); before any lowering to
    XNNPACK in the process. Idempotent."""
    from executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass import ChannelsLastTaggedReshapePass
    from executorch.exir.dialects._ops import ops as exir_ops

    ChannelsLastTaggedReshapePass.memory_sensitive_ops_nchw.add(exir_ops.edge.aten._softmax.default)

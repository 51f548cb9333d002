"""Making the installed ExecuTorch usable before anything lowers a model or reads a .pte.

The ExecuTorch 1.3.1 wheel ships `flatc` (the FlatBuffers compiler its serializer runs) at
`executorch/data/bin/flatc`, but its serializer looks for it beside itself instead, then falls back to
`$FLATC_EXECUTABLE` or a `flatc` on PATH; with neither, every lowering dies with "No such file or directory:
'flatc'". Pointing FLATC_EXECUTABLE at the shipped copy fixes it. The shipped copy is preferred to one on PATH:
it is the FlatBuffers version the serializer was built against, so the bytes of a .pte do not depend on what else
is installed. A FLATC_EXECUTABLE the user set is left alone.

ExecuTorch's XNNPACK delegate (1.3.1, and upstream's channels_last_tagged_reshape_pass.py as of 2026-11) runs a
convolution's output in NHWC inside the delegate and passes that layout on through the ops it does not list as
layout-sensitive, softmax among them; XNNPACK's softmax then normalises over the physical last dim, the channels,
instead of the width. A 1x1 convolution then softmax(-1) (the talking-heads attention of timm's EfficientFormerV2)
comes out at 2.5 dB; the trained EfficientFormerV2-S0 of the hub zoo at 32.8 dB on fp32.
`softmax_in_nchw` lists softmax with the ops that need NCHW, so the pass transposes its input back first.

No torch or executorch import at this module's top: finding the file costs nothing, so any entry point can call
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

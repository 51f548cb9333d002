"""`mobilebuild check RECIPE`: a compatibility pre-flight, before any build.

The recipe's model is built with random weights (no checkpoint, no training: which operations a target takes does
not depend on the values) and fused as the fuse stage fuses it. Then each target's own toolchain is asked, in
memory, what it would make of it:

- NNAPI: the node kinds torch.backends._nnapi has no converter for (`nnapi.unsupported_ops`), then the conversion
  itself, which refuses some arguments of kinds it knows; on the float model (mode none) or on the quantized one
  (modes core and full, quantized on the example input);
- ExecuTorch (XNNPACK, Vulkan, Core ML, MPS): the model lowered as the lower stage lowers it; the operators left
  outside the delegate run on ExecuTorch's portable CPU kernels (`lower.preflight_delegation`);
- PyTorch Mobile: whether this torch can run optimize_for_mobile for the backend at all (XNNPACK compiled in; the
  Vulkan or Metal export ops, `optimize.check_gpu_export`), and for int8 whether every operation of the quantized
  model has a quantized kernel (`quantize.check_runs`);
- ONNX: whether torch.onnx.export takes the float model (`export.export_float`).

Then the edge-deployment talk's and the performance recipe's architecture advice, where it applies: widths that are
not a multiple of 8, activations the target cannot fuse into the convolution or linear layer before them, an NCHW
input for XNNPACK through PyTorch Mobile, batch norm after a convolution that eager fusion did not see.

A finding is {target, kind, detail, where}; kinds "unsupported-op", "fallback" and "needs-build" block (exit code
1), "advice" does not (exit code 0). Findings about the model whatever the target have target "*".
"""

from mobilebuild.preflight.advice import ALL_TARGETS
from mobilebuild.preflight.command import check_command, format
from mobilebuild.preflight.whole_recipe import run

__all__ = ["ALL_TARGETS", "check_command", "format", "run"]

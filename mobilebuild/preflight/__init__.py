"""`mobilebuild check RECIPE`: a pre-flight that runs what the build runs.

Each target's shipped artifact is made by the build's own doit tasks (shipped.py): the same nodes, stage workers,
doit state and shared artifact cache as `mobilebuild build`, up to the artifact (script or trace, optimize, NNAPI
conversion, ExecuTorch lowering, ONNX export and the quantization before them), never verify, bench, the manifest or
the report. A check after a build finds everything up to date; a build after a check finds the artifacts made. A
target whose chain fails is blocked with the build's own one-line error ("build-fails", naming the task that failed).
What verify checks of the recipe itself (its evaluation data, its `outputs` names against the model's output tensors)
runs once per recipe with verify's own functions (verification.py): where they fail, every made target verify runs
on this host is blocked on its verify task, with the line the build fails it with.

Then each made artifact that runs on this host is loaded in its runtime and run once on the example inputs, as
verify loads it (PyTorch Mobile's lite interpreter, ExecuTorch's runtime, ONNX Runtime): one that cannot load or run
(a kernel no library has) is blocked ("cannot-run"). Where the build's verify is up to date for those very bytes, it
ran them here already: its outcome stands and nothing is run again (recorded.py). What the artifact and the model say
for the target (targets.py) are warnings and advice: the operators of an ExecuTorch program left outside the
delegate, on the portable kernels ("fallback", from verify's record of the .pte, else read from it), each input
dtype, dynamic dim and output structure the target does not keep as the model has it ("interface", interface.py),
and the edge-deployment talk's and the performance recipe's architecture advice, from the recipe's model built with
random weights and fused as the fuse stage fuses it (structure.py; an earlier check's analysis of the same model is
reused): widths that are not a multiple of 8, activations the target cannot fuse into the convolution or linear
layer before them, an NCHW input for XNNPACK through PyTorch Mobile, batch norm after a convolution that eager fusion
did not see. Notes say what was not run here and why, and which operations an int8 model quantized in FX graph mode
keeps in float.

A finding is {target, kind, detail, where}; kinds "build-fails" and "cannot-run" block (exit code 1), "fallback",
"interface" and "advice" do not (exit code 0). Findings about the model whatever the target have target "*".
"""

from mobilebuild.preflight.advice import ALL_TARGETS
from mobilebuild.preflight.command import check_command, format
from mobilebuild.preflight.whole_recipe import run

__all__ = ["ALL_TARGETS", "check_command", "format", "run"]

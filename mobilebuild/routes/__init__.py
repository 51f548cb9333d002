"""The built-in route families, one folder each: importing this package registers them (mobilebuild.tasks, the
command line, the stage worker and anything that plans a graph import it). A family's folder owns everything about
its targets: plan.py, torch-free, registers its `Route` entries (plan.routes), its own stages with their contracts
and planners (plan.stages), its `mobilebuild check`, how the report names and summarises it, and its recipe section;
worker/ runs its stages, loads its artifacts in their runtime, compares its int8 layers and runs them on emulated
ARM CPUs. A project adds a family the same way from its dodo.py.
"""

# In the order the recipe grammar, `doit list` and the report list them: one line per family
from mobilebuild.routes.torchscript import plan as torchscript  # noqa: I001
from mobilebuild.routes.nnapi import plan as nnapi
from mobilebuild.routes.executorch import plan as executorch
from mobilebuild.routes.onnx import plan as onnx
from mobilebuild.routes.litert import plan as litert
from mobilebuild.routes.ncnn import plan as ncnn

__all__ = ["executorch", "litert", "ncnn", "nnapi", "onnx", "torchscript"]

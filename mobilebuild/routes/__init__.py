"""The built-in route families, one module each: importing this package registers them (mobilebuild.tasks, the
command line and anything that plans a graph import it). Each module owns everything about its targets: the
`Route` entries (plan.routes), its own stages with their contracts and planners (plan.stages), its per-layer
diagnosis, its `mobilebuild check`, how the report names and summarises it, and its recipe section. The worker-side
code of its stages and runtime lives under mobilebuild.worker, named by the route, since the plan side never
imports torch. A project adds a family the same way from its dodo.py.
"""

# In the order the recipe grammar, `doit list` and the report list them
from mobilebuild.routes import torchscript  # noqa: I001
from mobilebuild.routes import nnapi
from mobilebuild.routes import executorch
from mobilebuild.routes import onnx
from mobilebuild.routes import litert

__all__ = ["executorch", "litert", "nnapi", "onnx", "torchscript"]

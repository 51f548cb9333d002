"""Models whose top-level modules are named like an attribute of torch.fx's GraphModule (`meta`, `graph`, `code`):
a graph captured from them (FX quantization, torch.export, ONNX's and ExecuTorch's exporters, litert-torch) cannot
hold the module under its name ("cannot assign 'dict' as child module 'meta'", "Node meta_0_0_weight target
meta.0.0.weight references nonexistent attribute 0 of meta"). Only the root's own children clash: a captured graph
rebuilds the modules below its root as plain modules, which have no such attributes.

The capturing stages capture such a model inside a root of ours (`nested`): its modules' paths gain the prefix
`ROOT.`, and nothing of the model changes. Paths going in (quantize.exclude, resolved on the model) gain it with
`paths`; every line a user reads from a stage loses it again (`user_text`).
"""

import functools
import linecache
import re

import torch

ROOT = "unclashed"
_PREFIX = re.compile(rf"(?<![A-Za-z0-9]){ROOT}[._/]")  # "unclashed." "unclashed_" "/unclashed/"


@functools.cache
def reserved():
    """The names a GraphModule holds beyond any module's: its own attributes and methods."""
    graph_module = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    return frozenset(dir(graph_module)) - frozenset(dir(torch.nn.Module()))


def clashing(model):
    """The names of `model`'s own children that a captured graph cannot hold."""
    return sorted(name for name in model._modules if name in reserved())


class Nested(torch.nn.Module):
    """A root holding the model as its one child, passing its positional inputs on (forward is generated per
    input count in `nested`: FX traces no *args)."""

    def __init__(self, model):
        super().__init__()
        setattr(self, ROOT, model)


@functools.cache
def _nested_class(count):
    names = ", ".join(f"input_{index}" for index in range(count))
    filename = f"<mobilebuild capture root {count}>"
    source = f"def forward(self, {names}):\n    return self.{ROOT}({names})\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)
    return type("Nested", (Nested,), {"forward": namespace["forward"], "__module__": __name__})


def nested(model, count):
    """`model` ready to capture, taking `count` positional inputs: itself, or inside a root of ours where one of its
    children clashes (`clashing`)."""
    if isinstance(model, Nested) or not clashing(model):
        return model
    return _nested_class(count)(model).train(model.training)


def paths(model, module_paths):
    """Module paths of the model as the graph captured from `model` (`nested`'s result) names them."""
    return [f"{ROOT}.{path}" for path in module_paths] if isinstance(model, Nested) else list(module_paths)


def user_text(text):
    """`text` (an error line, a layer's name) with the modules named as the user's model names them."""
    return _PREFIX.sub("", text)

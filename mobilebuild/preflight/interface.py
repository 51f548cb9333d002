"""Whether a target keeps the model's interface, per target: each input's dtype, each dynamic dim and the structure
of the outputs ("interface" findings: they do not block; where the route refuses outright, its task fails and that
blocks as "build-fails"). From the recipe, the route and the model's outputs as structure.analyse saw them: no torch.
The rules per runtime are its route's (`Checks.input_dtypes`, `Checks.outputs`, in mobilebuild/routes/); this module
describes the structure and words the findings.

Each statement was checked on builds of tiny models (torch 2.12.1, ExecuTorch 1.3.1, ONNX Runtime 1.32):
- torch.backends._nnapi takes float32, int32 and quantized input tensors only ("Can't handle input with dtype");
  its wrapper returns a tensor or a flat tuple (a named tuple comes back a plain tuple), and it refuses lists
  ("Unsupported return type: List[Tensor]"), nested tuples, and dicts (torch.jit.trace refuses a dict output there).
- int8: every route quantizes float inputs only; integer and bool inputs (token ids, masks) enter as they are.
- TorchScript (PyTorch Mobile) returns tuples, lists, dicts and nesting as the model does; a named tuple keeps its
  fields when scripted and becomes a plain tuple when traced. Eager int8 dequantizes each of several outputs in a
  wrapper (quantize.DequantizedOutputs) that torch.jit.script cannot compile: such int8 targets need `script: trace`.
- ExecuTorch returns a flat list of tensors, in flattening order (a dict's keys and any nesting are lost); it cannot
  serialize a named tuple output ("Can't serialize TreeSpec of namedtuple class").
- ONNX has flat, named outputs: the recipe's `outputs`, else each tensor's path (dict keys, named tuple fields,
  positions: "scores", "0", "1.0"). A flat tuple or list of tensors is the same in every runtime: nothing to say.
- Dynamic dims: plan.routes.Route.fixed_shape says which routes take only the example's sizes, and why.
"""

from dataclasses import dataclass

from mobilebuild.preflight.advice import finding

KIND = "interface"
INTEGER_DTYPES = ("int64", "int32", "uint8", "bool")
SHOWN_NAMES = 6  # output names listed before "..."


# --- the output structure, as structure.describe_output records it ---------------------------------------------


def _children(tree):
    """[(name, subtree)] of a container node, [] for a tensor or anything else."""
    if not isinstance(tree, dict):
        return []
    if "dict" in tree:
        return [(str(key), child) for key, child in tree["dict"]]
    if "namedtuple" in tree:
        return [(str(key), child) for key, child in tree["fields"]]
    for kind in ("tuple", "list"):
        if kind in tree:
            return [(str(index), child) for index, child in enumerate(tree[kind])]
    return []


def _kind(tree):
    if tree == "tensor":
        return "tensor"
    return next((kind for kind in ("dict", "namedtuple", "tuple", "list") if isinstance(tree, dict) and kind in tree),
                "other")


def leaf_names(tree, prefix=""):
    """The tensors' paths, as worker.outputs.leaves names them ("output" for a lone tensor)."""
    if tree == "tensor":
        return [prefix or "output"]
    return [name for key, child in _children(tree) for name in leaf_names(child, f"{prefix}.{key}" if prefix else key)]


def kinds(tree):
    """Every container kind anywhere in the structure."""
    found = {_kind(tree)} - {"tensor", "other"}
    for _, child in _children(tree):
        found |= kinds(child)
    return found


def _nested(tree):
    return any(_kind(child) not in ("tensor", "other") for _, child in _children(tree))


def describe(tree):
    """'a dict (scores, box)', 'a named tuple Pair (scores, box)', 'a tuple of 2 tensors', '... nested'."""
    kind = _kind(tree)
    names = leaf_names(tree)
    shown = ", ".join(names[:SHOWN_NAMES]) + (", ..." if len(names) > SHOWN_NAMES else "")
    if kind == "dict":
        text = f"a dict ({shown})"
    elif kind == "namedtuple":
        text = f"a named tuple {tree['namedtuple']} ({shown})"
    else:
        text = f"a {kind} of {len(names)} tensor{'s' if len(names) != 1 else ''}"
        if _nested(tree):
            text += f" ({shown})"
    return text + (", nested" if _nested(tree) and kind in ("dict", "namedtuple") else "")


# --- findings ---------------------------------------------------------------------------------------------------


def _input_field(inputs, index):
    return "input" if len(inputs) == 1 else f"inputs[{index}]"


def input_findings(target_id, route, precision, inputs):
    """Each input whose dtype the route cannot take, or takes unlike the others."""
    found = []
    for index, spec in enumerate(inputs):
        dtype, where = spec["dtype"], f"{_input_field(inputs, index)}.dtype"
        takes = route.checks.input_dtypes
        if takes is not None and dtype not in takes:
            found.append(finding(target_id, KIND, f"{spec['name']} ({dtype}) cannot be kept: "
                                 f"{route.checks.input_dtypes_why}", where))
        elif precision == "int8" and dtype in INTEGER_DTYPES:
            found.append(finding(target_id, KIND, f"{spec['name']} ({dtype}) enters the int8 model as it is: int8 "
                                 "quantization quantizes float inputs only", where))
    return found


def dim_findings(target_id, fixed, inputs):
    """One finding per dynamic dim the route fixes at its example size; `fixed`: Route.fixed_shape's sentence
    for the target ("dims a, b fixed at the example size: why"), or None."""
    if not fixed:
        return []
    why = fixed.partition(": ")[2]
    dims = {}
    for spec in inputs:
        for dim in spec.get("dynamic", ()):
            dims.setdefault(dim["dim"], (spec["shape"][dim["axis"]], dim["min"], dim["max"]))
    return [finding(target_id, KIND, f"{name} is fixed at {example} (the recipe allows {low} to {high}): {why}",
                    f"dims.{name}")
            for name, (example, low, high) in sorted(dims.items())]


@dataclass(frozen=True)
class Outputs:
    """A model's output structure as a route's `Checks.outputs` judges it: the route returns `say(detail)` for what
    its runtime cannot return as the model does, else []."""

    target_id: str
    route: object
    precision: str
    quantize: dict  # the target's quantize settings
    script: str  # the recipe's script mode
    own_stubs: bool  # the model has its own QuantStub/DeQuantStub
    made: bool  # the artifact was made (an int8 model quantized in FX graph mode, not eager, compiles)
    tree: object

    @property
    def shape(self):
        return describe(self.tree)

    @property
    def container(self):
        return kinds(self.tree)

    @property
    def names(self):
        return leaf_names(self.tree)

    @property
    def nested(self):
        return _nested(self.tree)

    @property
    def flat(self):
        """A tuple or a list of tensors: the same in every runtime."""
        return not (self.container & {"dict", "namedtuple"} or self.nested)

    def say(self, detail):
        return [finding(self.target_id, KIND, f"outputs are {self.shape}: {detail}", "outputs")]


def output_findings(target_id, route, precision, target_quantize, script, model, made):
    """The output structure a target's runtime cannot return as the model does. `model`: the structure facts
    ("outputs", "own_stubs"); `made`: whether the artifact was made."""
    tree = model.get("outputs")
    if tree is None or tree == "tensor" or route.checks.outputs is None:
        return []
    return route.checks.outputs(Outputs(target_id, route, precision, target_quantize, script,
                                        bool(model.get("own_stubs")), made, tree))


def findings(target, route, recipe, model, made, fixed):
    """Every interface finding of one target. `model`: the structure facts; `made`: its artifact was made; `fixed`:
    Route.fixed_shape's sentence for the target, or None."""
    precision = route.precision(target)
    return (input_findings(target.id, route, precision, recipe.inputs)
            + dim_findings(target.id, fixed, recipe.inputs)
            + output_findings(target.id, route, precision, target.quantize, recipe.script, model, made))

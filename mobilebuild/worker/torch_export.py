"""What the stages that capture a model with torch.export share (ExecuTorch's lowering, the ONNX exporter): the
recipe's dynamic dims as torch.export's, and the one-line errors for a model that pins a dim or returns objects the
exporter takes apart."""

import torch

from mobilebuild.worker import outputs
from mobilebuild.worker.stages import modeling


def dynamic_shapes(specs):
    """torch.export's dynamic_shapes for the inputs (a tuple in forward's order: {axis: Dim} or None each), or None
    when every size is fixed. One Dim per name, so inputs that share a dim must agree on its size."""
    if not any(spec.get("dynamic") for spec in specs):
        return None
    made = {}
    for spec in specs:
        for dim in spec.get("dynamic", ()):
            made.setdefault(dim["dim"], torch.export.Dim(dim["dim"], min=dim["min"], max=dim["max"]))
    return tuple({dim["axis"]: made[dim["dim"]] for dim in spec.get("dynamic", ())} or None for spec in specs)


def pinned_message(dims, exporter, alternative=None):
    """One line; `alternative`: a way out of the route's own, after the two every route has ("or, ...")."""
    ways = ("keep that size fixed (remove it from dims), make the model take any size, " + alternative if alternative
            else "keep that size fixed (remove it from dims), or make the model take any size")
    return (f"{exporter} found that the model fixes dim {dims}: an operation in it pins the size (nn.LSTM unrolls "
            f"its steps; a view or reshape to a fixed size): {ways}")


def held_message(held, where, cause):
    """One line for a model whose outputs hold objects (`held`: outputs.held_objects) that an exporter took apart
    but then fails on (`cause`; torch 2.12.1's run_decompositions on the tensor constants transformers' DynamicCache
    creates: "IndexError: list index out of range", reproduced with torch.export.export(model, example)
    .run_decompositions({}))."""
    return (f"the model returns {held}; torch.export takes it apart (transformers registers it), but {where} then "
            f"fails ({type(cause).__name__}: {modeling.first_line(cause)}, with torch {torch.__version__}): "
            f"{outputs.object_advice(held)}")

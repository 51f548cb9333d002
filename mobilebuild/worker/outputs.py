"""A model's outputs, whatever their structure (a tensor, tuples, named tuples, lists, dicts, nested), as named tensor
leaves: what verification compares one by one.

Leaves come in the order torch.export, ONNX and TorchScript flatten outputs: tuples and lists by position, named
tuples by field, dicts by insertion order. A runtime that returns a flat list (ExecuTorch, ONNX Runtime) then lines up
with the eager model's structure position by position, and takes its names from it.
"""

import torch


def leaves(output, prefix=""):
    """[(name, tensor)]: "output" for a lone tensor, else the path to each tensor ("out", "1", "heads.0"). Values
    that are not tensors (a None auxiliary output, a count) are not compared."""
    if isinstance(output, torch.Tensor):
        return [(prefix or "output", output)]
    if isinstance(output, dict):
        items = output.items()
    elif isinstance(output, tuple) and hasattr(output, "_fields"):
        items = zip(output._fields, output)
    elif isinstance(output, (tuple, list)):
        items = enumerate(output)
    else:
        return []
    found = []
    for key, value in items:
        found += leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def describe(output, names=None):
    """[{name, shape, dtype}] of each output tensor: what an app developer needs to read the model's results.
    `names`: the recipe's, in place of the paths."""
    found = leaves(output)
    names = names if names is not None and len(names) == len(found) else [name for name, _ in found]
    return [{"name": name, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
            for name, (_, value) in zip(names, found)]

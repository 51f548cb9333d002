"""A model's outputs, whatever their structure (a tensor, tuples, named tuples, lists, dicts, nested), as named tensor
leaves: what verification compares one by one.

Leaves come in the order torch.export, ONNX and TorchScript flatten outputs: tuples and lists by position, named
tuples by field, dicts by insertion order. A runtime that returns a flat list (ExecuTorch, ONNX Runtime) then lines up
with the eager model's structure position by position, and takes its names from it.
"""

import torch
from torch.utils import _pytree as pytree


def leaves(output, prefix=""):
    """[(name, tensor)]: "output" for a lone tensor, else the path to each tensor ("out", "1", "heads.0"). Values
    that are not tensors (a None auxiliary output, a count) are not compared. An object registered as a pytree node
    (transformers' cache, once worker.hub registers it) flattens as torch.export flattens it ("cache.key_cache.0")."""
    if isinstance(output, torch.Tensor):
        return [(prefix or "output", output)]
    if isinstance(output, dict):
        items = output.items()
    elif isinstance(output, tuple) and hasattr(output, "_fields"):
        items = zip(output._fields, output)
    elif isinstance(output, (tuple, list)):
        items = enumerate(output)
    elif _registered(output):
        items = [(_key(key), value) for key, value in pytree.SUPPORTED_NODES[type(output)].flatten_with_keys_fn(
            output)[0]]
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


def _registered(value):
    node = pytree.SUPPORTED_NODES.get(type(value))
    return node is not None and node.flatten_with_keys_fn is not None


def _key(key):
    """A pytree key's plain name: a dict's key, a sequence's index, an attribute's name."""
    for field in ("key", "idx", "name"):
        if hasattr(key, field):
            return getattr(key, field)
    return str(key)


def objects(output, prefix=""):
    """[(path, type name)] of the values in `output` that are objects holding tensors rather than tensors and
    containers (a transformers cache): what TorchScript cannot return."""
    if isinstance(output, dict):
        items = output.items()
    elif isinstance(output, (tuple, list)):
        items = zip(getattr(output, "_fields", range(len(output))), output)
    elif isinstance(output, torch.Tensor) or output is None or isinstance(output, (int, float, bool, str)):
        return []
    else:
        return [(prefix or "output", type(output).__name__)]
    return [found for key, value in items for found in objects(value, f"{prefix}.{key}" if prefix else str(key))]


def held_objects(model, examples):
    """"a DynamicCache at `cache`" where the model's outputs on `examples` hold such objects (objects), or None."""
    try:
        with torch.no_grad():
            found = objects(model(*examples))
    except Exception:  # asked after an exporter failed: a model that fails to run has its own line elsewhere
        return None
    return ", ".join(f"a {kind} at `{path}`" for path, kind in found) or None


def object_advice(held):
    """What would work for a model whose outputs hold `held` (held_objects)."""
    if "Cache at" in held:
        return ("leave use_cache out of the model's config: a single pass returns no cache (caches are off by "
                "default)")
    return "return the object's tensors (a tuple or dict) instead"

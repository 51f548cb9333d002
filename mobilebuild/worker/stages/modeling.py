"""What several stages share: building the recipe's model, its example inputs, and reading artifacts back."""

import difflib
import importlib
import inspect
import itertools
import pickle
import re
import zipfile

import torch

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import hub, named_inputs

DTYPES = {"float32": torch.float32, "float16": torch.float16, "int64": torch.int64, "int32": torch.int32,
          "bool": torch.bool, "uint8": torch.uint8}


# Sentences in library messages that only point elsewhere: a library's notes for its own staff, bug-report requests.
_POINTERS = re.compile(r"Facebook employee|fburl\.com|please report a bug|please file an issue", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z'\"(\[])")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')  # a frame of TorchScript's source in its errors
# "<function GPT2Config.__init__ at 0x7f3a...>": an address differs from run to run, and the line lands in records
# that artifacts carry (the script stage's traced fallback)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def first_line(exc, limit=300):
    """An exception's first line as whole sentences within `limit` characters, without the sentences after the
    first that only point elsewhere; a first sentence longer than the limit is cut and ends with an ellipsis. A line
    that introduces what follows it (ends with ':') gets the code TorchScript points at, or loses that sentence."""
    lines = _ADDRESS.sub("", str(exc).strip() or type(exc).__name__).splitlines()
    text = lines[0]
    if text.endswith(":"):
        pointed = _pointed_at(lines)
        sentences = _SENTENCE_END.split(text)
        if pointed:
            text = f"{text} {pointed}"
        elif len(sentences) > 1:  # "incompatible function arguments. The following argument types are supported:"
            text = " ".join(sentences[:-1])
    first, *rest = _SENTENCE_END.split(text)
    if len(first) > limit:
        return first[:limit - 1].rstrip() + "\u2026"
    for sentence in rest:
        if _POINTERS.search(sentence):
            continue
        if len(first) + 1 + len(sentence) > limit:
            break
        first = f"{first} {sentence}"
    return first


def _pointed_at(lines):
    """'self.linear1.weight (transformer.py, line 884)': the code under TorchScript's '<--- HERE' and where it is."""
    here = next((index for index, line in enumerate(lines) if "<--- HERE" in line), None)
    if not here or here < 2:
        return None
    code = lines[here - 1].strip()
    where = next((found for found in map(_FRAME.search, reversed(lines[:here])) if found), None)
    return f"{code} ({where[1].rsplit('/', 1)[-1]}, line {where[2]})" if where else code


def resolve_callable(spec, field):
    """'package.module:attr.path' -> the object, or a clear error for the recipe field that named it."""
    module_name, _, attr_path = spec.partition(":")
    try:
        target = importlib.import_module(module_name)
    except ImportError as exc:
        raise MobileBuildError(f"cannot import module {module_name!r}: {first_line(exc)}", field=field) from None
    except Exception as exc:  # the user's module fails as it loads: a syntax error, an exception at import time
        raise MobileBuildError(f"cannot import module {module_name!r}: {type(exc).__name__}: {first_line(exc)}",
                               field=field) from None
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise MobileBuildError(f"module {module_name!r} has no attribute {attr_path!r}", field=field) from None
    if not callable(target):
        raise MobileBuildError(f"{spec!r} is not callable", field=field)
    return target


def call_user(function, spec, field, *args, **kwargs):
    """Call a function the recipe names; whatever it raises is the user's error, reported against `field`."""
    try:
        return function(*args, **kwargs)
    except MobileBuildError:
        raise
    except Exception as exc:
        raise MobileBuildError(f"{spec} raised {type(exc).__name__}: {first_line(exc)}", field=field) from None


def torchvision_builder(name, quantizable=False):
    """(builder, its full name) for any model torchvision registers (classification, segmentation, detection, video,
    optical flow: `torchvision.models.get_model_builder`), or its quantizable variant."""
    from torchvision import models

    where = "torchvision.models.quantization" if quantizable else "torchvision.models"
    registered = f"quantized_{name}" if quantizable else name
    known = models.list_models(module=models.quantization) if quantizable else models.list_models()
    if registered not in known:
        names = list(dict.fromkeys(item.removeprefix("quantized_") for item in known))
        closest = difflib.get_close_matches(name, names, n=3)
        hint = f" (closest: {', '.join(closest)})" if closest else f" (list them with {where}.list_models())"
        raise MobileBuildError(f"{where} has no model builder {name!r}{hint}", field="model.torchvision")
    return models.get_model_builder(registered), f"{where}.{name}"


def source_field(source):
    """The recipe field that gives the model `source`: what a failure of the model itself points at."""
    return next((f"model.{kind}" for kind in ("timm", "transformers", "factory") if kind in source),
                "model.torchvision")


def build_model(source, seed, weights=True, notes=False):
    """A freshly initialised model from the recipe's `model` source, seeded, in eval mode, taking the recipe's inputs
    (the source's "inputs": their names) by name where forward has parameters of those names (named_inputs).
    `weights`: a transformers `pretrained` folder's weights are loaded (else its configuration alone: the caller
    loads weights of its own). A transformers model from any other source gets its cache off as a `transformers:`
    source's is (hub.single_pass), said in a line where `notes`."""
    torch.manual_seed(seed)
    kwargs = dict(source.get("kwargs", {}))
    convert = None
    if "timm" in source:
        model = hub.timm_model(source["timm"], kwargs)
        field, name = "model.timm", f"timm {source['timm']}"
    elif "transformers" in source:
        model, convert = hub.transformers_model(source, weights), hub.plain_outputs
        field, name = "model.transformers", f"transformers.{source['transformers']}"
    else:
        model, field, name = _built(source, kwargs)
    if not isinstance(model, torch.nn.Module):
        raise MobileBuildError(f"{name} returned {type(model).__name__}, expected a torch.nn.Module", field=field)
    if "transformers" not in source and hub.single_pass(model) and notes:
        print(f"   note: {name} returns a transformers model with its cache on (use_cache): turned off, as a single "
              "pass returns no cache (a recipe with generate: keeps it)")
    if source.get("inputs"):
        model = named_inputs.bind(model, source["inputs"], convert)
    return model.eval()


def _built(source, kwargs):
    """(model, field, name) of a torchvision or factory source."""
    if "torchvision" in source:
        builder, name = torchvision_builder(source["torchvision"], source.get("quantizable", False))
        # no downloads at build time: weights come from a checkpoint, and a backbone's too
        kwargs.setdefault("weights", None)
        if "weights_backbone" in inspect.signature(builder).parameters:
            kwargs.setdefault("weights_backbone", None)
        field = "model.torchvision"
    else:
        builder = resolve_callable(source["factory"], field="model.factory")
        field, name = "model.factory", source["factory"]
    try:
        return builder(**kwargs), field, name
    except Exception as exc:  # a user's factory may raise anything; report it as their error
        raise MobileBuildError(f"{name}(**kwargs) raised {type(exc).__name__}: {first_line(exc)}",
                               field=field) from None


def restore_model(source, state_path, structure=None, field="model.checkpoint"):
    """The recipe's model holding the weights of one of our own artifacts, loaded weights-only: whatever wrote the
    file (a build, the shared cache), loading it runs no code. `structure` turns the freshly built model into the
    one the weights were saved from (fused, say): the same deterministic steps from the recipe.

    Built on the meta device first: random initialisation of a large model costs more than loading it, and its
    values would be overwritten anyway. Models that cannot be built that way are built normally.
    """
    structure = structure or (lambda model: model)
    state = load_state_dict_file(state_path, field=field)
    try:
        with torch.device("meta"):
            model = structure(build_model(source, seed=0, weights=False))
        model.load_state_dict(state, assign=True)
        if not any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers())):
            return model.eval()
    except (MobileBuildError, RuntimeError, NotImplementedError):
        pass
    model = structure(build_model(source, seed=0, weights=False))
    model.load_state_dict(state)
    return model.eval()


SIZES = ("min", "example", "max")  # where a model with dynamic dims is checked


def sizes(specs):
    """The sizes a model is checked at: the example's alone, or also each dynamic dim's smallest and largest."""
    return SIZES if any(spec.get("dynamic") for spec in specs) else ("example",)


def shape_at(spec, size="example", batch=None):
    """The input's shape with its dynamic dims at their `size` ("min", "example" or "max"), and axis 0 at `batch`."""
    shape = list(spec["shape"])
    if size != "example":
        for dim in spec.get("dynamic", ()):
            shape[dim["axis"]] = dim[size]
    if batch is not None:
        shape[0] = batch
    return shape


def example_inputs(specs, seed=0, batch=None, size="example"):
    """Seeded example data for each input, as a tuple in forward's order: floats from the input's distribution
    (normal(0, 1) unless the recipe says otherwise), integers from its range [low, high), booleans at random. The
    inputs are drawn one after the other from one generator: a lone input's values are those it always had."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(_values(spec, shape_at(spec, size, batch), generator) for spec in specs)


def _values(spec, shape, generator):
    dtype = DTYPES[spec["dtype"]]
    if dtype.is_floating_point:
        tensor = _float_values(shape, generator, dtype, spec.get("distribution"))
    elif dtype == torch.bool:
        tensor = torch.randint(0, 2, shape, generator=generator).bool()
    else:
        low, high = value_range(spec)
        tensor = torch.randint(low, high, shape, generator=generator, dtype=dtype)
    if spec["memory_format"] == "channels_last" and tensor.dim() == 4:
        tensor = tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def describe_inputs(specs):
    """'ids [1, seq] int64, mask [1, seq] int64', for messages."""
    return ", ".join(f"{spec['name']} {_spec_shape(spec)} {spec['dtype']}" for spec in specs)


def as_inputs(batch, specs, field, any_batch=False):
    """A batch of the user's data (a tensor for a one-input model, a tuple or list in forward's order, or a dict keyed
    by input name) as a tuple of tensors of the inputs' dtypes; one line naming `field` when it does not fit: wrong
    count, unknown name, a size other than the input's, or a dynamic size outside its range. With `any_batch`, axis 0
    may have any size (evaluation data, calibration batches of another size), the same for every input."""
    if isinstance(batch, dict):
        unknown = sorted(set(batch) - {spec["name"] for spec in specs})
        missing = [spec["name"] for spec in specs if spec["name"] not in batch]
        if unknown or missing:
            raise MobileBuildError(f"a batch keyed {sorted(batch)} does not match the inputs "
                                   f"({', '.join(spec['name'] for spec in specs)})", field=field)
        tensors = [batch[spec["name"]] for spec in specs]
    elif isinstance(batch, (tuple, list)):
        tensors = list(batch)
    else:
        tensors = [batch]
    if len(tensors) != len(specs) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise MobileBuildError(f"a batch is {shape_of(batch)}; expected {len(specs)} tensor(s) "
                               f"({describe_inputs(specs)})", field=field)
    for spec, tensor in zip(specs, tensors):
        problem = _shape_problem(spec, list(tensor.shape), any_batch)
        if problem:
            raise MobileBuildError(f"input {spec['name']} has shape {list(tensor.shape)}: {problem}", field=field)
    if any_batch and len({len(t) for t in tensors}) > 1:
        raise MobileBuildError(f"the inputs hold different batch sizes ({[len(t) for t in tensors]})",
                               field=field)
    return tuple(t.to(DTYPES[spec["dtype"]]) for spec, t in zip(specs, tensors))


def _shape_problem(spec, shape, any_batch):
    expected = list(spec["shape"])
    if len(shape) != len(expected):
        return f"expected {len(expected)} dimensions ({_spec_shape(spec)})"
    dynamic = {dim["axis"]: dim for dim in spec.get("dynamic", ())}
    for axis, size in enumerate(shape):
        if any_batch and axis == 0:
            continue
        dim = dynamic.get(axis)
        if dim is None and size != expected[axis]:
            return f"expected {_spec_shape(spec)}"
        if dim is not None and not dim["min"] <= size <= dim["max"]:
            return f"dim {dim['dim']} is {size}, outside [{dim['min']}, {dim['max']}]"
    return None


def _spec_shape(spec):
    shape = [str(size) for size in spec["shape"]]
    for dim in spec.get("dynamic", ()):
        shape[dim["axis"]] = dim["dim"]
    return f"[{', '.join(shape)}]"


def shape_of(batch):
    """A batch's shape for a message: each tensor's, the type's name for anything else."""
    if isinstance(batch, (tuple, list)):
        return "(" + ", ".join(shape_of(item) for item in batch) + ")"
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{key}: {shape_of(item)}" for key, item in batch.items()) + "}"
    return f"a tensor {list(batch.shape)}" if isinstance(batch, torch.Tensor) else type(batch).__name__


def _float_values(shape, generator, dtype, distribution):
    if distribution is None:  # the default, drawn exactly as before distributions existed: artifacts keep their bytes
        return torch.randn(shape, generator=generator, dtype=dtype)
    if "uniform" in distribution:
        low, high = distribution["uniform"].get("low", 0.0), distribution["uniform"].get("high", 1.0)
        return torch.rand(shape, generator=generator, dtype=dtype) * (high - low) + low
    normal = distribution["normal"]
    return torch.randn(shape, generator=generator, dtype=dtype) * normal.get("std", 1.0) + normal.get("mean", 0.0)


def value_range(spec):
    """[low, high) of an integer input: the recipe's range; a byte's own for uint8."""
    return tuple(spec.get("range") or (0, 256))


def load_weights_only(path, field):
    """torch.load with weights_only=True: a file carrying code (a pickled object whose unpickling calls a function)
    is refused, never executed; one line says which."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message is a paragraph; the line that names the offending global or opcode is the useful one
        detail = next((line for line in str(exc).splitlines() if "GLOBAL" in line or "Unsupported" in line), "")
        if "GLOBAL" in detail:
            raise MobileBuildError(f"{path} was refused: it carries code, not only tensors ({detail.strip()}); "
                                   "checkpoints are loaded weights-only", field=field) from None
        raise MobileBuildError(f"{path} is not a readable PyTorch checkpoint ({detail.strip() or 'corrupt'})",
                               field=field) from None
    except (EOFError, RuntimeError, zipfile.BadZipFile, ValueError, OSError) as exc:
        # the first sentence: torch goes on about miniz internals and how files get corrupted
        raise MobileBuildError(f"{path} is not a readable PyTorch checkpoint (empty or truncated?): "
                               f"{first_line(exc).split('. ')[0]}", field=field) from None


def load_state_dict_file(path, field):
    """A state_dict (a mapping of names to tensors), read weights-only."""
    state = load_weights_only(path, field)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise MobileBuildError(f"{path} holds a {type(state).__name__}, expected a state_dict "
                               "(a mapping of parameter names to tensors)", field=field)
    return state


def load_weights(model, path, field):
    state = load_state_dict_file(path, field)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [f"{k} {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                  for k in own if k in state and state[k].shape != own[k].shape]
    problems = []
    if missing:
        problems.append(f"missing keys {few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {few(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch {few(mismatched)}")
    if problems:
        raise MobileBuildError(f"{path} does not match the model: {'; '.join(problems)}", field=field)
    model.load_state_dict(state)
    return model


def save(obj, path):
    """torch.save through a Python file: a failed write (a full disk, a file-size limit) then raises the OSError
    that says why, where torch's own file writer raises an opaque RuntimeError about zip offsets."""
    with open(path, "wb") as handle:
        try:
            torch.save(obj, handle)
        except RuntimeError as exc:
            if isinstance(exc.__context__, OSError):  # the writer's complaint while unwinding from the failed write
                raise exc.__context__ from None
            raise


def parameter_names(specs):
    """forward's parameter names for a wrapper defined from a string: the inputs' names (identifiers, by the
    schema), or arg_<i> for one that TorchScript's source would read as something else (a keyword, self, torch)."""
    return named_inputs.identifiers([spec["name"] for spec in specs])


def traced_module_path(node):
    """The module a node of a TorchScript trace's inlined graph ran in: its scope
    '__module.features/__module.features.0/__module.features.0.2' -> 'features.0.2' (the innermost)."""
    innermost = node.scopeName().rsplit("/", 1)[-1]
    return innermost.removeprefix("__module").removeprefix(".")

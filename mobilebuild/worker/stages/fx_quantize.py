"""FX graph-mode post-training quantization (torch.ao.quantization.quantize_fx), for models not written for eager
mode: it quantizes `+`, `cat`, hardswish and squeeze-excite blocks without FloatFunctional or stubs of the model's
own, and keeps in float what the engine's backend config has no int8 pattern for. Used by the quantize stage where
eager mode cannot quantize a model (quantize.static_any).

A converted model keeps the weights of functional convolutions and linears (`F.linear`, as timm's Linear calls it)
packed for the engine, in script objects held as attributes of the model, and its state_dict holds them as they are:
torch.load(weights_only=True) refuses those ("Unsupported global: GLOBAL torch.ScriptObject"). `storable` stores
each one's own pickled state instead (its int8 weight with its quantization parameters, its bias, its packing
settings: tensors, strings and lists), and `load_state` packs it again in place of the packed objects of the model
`rebuild` makes from the recipe."""

import collections
import copy
import warnings

import torch
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.backend_config import get_native_backend_config, get_qnnpack_backend_config
from torch.ao.quantization.observer import ObserverBase
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import capture_root
from mobilebuild.worker.stages import calibration, modeling


def weights(setting):
    """quantize.weights in FX graph mode: per channel where the recipe leaves it to the engine. qnnpack's default
    qconfig keeps one weight scale per tensor; the models quantized here mostly had batch norm folded into their
    convolutions, which scales each output channel by a factor of its own, and one scale then rounds the small
    channels away (timm's mobilenetv4_conv_small trained briefly: -1.0 dB per tensor, 18.4 dB per channel). The
    quantizers of ExecuTorch and ONNX Runtime take per-channel weights by default too."""
    return setting or "per_channel"


def _backend_config(engine):
    return get_qnnpack_backend_config() if engine == "qnnpack" else get_native_backend_config()


def _mapping(engine, qconfig, exclude=()):
    """The engine's default mapping (fixed ranges for sigmoid-like ops included), with the recipe's weights and
    observer, and the modules at `exclude` (exclusion.resolve's paths, and what they hold) left float."""
    mapping = get_default_qconfig_mapping(engine)
    if qconfig is not None:
        mapping.set_global(qconfig)
    for path in exclude:
        mapping.set_module_name(path, None)
    return mapping


def prepared(model, engine, specs, qconfig=None, exclude=()):
    """The model traced by FX with observers in place, ready to calibrate."""
    example = modeling.example_inputs(specs)
    model = capture_root.nested(model.eval(), len(example))
    try:
        observed = prepare_fx(model, _mapping(engine, qconfig, capture_root.paths(model, exclude)), example,
                              backend_config=_backend_config(engine))
    except Exception as exc:  # symbolic tracing raises many types on data-dependent Python
        raise Untraceable(f"FX graph mode cannot trace the model for quantization ({modeling.first_line(exc)})",
                          isinstance(exc, torch.fx.proxy.TraceError)) from None
    return _integers_unobserved(observed, example)


class Untraceable(MobileBuildError):
    """FX graph mode cannot trace the model (`reason`: what the tracer said): the quantize stage may quantize it
    dynamically instead. The advice on control flow only where that is what the tracer reported (torch.fx's
    TraceError on a Proxy used as a bool, an iterator or a length), not for what transformers' forward trips on
    ("code: co_varnames is too small")."""

    def __init__(self, reason, control_flow=False):
        advice = ("make forward free of Python control flow on tensor values, or use quantize.mode: dynamic"
                  if control_flow else "use quantize.mode: dynamic, which does not trace it")
        super().__init__(f"{reason}: {advice}", field="model")
        self.reason, self.control_flow = reason, control_flow


def _integers_unobserved(observed, example):
    """The observed model without the observers FX put on integer tensors: an attention mask that forward turns into
    floats (`mask.unsqueeze(-1).to(torch.float32)`) gets observers up to the conversion, which cannot take integers
    ("histogram_cpu" not implemented for 'Long') and must not quantize them: integer inputs pass through. Found by
    running the example: the first one fails the run, so it runs again until none is left. On a copy: each observer
    records the ranges it sees, and the example (random inputs) is no calibration data (timm's mobileone_s0 trained
    on digits reached 57,000 on a random image, 39 on digits: the ranges it left rounded every output to zero)."""
    while True:
        integer = _first_integer_observer(copy.deepcopy(observed), example)
        if integer is None:
            return observed
        (node,) = [node for node in observed.graph.nodes if node.op == "call_module" and node.target == integer]
        node.replace_all_uses_with(node.args[0])
        observed.graph.erase_node(node)
        delattr(observed, integer)
        observed.recompile()


def _first_integer_observer(observed, example):
    seen = []

    def note(name, args):
        if not args[0].is_floating_point():
            seen.append(name)
            raise _IntegerObserved

    hooks = [module.register_forward_pre_hook(lambda _, args, name=name: note(name, args))
             for name, module in observed.named_modules() if isinstance(module, ObserverBase)]
    try:
        with torch.no_grad():
            observed(*example)
    except _IntegerObserved:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return seen[0] if seen else None


class _IntegerObserved(Exception):
    pass


def static(model, engine, batches, specs, qconfig=None, field="quantize.calibration", exclude=()):
    """Calibrate on `batches` and convert."""
    observed = prepared(model, engine, specs, qconfig, exclude)
    calibration.calibrate(observed, batches, field)
    return convert_fx(observed, backend_config=_backend_config(engine))


def rebuild(model, engine, specs, qconfig=None, exclude=()):
    """The converted structure without calibration, for a stored state_dict to be loaded into."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # converting uncalibrated observers warns
        return convert_fx(prepared(model, engine, specs, qconfig, exclude), backend_config=_backend_config(engine))


def kept_float(converted):
    """{operation: count} of what the converted model computes in float: the nodes fed by a dequantize."""
    found = collections.Counter()
    for node in converted.graph.nodes:
        if node.op == "output":
            continue
        if any(isinstance(arg, torch.fx.Node) and arg.op == "call_method" and arg.target == "dequantize"
               for arg in node.args):
            if node.op == "call_module":
                found[type(converted.get_submodule(node.target)).__name__] += 1
            else:
                found[node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "op")] += 1
    return dict(found)


def storable(state):
    """The converted model's state_dict as a weights-only file can hold it: {"state_dict": its tensors} and, where it
    holds packed weights, "packed": {attribute: {"class": the script class's name, "state": what the class pickles}}.
    A model without packed weights is stored as it always was."""
    packed = {name: value for name, value in state.items() if isinstance(value, torch.ScriptObject)}
    if not packed:
        return {"state_dict": state}
    tensors = collections.OrderedDict((name, value) for name, value in state.items() if name not in packed)
    return {"state_dict": tensors, "packed": {name: _packed_state(value) for name, value in packed.items()}}


def _packed_state(packed):
    own_state, class_name = packed.__getstate__()  # what pickling the script object writes, less its class global
    return {"class": class_name, "state": own_state}


def load_state(model, stored, path):
    """Load what `storable` stored into `model`, the converted structure `rebuild` made: its tensors, then each
    packed weight, packed again from its stored state, in place of the model's own at the same attribute (of the
    same script class)."""
    model.load_state_dict(stored["state_dict"])
    saved = stored.get("packed", {})
    own = {name: value for name, value in model.state_dict().items() if isinstance(value, torch.ScriptObject)}
    mismatched = sorted(set(own) ^ set(saved)) + sorted(
        name for name in set(own) & set(saved) if own[name]._type().qualified_name() != saved[name]["class"])
    if mismatched:
        raise MobileBuildError(f"{path} does not match the model rebuilt from the recipe (packed weights "
                               f"{few(mismatched)})")
    for name, packed in saved.items():  # made as unpickling the script object would make it
        restored = torch.ScriptObject.__new__(torch.ScriptObject)
        restored.__setstate__((packed["state"], packed["class"]))
        setattr(model, name, restored)
    return model

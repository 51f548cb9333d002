"""FX graph-mode post-training quantization (torch.ao.quantization.quantize_fx), for models not written for eager
mode: it quantizes `+`, `cat`, hardswish and squeeze-excite blocks without FloatFunctional or stubs of the model's
own, and keeps in float what the engine's backend config has no int8 pattern for. Used by the quantize stage where
eager mode cannot quantize a model (quantize.static_any)."""

import collections
import warnings

import torch
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.backend_config import get_native_backend_config, get_qnnpack_backend_config
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import calibration, modeling


def _backend_config(engine):
    return get_qnnpack_backend_config() if engine == "qnnpack" else get_native_backend_config()


def _mapping(engine, qconfig):
    """The engine's default mapping (fixed ranges for sigmoid-like ops included), with the recipe's weights."""
    mapping = get_default_qconfig_mapping(engine)
    return mapping if qconfig is None else mapping.set_global(qconfig)


def prepared(model, engine, input_config, qconfig=None):
    """The model traced by FX with observers in place, ready to calibrate."""
    example = (modeling.example_input(input_config),)
    try:
        return prepare_fx(model.eval(), _mapping(engine, qconfig), example, backend_config=_backend_config(engine))
    except Exception as exc:  # symbolic tracing raises many types on data-dependent Python
        raise MobileBuildError(f"FX graph mode cannot trace the model for quantization ({modeling.first_line(exc)}); "
                               "make forward free of Python control flow on tensor values, or use quantize.mode: "
                               "dynamic", field="model") from None


def static(model, engine, batches, input_config, qconfig=None, field="quantize.calibration"):
    """Calibrate on `batches` and convert."""
    observed = prepared(model, engine, input_config, qconfig)
    calibration.calibrate(observed, batches, field)
    return convert_fx(observed, backend_config=_backend_config(engine))


def rebuild(model, engine, input_config, qconfig=None):
    """The converted structure without calibration, for a stored state_dict to be loaded into."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # converting uncalibrated observers warns
        return convert_fx(prepared(model, engine, input_config, qconfig), backend_config=_backend_config(engine))


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

"""fx: a model the quantize stage quantized in FX graph mode, against the fused float model:
torch.ao.ns._numeric_suite_fx.add_shadow_loggers, which feeds a copy of each quantized op the float model's input
(quantized as the int8 model does), here always dequantized (the suite hands an op that takes either dtype, a hardswish
or a pool, the quantized tensor) and run out of place; a copy that still cannot run leaves its layer under
not_compared. Reached through the eager route (eager.compare), which sees how the model was quantized."""

import contextlib
import re

import torch
from torch.ao.ns import _numeric_suite_fx as ns_fx
from torch.ao.ns.fx import graph_matcher, pattern_utils
from torch.ao.quantization.observer import ObserverBase

from mobilebuild.worker import quiet
from mobilebuild.worker.layers.common import Errors, dequantized, exclusions
from mobilebuild.worker.stages import fuse, fx_quantize, modeling, quantize

DETAIL = ("FX numeric suite (torch.ao.ns._numeric_suite_fx.add_shadow_loggers): each quantized op fed the float "
          "model's input")


def compare_quantized(inputs, config, chunks, quantized):
    """(the errors, "fx", DETAIL) of `quantized`, the quantize stage's model quantized in FX graph mode, as the layers
    hook returns them (eager.compare hands such a model on)."""
    fused = fuse.load(inputs["model"], config)
    quantization = config.quantization
    exclude = exclusions(fused, quantization)
    qconfig = quantize.qconfig_for(config.engine, quantization["weights"])
    with quiet.quiet(output=False):
        observed = fx_quantize.prepared(fused, config.engine, config.inputs, qconfig, *([exclude] if exclude else []))
    with quiet.quiet(), _fusions_listed_once():  # it prints a line per op it cannot shadow (a quantized add...)
        shadowed = ns_fx.add_shadow_loggers("float", observed, "int8", quantized, ns_fx.OutputLogger)
    guards = _guarded_shadows(shadowed)
    loggers = [module for module in shadowed.modules() if isinstance(module, ns_fx.OutputLogger)]
    errors = Errors()
    with torch.no_grad():
        for chunk in chunks:
            shadowed(*chunk)
            for node_name, guard in guards.values():
                if guard.failed:
                    errors.skip(*_shadow_label(loggers, node_name),
                                f"its float module cannot run on the int8 model's input: {guard.failed}")
            found = ns_fx.extract_shadow_logger_info(shadowed, ns_fx.OutputLogger, "int8")
            for subgraph in found.values():
                for kind in subgraph.values():
                    for expected, output in zip(kind.get("float", []), kind.get("int8", [])):
                        name = output.get("fqn") or expected.get("fqn") or output["ref_node_name"]
                        op = _type_name(output.get("ref_node_target_type") or expected.get("ref_node_target_type"))
                        for a, b in zip(expected["values"], output["values"]):
                            a, b = dequantized(a), dequantized(b)
                            if a is not None and b is not None:
                                errors.add(name, op, a, b)
            for logger in loggers:
                logger.stats = []
    return errors, "fx", DETAIL


@contextlib.contextmanager
def _fusions_listed_once():
    """The FX numeric suite's subgraph matcher asks torch.ao.ns.fx.pattern_utils.get_reversed_fusions for the
    fusion patterns at every node it matches, and that list is built afresh each time from the backend config's
    patterns (several thousand classes made per call): on timm's mobileone_s0 (1353 nodes at 64x64), 5771 calls took
    53.7 s of add_shadow_loggers' 71.4 s. The list depends on nothing but torch, so it is built once while the
    suite matches here (the matcher only reads it)."""
    listed = pattern_utils.get_reversed_fusions()
    original = graph_matcher.get_reversed_fusions
    graph_matcher.get_reversed_fusions = lambda: listed
    try:
        yield
    finally:
        graph_matcher.get_reversed_fusions = original


# The FX numeric suite names the float copies it adds beside an int8 node "<its name>_shadow_copy_<n>" (the op, then
# the float model's observer after it), what converts the int8 model's value for them "<its name>_dtype_cast_<n>"
_SHADOW = "_shadow_copy_"
_SHADOW_COPY = re.compile(r"^(?P<node>.+)_shadow_copy_\d+$")
_CAST = re.compile(r"^.+_dtype_cast_\d+$")


class _Dequantize(torch.nn.Module):
    def forward(self, x):
        return x.dequantize() if isinstance(x, torch.Tensor) and x.is_quantized else x


class _GuardedShadow(torch.nn.Module):
    """A float module's copy that shadows an int8 node, kept from failing the whole comparison: where it cannot run,
    why is noted (its layer is then not compared) and its input passes on, as a float tensor, to the logger its
    branch ends in."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.failed = None

    def forward(self, *args, **kwargs):
        if self.failed is None:
            try:
                return self.module(*args, **kwargs)
            except Exception as exc:  # a kernel's error for that input: any type
                self.failed = f"{type(exc).__name__}: {modeling.first_line(exc)}"
        value = next((arg for arg in (*args, *kwargs.values()) if isinstance(arg, torch.Tensor)), None)
        return value.dequantize() if value is not None and value.is_quantized else value


def _guarded_shadows(shadowed):
    """{copy's name: (the int8 node's name, its guard)} for the float module copies that add_shadow_loggers put
    beside the int8 nodes, each fed float, run out of place and wrapped in a _GuardedShadow. The suite hands an op
    that takes float or int8 alike (a hardswish, a pool) the int8 model's quantized tensor as it is (its dtype cast
    is an Identity): MobileNetV3's nn.Hardswish(inplace=True) failed the whole comparison there, quantized tensors
    having no hardswish_ ("Could not run 'aten::hardswish_' with arguments from the 'QuantizedCPU' backend"), and
    out of place its quantized result failed the float model's observer after it (aminmax). Dequantized, each float
    copy gets what the others get: the int8 model's input as float. Out of place, a copy computes the same values,
    and cannot change a float tensor the int8 model still uses."""
    guards = {}
    for node in shadowed.graph.nodes:
        if node.op == "call_function" and _SHADOW_COPY.match(node.name) and node.kwargs.get("inplace"):
            node.kwargs = {**node.kwargs, "inplace": False}
        if node.op != "call_module":
            continue
        module = shadowed.get_submodule(node.target)
        if _CAST.match(node.target):
            if isinstance(module, torch.nn.Identity):
                setattr(shadowed, node.target, _Dequantize())
            continue
        copy = _SHADOW_COPY.match(node.target)
        if not copy or isinstance(module, (ObserverBase, torch.ao.quantization.FakeQuantizeBase, ns_fx.OutputLogger)):
            continue  # the float model's observer after the op passes values on
        for inner in module.modules():
            if getattr(inner, "inplace", None) is True:
                inner.inplace = False
        guard = _GuardedShadow(module)
        guards[node.target] = (copy["node"], guard)
        setattr(shadowed, node.target, guard)
    shadowed.recompile()
    return guards


def _shadow_label(loggers, node_name):
    """(name, op) of the int8 node `node_name` as the comparison names it, from the loggers of its branch."""
    float_side = next((logger for logger in loggers if logger.model_name == "float"
                       and logger.ref_node_name.startswith(node_name + _SHADOW)), None)
    int8_side = next((logger for logger in loggers if logger.model_name == "int8"
                      and logger.ref_node_name == node_name), None)
    sides = [side for side in (int8_side, float_side) if side is not None]
    name = next((side.fqn for side in sides if side.fqn), node_name)
    return name, _type_name(next((side.ref_node_target_type for side in sides if side.ref_node_target_type), None))


def _type_name(target_type):
    text = str(target_type or "op")
    return text.rsplit(".", 1)[-1].strip("'>")

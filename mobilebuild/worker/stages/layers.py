"""layers: where an int8 artifact's error comes from. Each quantized layer is compared with its float counterpart
fed the float side's inputs (a shadow comparison), so a layer is charged with the error it adds itself, not with
what the layers before it left at its output (which would always blame the last layers). The result lists the N
layers with the lowest SQNR, worst first.

Per route, with the tools its quantizer comes with:
  eager:  the quantize stage's model rebuilt as the script stage does (quantize.load_quantized), each quantized
          module shadowed by the fused float module at the same path, both fed the same (dequantized) input: torch's
          eager numeric suite (torch.ao.ns._numeric_suite.prepare_model_with_stubs, as compare_model_stub does).
  fx:     a model the quantize stage quantized in FX graph mode: torch.ao.ns._numeric_suite_fx.add_shadow_loggers,
          which feeds a copy of each quantized op the float model's input (quantized as the int8 model does), here
          always dequantized (the suite hands an op that takes either dtype, a hardswish or a pool, the quantized
          tensor) and run out of place; a copy that still cannot run leaves its layer under not_compared.
  pt2e:   ExecuTorch int8. The stock executorch 1.3.1 wheel's runtime has no event tracer ("No etdump data found,
          try rebuilding with the CMake option EXECUTORCH_ENABLE_EVENT_TRACER"), so ETDump and the Inspector's
          numeric gap cannot run here; and inside an XNNPACK delegate the runtime shows no per-op outputs anyway.
          The quantization the lower stage runs (ExecuTorch's export recipe: torch.export, its quantizer,
          prepare_pt2e, the same calibration batches, convert_pt2e) is run again, and torchao's PT2E numeric
          debugger (prepare_for_propagation_comparison) logs each node of the float and the quantized graph,
          matched by their source nodes (one call of a torch function: all the ATen nodes of an
          F.multi_head_attention_forward are one); the quantized graph's loggers hand on the float graph's value,
          so each node is fed float inputs (quantized where the int8 graph quantizes them).
  onnx:   the shipped int8 .onnx against the float model exported again, run with each tensor the comparison needs
          as an output of its own, in the shape it has at the data's sizes (whatever shape inference could declare:
          a dynamic dim's `positions[:, :seq]` has none); each quantized node of the QDQ model, cut out with its
          quantize/dequantize pairs (onnx.utils.Extractor), runs on the float model's inputs (an input export kept
          float, as an attention mask, included); onnxruntime.quantization.qdq_loss_debug's
          create_weight_matching/compute_weight_error add each node's weight SQNR (its weight's, not its bias's),
          without its log lines about the copies of a shared bias. A dynamically
          quantized model (quantize_dynamic) has no QDQ pairs: each integer unit (DynamicQuantizeLinear, then
          MatMulInteger or ConvInteger and the float ops that rescale its result; a Gather of an int8 table and its
          DequantizeLinear) is cut out from the float tensor it quantizes to the float model's tensor it replaces.
          ONNX node names map back to module paths through the exporter's name scopes.
A layer is a module with no module running inside it (Linear, LayerNorm, MultiheadAttention), named by its class;
the operations a container runs itself (a TransformerEncoderLayer's residual adds) are named by their op, numbered
where it has several. A layer's SQNR is measured over the values the float model has finite (an attention mask's
-inf is left out); a layer that has no SQNR (int8 gives inf or NaN where float does not, an all-zero float output, a
part that cannot run alone) is listed under not_compared with why, never given a number.
The data is verification's (verify.evaluation_data: never calibration's), at the example's sizes.
"""

import copy
import dataclasses
import json
import math
import re
import time
from types import SimpleNamespace

import torch
from torch.ao.ns import _numeric_suite as ns
from torch.ao.quantization.observer import ObserverBase

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import metrics, progress, quiet
from mobilebuild.worker.stages import fuse, modeling, verify

METHODS = {
    "eager": "eager numeric suite (torch.ao.ns._numeric_suite shadow modules): each quantized module and its float "
             "module on the same input",
    "fx": "FX numeric suite (torch.ao.ns._numeric_suite_fx.add_shadow_loggers): each quantized op fed the float "
          "model's input",
    "pt2e": "PT2E numeric debugger (torchao prepare_for_propagation_comparison) on the int8 graph the lower stage "
            "quantizes, each node fed the float graph's input; not ETDump: the stock executorch runtime is built "
            "without the event tracer",
    "onnx": "each quantized node of the shipped QDQ model, with its Q/DQ pairs, run on the float model's inputs "
            "(read from an onnxruntime run of the float model); weight SQNR from "
            "onnxruntime.quantization.qdq_loss_debug",
}
# Nodes that only move or view data: never a layer of their own
MOVES = {"view", "reshape", "flatten", "permute", "transpose", "squeeze", "unsqueeze", "contiguous", "clone",
         "getitem", "dropout", "_assert_tensor_metadata", "expand", "alias", "detach", "to", "unflatten", "select",
         "slice", "split", "split_with_sizes", "unbind", "narrow", "t", "movedim", "Reshape", "Flatten", "Transpose",
         "Squeeze", "Unsqueeze", "Identity", "Shape", "Gather", "Cast", "Constant", "Slice", "Split", "Expand"}

class _Errors:
    """Per layer: the float signal's energy and the error's, summed over every batch, over the values the float model
    has finite. One it has inf or NaN (an attention mask's -inf added to the scores, which int8 makes a large finite
    number) has no error to measure: it is left out and counted. One that is finite in the float model and inf or NaN
    in the int8 one makes the layer's SQNR meaningless: the layer is listed as not comparable, with why, rather than
    given a number."""

    def __init__(self):
        # (name, op) -> [signal, noise, values compared, of them inf or NaN in int8, float values inf or NaN, extra,
        #                the nodes that gave those]
        self.found = {}
        self.skipped = {}  # (name, op) -> why it cannot be compared

    def add(self, name, op, reference, output, part=None, **extra):
        """`part`: the node of the layer that gave these values, named where int8 gives inf or NaN."""
        # the same values: ONNX's and the float graph's may differ in shape by a view
        if reference.numel() != output.numel() or reference.dtype != output.dtype or not reference.is_floating_point():
            return
        reference = reference.detach().double().flatten()
        output = output.detach().double().flatten()
        entry = self.found.setdefault((name, op), [0.0, 0.0, 0, 0, 0, extra, []])
        finite = torch.isfinite(reference)
        reference, output = reference[finite], output[finite]
        broken = ~torch.isfinite(output)
        entry[2] += reference.numel()
        entry[3] += int(broken.sum().item())
        if broken.any() and part and part not in entry[6]:
            entry[6].append(part)
        entry[4] += int((~finite).sum().item())
        entry[0] += reference.pow(2).sum().item()
        entry[1] += (reference[~broken] - output[~broken]).pow(2).sum().item()

    def skip(self, name, op, why):
        """A layer that cannot be compared (a part of it that cannot run), and why (one line): it has no SQNR, not
        one of its other parts only."""
        self.skipped.setdefault((name, op), why)

    def results(self):
        """(the layers with an SQNR, worst first; the layers that have none, each with why)."""
        rows, uncompared = [], []
        for (name, op), (signal, noise, compared, broken, masked, extra, parts) in self.found.items():
            if (name, op) in self.skipped:
                continue
            if broken:
                why = (f"int8 gives inf or NaN for {broken} of its {compared} values where float's are finite"
                       + (f" (in {', '.join(parts)})" if parts else ""))
            elif noise == 0.0:  # exact: it adds no error (a dequantization, a float module, a mask)
                continue
            elif signal == 0.0:
                why = "the float model's output is all zeros: no signal to measure the error against"
            else:
                value = 10.0 * math.log10(signal / noise)
                row = {"name": name, "op": op, "sqnr_db": round(min(value, metrics.SQNR_CEILING_DB), 2), **extra}
                rows.append(row | ({"float_inf_or_nan_values": masked} if masked else {}))
                continue
            uncompared.append({"name": name, "op": op, "reason": why})
        uncompared += [{"name": name, "op": op, "reason": why} for (name, op), why in self.skipped.items()]
        return (sorted(rows, key=lambda row: (row["sqnr_db"], row["name"], row["op"])),
                sorted(uncompared, key=lambda row: (row["name"], row["op"])))


def _dequantized(value):
    if isinstance(value, (tuple, list)):
        value = next((item for item in value if isinstance(item, torch.Tensor)), None)
    if not isinstance(value, torch.Tensor):
        return None
    return value.dequantize() if value.is_quantized else value


def batches(config):
    """(batches of the example's size as tuples of tensors, what the data is): verification's data."""
    settings = SimpleNamespace(**dataclasses.asdict(config), fixed_shape="the example's sizes")
    groups, description = verify.evaluation_data(settings)
    _, data, _ = groups[0]
    size = config.inputs[0]["shape"][0]
    usable = min(len(data[0]), max(config.samples, size))  # an evaluation function's data too
    usable -= usable % size
    return list(zip(*(x[:usable].split(size) for x in data))), description


# --- eager mode and FX graph mode (the quantize stage's model) ---------------------------------------------------

def _exclusions(model, quantization):
    entries = (quantization or {}).get("exclude")
    if not entries:
        return ()
    from mobilebuild.worker.stages import exclusion  # quantize.exclude (a newer helper of the quantizing stages)

    return exclusion.resolve(model, entries)


def eager_layers(inputs, config, chunks):
    from torch.ao import quantization as tq

    from mobilebuild.worker.stages import quantize

    quantized = quantize.load_quantized(inputs, config)
    if isinstance(quantized, torch.fx.GraphModule):
        return fx_layers(inputs, config, chunks, quantized)
    reference = fuse.load(inputs["model"], config).eval()
    if isinstance(quantized, tq.QuantWrapper):  # its stubs are identities on a float model
        reference = type(quantized)(reference).eval()
    swap = _swapped_types(reference, quantized)
    ns.prepare_model_with_stubs(reference, quantized, swap, _Shadow)
    shadows = {name: module for name, module in quantized.named_modules() if isinstance(module, ns.Shadow)}
    prefix = "module." if isinstance(quantized, tq.QuantWrapper) else ""
    errors = _Errors()
    with torch.no_grad():
        for chunk in chunks:
            quantized(*chunk)
            for name, shadow in shadows.items():
                stats = shadow.logger.stats
                for output, expected in zip(stats["quantized"], stats["float"]):
                    output, expected = _dequantized(output), _dequantized(expected)
                    if output is not None and expected is not None:
                        errors.add(name.removeprefix(prefix) or name, type(shadow.shadow_module).__name__, expected,
                                   output)
                stats["quantized"], stats["float"] = [], []
    return errors, "eager"


def _swapped_types(reference, quantized):
    """The float module types whose modules quantization replaced: layers (leaves, or fused modules), not the
    containers around them."""
    from torch.ao.nn.intrinsic import _FusedModule

    found = dict(reference.named_modules())
    swap = set()
    for name, module in quantized.named_modules():
        original = found.get(name)
        if (name and original is not None and type(original) is not type(module)
                and (not list(original.children()) or isinstance(original, _FusedModule))):
            swap.add(type(original))
    return swap


class _Shadow(ns.ShadowLogger):
    """The suite's ShadowLogger keeps one sample of a batch (`x[0]` when len(x) > 1): this one keeps them all."""

    def forward(self, x, y):
        self.stats["quantized"].append(x.detach() if isinstance(x, torch.Tensor) else x)
        self.stats["float"].append(y.detach() if isinstance(y, torch.Tensor) else y)


def fx_layers(inputs, config, chunks, quantized):
    from torch.ao.ns import _numeric_suite_fx as ns_fx

    from mobilebuild.worker.stages import fx_quantize, quantize

    fused = fuse.load(inputs["model"], config)
    quantization = config.quantization
    exclude = _exclusions(fused, quantization)
    qconfig = quantize.qconfig_for(config.engine, quantization["weights"])
    with quiet.quiet(output=False):
        observed = fx_quantize.prepared(fused, config.engine, config.inputs, qconfig, *([exclude] if exclude else []))
        shadowed = ns_fx.add_shadow_loggers("float", observed, "int8", quantized, ns_fx.OutputLogger)
    guards = _guarded_shadows(shadowed)
    loggers = [module for module in shadowed.modules() if isinstance(module, ns_fx.OutputLogger)]
    errors = _Errors()
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
                            a, b = _dequantized(a), _dequantized(b)
                            if a is not None and b is not None:
                                errors.add(name, op, a, b)
            for logger in loggers:
                logger.stats = []
    return errors, "fx"


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
    from torch.ao.ns._numeric_suite_fx import OutputLogger

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
        if not copy or isinstance(module, (ObserverBase, torch.ao.quantization.FakeQuantizeBase, OutputLogger)):
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


# --- ExecuTorch int8 (PT2E) ---------------------------------------------------------------------------------------

def pt2e_quantized(model, config):
    """(the float graph, the int8 graph) as the lower stage's export recipe makes them: the same quantizer, the same
    calibration batches (dynamic mode: the example input, which calibrates nothing), the same seed."""
    from executorch.export.stages import QuantizeStage
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from mobilebuild.worker.stages import lower

    exclude = _exclusions(model, {"exclude": config.exclude})
    adjust = {key: value for key, value in (("exclude", exclude), ("observer", config.observer)) if value}
    recipe = lower.export_recipe("xnnpack", "int8", config.options, config.weights, mode=config.mode, **adjust)
    samples = (lower.calibration_samples(config.calibration, config.inputs) if config.mode == "static"
               else [lower.in_layout(modeling.example_inputs(config.inputs))])
    quantizer = QuantizeStage(recipe.quantization_recipe)._get_quantizer_for_prepare_pt2e(
        recipe.quantization_recipe.quantizers)
    torch.manual_seed(0)
    with quiet.quiet(), torch.no_grad():
        captured = torch.export.export(model.eval(), samples[0], strict=True).module()
        reference = copy.deepcopy(captured)  # its nodes keep their sources: the debugger matches them
        prepared = prepare_pt2e(captured, quantizer)
        for sample in samples:
            prepared(*sample)
        return reference, convert_pt2e(prepared)


def pt2e_layers(inputs, config, chunks):
    from torchao.quantization.pt2e._numeric_debugger import OutputLogger, prepare_for_propagation_comparison

    from mobilebuild.worker.stages import lower

    progress.note("quantizing as the lower stage does")
    reference, quantized = pt2e_quantized(fuse.load(inputs["model"], config), config)
    reference = prepare_for_propagation_comparison(reference)
    quantized = prepare_for_propagation_comparison(quantized)

    class Copying(OutputLogger):
        """Logs a copy: an in-place op after the node (masked_fill_ on a zeros_like, a relu_) would change a logged
        view of its output."""

        def forward(self, x):
            self.stats.append(x.detach().clone() if isinstance(x, torch.Tensor) else x)
            return x

    # The float graph's loggers, by debug info (a node's source: one call of a torch function, which may have become
    # several ATen nodes, as F.multi_head_attention_forward does), in graph order: the last one's value is the
    # group's output
    groups = {}
    for node in list(reference.graph.nodes):
        if node.op == "call_module" and isinstance(reference.get_submodule(node.target), OutputLogger):
            module = reference.get_submodule(node.target)
            setattr(reference, node.target, Copying(module.debug_info, module.node_name, module.nn_module_stack))
            groups.setdefault(module.debug_info, []).append(getattr(reference, node.target))
    labels = _labels(groups)
    handing = {}  # debug info -> the float graph's value for the batch that runs
    # The int8 graph's quantize and dequantize nodes carry the debug info of the node whose output they quantize:
    # the last logger of each debug info sees the value as the int8 graph passes it on
    last = {}
    for node in quantized.graph.nodes:
        if node.op == "call_module" and isinstance(quantized.get_submodule(node.target), OutputLogger):
            last[quantized.get_submodule(node.target).debug_info] = node.target

    class Feeding(OutputLogger):
        """Logs the int8 graph's value of a node, then hands (a copy of) the float graph's on: the next node gets float
        inputs."""

        def forward(self, x):
            expected = handing.get(self.debug_info)
            if (isinstance(x, torch.Tensor) and isinstance(expected, torch.Tensor) and expected.shape == x.shape
                    and expected.dtype == x.dtype):
                self.stats.append(x.detach())
                return expected.clone()
            return x

    for name, module in list(quantized.named_children()):
        if isinstance(module, OutputLogger) and last.get(module.debug_info) == name:
            setattr(quantized, name, Feeding(module.debug_info, module.node_name, module.nn_module_stack))
    errors = _Errors()
    with torch.no_grad(), quiet.quiet(output=False):
        for chunk in chunks:
            chunk = lower.in_layout(chunk)
            for module in (*reference.children(), *quantized.children()):
                if isinstance(module, OutputLogger):
                    module.stats = []
            reference(*chunk)
            handing.clear()
            handing.update({info: group[-1].stats[-1] for info, group in groups.items() if group[-1].stats})
            quantized(*chunk)
            for module in quantized.children():
                if isinstance(module, Feeding) and module.stats and module.debug_info in labels \
                        and module.debug_info in handing:
                    name, op, node_name = labels[module.debug_info]
                    errors.add(name, op, handing[module.debug_info], module.stats[-1], part=node_name)
    return errors, "pt2e"


def _aten_name(node_name):
    """conv2d_1 -> conv2d."""
    base = (node_name or "").rstrip("0123456789")
    return base[:-1] if base.endswith("_") else base


def _labels(groups):
    """debug info -> (name, op, that node's name) of each group of nodes of an exported graph worth comparing (not
    one that only moves data): the innermost module of its last node that computes, and that module's class where it
    is one of torch.nn's layers (Linear, LayerNorm, MultiheadAttention) and no module is called inside it; else the
    operation, numbered where a module has several (a TransformerEncoderLayer's residual adds: `add #1`, `add #2`).
    A node outside any module is named by itself (the `add` of two embeddings)."""
    placed = {}
    for info, loggers in groups.items():
        computing = [logger for logger in loggers if _aten_name(logger.node_name) not in MOVES]
        if computing:
            placed[info] = (computing[-1].node_name, _stack(computing[-1].nn_module_stack))
    # the modules other modules run inside: containers, not layers
    around = {path for loggers in groups.values() for logger in loggers
              for path, _ in _stack(logger.nn_module_stack)[:-1]}
    named, counts = {}, {}
    for info, (node_name, stack) in placed.items():
        op = _aten_name(node_name)
        if not stack:
            named[info] = (node_name, op)
            continue
        path, kind = stack[-1]
        if path not in around and (kind.startswith("torch.nn.") or kind.startswith("torch.ao.nn.")):
            named[info] = (path, kind.rsplit(".", 1)[-1])
        else:
            named[info] = (path, op)
            counts[(path, op)] = counts.get((path, op), 0) + 1
    seen = {}
    for info, (path, op) in named.items():
        if counts.get((path, op), 0) > 1:
            seen[(path, op)] = seen.get((path, op), 0) + 1
            named[info] = (path, f"{op} #{seen[(path, op)]}")
    return {info: (*named[info], placed[info][0]) for info in named}


def _stack(stack):
    """[(module path, class name)] of a node's nn_module_stack, outermost first, the root left out."""
    found = []
    for path, kind in (stack.values() if isinstance(stack, dict) else ()):
        path = path.removeprefix("L['self']").removeprefix(".")
        kind = kind if isinstance(kind, str) else \
            f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', kind)}"
        if path:
            found.append((path, kind))
    return found


# --- ONNX Runtime int8 (QDQ) ---------------------------------------------------------------------------------------

def _scopes(proto):
    """(ONNX node name -> (module path, class name), the module paths other modules run inside) from the exporter's
    metadata."""
    import ast

    found, around = {}, set()
    for node in proto.graph.node:
        meta = {entry.key: entry.value for entry in node.metadata_props}
        try:
            scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "None")) or []
            classes = ast.literal_eval(meta.get("pkg.torch.onnx.class_hierarchy", "None")) or []
        except (ValueError, SyntaxError):
            continue
        # name_scopes: the root '', each module's path, the node's own name; class_hierarchy: their classes
        if len(scopes) > 2 and scopes[-2]:
            kind = classes[len(scopes) - 2] if len(classes) >= len(scopes) - 1 else None
            found[node.name] = (scopes[-2], kind.rsplit(".", 1)[-1] if isinstance(kind, str) else None)
            around.update(path for path in scopes[1:-2] if path)
    return found, around


def onnx_layers(inputs, config, chunks):
    import tempfile
    from pathlib import Path

    import numpy
    import onnx
    import onnxruntime
    from onnxruntime.quantization import qdq_loss_debug

    from mobilebuild.worker.stages import export

    progress.note("exporting the float model again")
    exporting = config.options or {}
    proto = export.export_float(fuse.load(inputs["model"], config), config.inputs, exporting.get("opset"),
                                config.outputs, exporting.get("exporter"), notes=False)
    qdq = onnx.load(inputs["artifact"])
    names = [spec["name"] for spec in config.inputs]
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    float_model = export.reproducible(onnx.load_from_string(proto.SerializeToString()))
    with tempfile.TemporaryDirectory(prefix="mobilebuild-layers-") as folder:
        float_path, qdq_path = Path(folder) / "float.onnx", Path(folder) / "qdq.onnx"
        onnx.save(float_model, float_path)
        onnx.save(qdq, qdq_path)
        weights = _weight_errors(qdq_loss_debug, float_path, qdq_path)
    layers = list(_quantized_nodes(qdq)) + list(_integer_units(qdq, proto))
    labels = _onnx_labels(proto, [node for node, *_ in layers])
    wanted = {name for _, feeds, _, original, unquantized in layers for name in (*feeds, original, *unquantized)}
    # The float model with each tensor the comparison reads as an output of its own, in the shape it has at the
    # data's sizes (whatever shapes inference could or could not declare for it)
    floating = onnxruntime.InferenceSession(_with_outputs(float_model, wanted).SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
    produced = [value.name for value in floating.get_outputs()]
    pieces = {}  # node name -> its session, or why it has none
    errors = _Errors()
    for chunk in chunks:
        feed = {name: x.contiguous().numpy() for name, x in zip(names, chunk)}
        values = dict(zip(produced, floating.run(None, feed))) | feed
        for node, feeds, output, original, unquantized in layers:
            if original not in values or any(name not in values for name in feeds):
                continue
            feeds = list(dict.fromkeys([*feeds, *(name for name in unquantized if name in values)]))
            name, op = labels[node.name]
            if node.name not in pieces:
                pieces[node.name] = _piece(qdq, feeds, output, values[original].dtype, values, options)
            piece = pieces[node.name]
            if not isinstance(piece, str):
                try:
                    (result,) = piece.run([output], {feed_name: values[feed_name] for feed_name in feeds})
                except Exception as exc:
                    piece = pieces[node.name] = f"{type(exc).__name__}: {modeling.first_line(exc)}"
            if isinstance(piece, str):
                errors.skip(name, op, f"its {node.op_type} {node.name} cannot run alone: {piece}")
                continue
            extra = {"weight_sqnr_db": weights[node.name]} if node.name in weights else {}
            errors.add(name, op, torch.from_numpy(numpy.asarray(values[original])),
                       torch.from_numpy(numpy.asarray(result)), part=f"{node.op_type} {node.name}", **extra)
    return errors, "onnx"


def _with_outputs(proto, wanted):
    """The model with each of the `wanted` tensors its nodes compute as a graph output, declared by element type
    only: no shape, so that a dynamic dim that shape inference cannot follow (`positions[:, :seq]`) needs none."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {value.name: value.type.tensor_type.elem_type
             for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    listed = {value.name for value in (*model.graph.output, *model.graph.input)}
    computed = {name for node in model.graph.node for name in node.output}
    for name in sorted(wanted):
        if name in computed and name not in listed and types.get(name):
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    return model


def _piece(qdq, feeds, output, dtype, values, options):
    """An ONNX Runtime session of the part of the QDQ model from the `feeds` to `output`, its inputs and output
    declared by element type only (the values come in the float model's shapes at the data's sizes), or why it
    cannot run: one line."""
    import onnx
    import onnxruntime
    from onnx.helper import make_tensor_value_info, np_dtype_to_tensor_dtype

    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    declared = {name: np_dtype_to_tensor_dtype(values[name].dtype) for name in feeds}
    declared[output] = np_dtype_to_tensor_dtype(dtype)
    kept = [value for value in model.graph.value_info if value.name not in declared]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    model.graph.value_info.extend(make_tensor_value_info(name, elem, None) for name, elem in declared.items())
    try:
        piece = onnx.utils.Extractor(model).extract_model(list(feeds), [output])
        return onnxruntime.InferenceSession(piece.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return f"{type(exc).__name__}: {modeling.first_line(exc)}"


def _onnx_labels(proto, nodes):
    """ONNX node name -> (name, op) for each node compared, from the exporter's name scopes: the innermost module
    and its class where no module runs inside it (Linear, MultiheadAttention); in a container, the ONNX op,
    numbered where the container has several (a TransformerEncoderLayer's residual `Add #1`, `Add #2`); without
    a scope, the node's own name and op."""
    scopes, around = _scopes(proto)
    named, counts = {}, {}
    for node in nodes:
        path, kind = scopes.get(node.name, (None, None))
        if not path or not kind:
            named[node.name] = (node.name, node.op_type)
        elif path not in around:
            named[node.name] = (path, kind)
        else:
            named[node.name] = (path, node.op_type)
            counts[(path, node.op_type)] = counts.get((path, node.op_type), 0) + 1
    seen = {}
    for node in nodes:
        path, op = named[node.name]
        if counts.get((path, op), 0) > 1:
            seen[(path, op)] = seen.get((path, op), 0) + 1
            named[node.name] = (path, f"{op} #{seen[(path, op)]}")
    return named


# create_weight_matching logs an error for each quantized constant of the QDQ model that the float model has no
# initializer of, as normal models have: quantize_static quantizes a bias that several nodes share (the exporter
# merges equal initializers, such as an untrained model's LayerNorm biases) once per node, under a new name
# ('encoder.layers.0.norm1.bias0'). Such a copy just has no weight SQNR.
_UNMATCHED_WEIGHT = r"^Model Error in '[^']*': weight tensor '[^']*' not found!$"


def _weight_errors(qdq_loss_debug, float_path, qdq_path):
    """ONNX node name -> the SQNR of its quantized weight: its first quantized constant input (the weight, before the
    bias) whose float values are not all zero (no signal: an untrained bias)."""
    import numpy
    import onnx

    try:
        with quiet.dropped_logs("qdq_loss_debug", _UNMATCHED_WEIGHT):
            matched = qdq_loss_debug.create_weight_matching(str(float_path), str(qdq_path))
        errors = qdq_loss_debug.compute_weight_error(matched)
    except Exception:  # a debugging aid: the layer ranking does not need it
        return {}
    found = {}
    for node in onnx.load(str(float_path)).graph.node:
        for name in node.input:
            if name in errors and numpy.any(matched[name]["float"]) and math.isfinite(errors[name]):
                found[node.name] = round(min(float(errors[name]), metrics.SQNR_CEILING_DB), 2)  # exact: the ceiling
                break
    return found


def _quantized_nodes(qdq):
    """(node, its float inputs to feed, the output to read, the float model's name of that output, its inputs that
    stay float) for each node of a QDQ model whose activation inputs are quantized: the inputs are the tensors before
    their QuantizeLinear; the output, its DequantizeLinear's where the node's output is quantized. An input that no
    QuantizeLinear quantizes but a node computes (one of the nodes export kept float, such as an attention mask's)
    is fed the float model's value too, where it has one: the part cut out would otherwise reach back to the model's
    inputs."""
    producer = {output: node for node in qdq.graph.node for output in node.output}
    consumers = {}
    for node in qdq.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {init.name for init in qdq.graph.initializer}
    graph_inputs = {value.name for value in qdq.graph.input}
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.op_type in MOVES:
            continue
        feeds, unquantized = [], []
        for name in node.input:
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                if name in graph_inputs or (dq is not None and dq.op_type != "Constant"):
                    unquantized.append(name)
                continue
            q = producer.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in initializers:
                feeds.append(q.input[0])
        if not feeds or not node.output:
            continue
        output = node.output[0]
        original = output.removesuffix("_QuantizeLinear_Input")  # a graph output the quantizer renamed
        q = next((user for user in consumers.get(output, ()) if user.op_type == "QuantizeLinear"), None)
        if q is not None:
            dq = next((user for user in consumers.get(q.output[0], ()) if user.op_type == "DequantizeLinear"), None)
            if dq is not None:
                output = dq.output[0]
        yield node, list(dict.fromkeys(feeds)), output, original, tuple(dict.fromkeys(unquantized))


INTEGER_OPS = ("MatMulInteger", "ConvInteger")  # quantize_dynamic's, fed by DynamicQuantizeLinear
RECURRENT_INTEGER_OPS = ("DynamicQuantizeLSTM",)  # quantize_dynamic's LSTM (the TorchScript exporter's), fed float


def _integer_units(quantized, float_proto):
    """(the float model's node it replaces, its float inputs to feed, the output to read, that output's name in the
    float model) for each unit of a dynamically quantized model: an integer op (INTEGER_OPS) from the float tensors
    its DynamicQuantizeLinear nodes quantize, a Gather of an int8 table (an embedding) from its indices, or a
    DynamicQuantizeLSTM from its float sequence and initial states, each to the first tensor after it that the
    float model has too (quantize_dynamic gives the rescaled result the original output's name)."""
    from types import SimpleNamespace

    producer = {output: node for node in quantized.graph.node for output in node.output}
    consumers = {}
    for node in quantized.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {init.name: init for init in quantized.graph.initializer}
    made_by = {output: node for node in float_proto.graph.node for output in node.output}
    graph_inputs = {value.name for value in quantized.graph.input}
    for node in quantized.graph.node:
        if node.op_type in INTEGER_OPS:
            feeds = list(dict.fromkeys(producer[name].input[0] for name in node.input  # its value and zero point
                                       if name in producer and producer[name].op_type == "DynamicQuantizeLinear"))
        elif node.op_type == "Gather" and node.input and node.input[0] in initializers \
                and initializers[node.input[0]].data_type in (onnx_int8(), onnx_uint8()):
            feeds = [name for name in node.input[1:] if name not in initializers]
        elif node.op_type in RECURRENT_INTEGER_OPS:  # its float sequence and initial states, weights int8 inside
            feeds = [name for name in node.input if name and name not in initializers]
        else:
            continue
        output, seen = node.output[0], 0
        while output not in made_by and seen < 8:  # Cast, Mul (scales), Add (bias), DequantizeLinear
            following = consumers.get(output, [])
            if len(following) != 1:
                break
            output, seen = following[0].output[0], seen + 1
        if output not in made_by or not feeds or not all(f in made_by or f in graph_inputs for f in feeds):
            continue
        original = made_by[output]
        yield SimpleNamespace(name=original.name, op_type=original.op_type), feeds, output, output, ()


def onnx_int8():
    import onnx

    return onnx.TensorProto.INT8


def onnx_uint8():
    import onnx

    return onnx.TensorProto.UINT8


# --- the stage ------------------------------------------------------------------------------------------------------

ROUTES = {"eager": eager_layers, "pt2e": pt2e_layers, "onnx": onnx_layers}


def run(inputs, config, output):
    started = time.perf_counter()
    result = {"artifact_sha256": store.sha256_file(inputs["artifact"]) if "artifact" in inputs else None,
              "precision": config.precision, "layers": [], "compared": 0, "method": None}
    try:
        chunks, description = batches(config)
        if not chunks:
            raise MobileBuildError("no verification input at the example's sizes", field="verify.samples")
        with quiet.native_stderr(once=True):
            errors, method = ROUTES[config.route](inputs, config, chunks)
        ranked, uncompared = errors.results()
        result.update(layers=ranked[:config.top], compared=len(errors.found), method=method,
                      method_detail=METHODS[method], data=description,
                      samples=sum(len(chunk[0]) for chunk in chunks))
        if uncompared:  # no SQNR: said, not ranked
            result["not_compared"] = uncompared
    except Exception as exc:  # a diagnosis, not a verdict: what it cannot do is said, and the build goes on
        detail = exc.message if isinstance(exc, MobileBuildError) else f"{type(exc).__name__}: " \
                                                                        f"{modeling.first_line(exc)}"
        result["error"] = f"the per-layer comparison failed: {detail}"
    result["seconds"] = round(time.perf_counter() - started, 2)
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True, allow_nan=False)
    print(f"   {summary(result)}")


def summary(result):
    """One line: 'worst layers: features.3.conv (Conv2d) 8.1 dB, ...'."""
    if result.get("error"):
        return result["error"]
    shown = ", ".join(f"{row['name']} ({row['op']}) {row['sqnr_db']:.1f} dB" for row in result.get("layers", []))
    line = f"worst layers: {shown or 'none compared'} ({result.get('method')}, {result.get('seconds')} s)"
    uncompared = result.get("not_compared") or []
    if uncompared:
        line += "; no SQNR: " + "; ".join(f"{row['name']} ({row['op']}): {row['reason']}" for row in uncompared[:3])
        line += f"; {len(uncompared) - 3} more" if len(uncompared) > 3 else ""
    return line

"""pt2e: ExecuTorch int8. The stock executorch 1.3.1 wheel's runtime has no event tracer ("No etdump data found, try
rebuilding with the CMake option EXECUTORCH_ENABLE_EVENT_TRACER"), so ETDump and the Inspector's numeric gap cannot run
here; and inside an XNNPACK delegate the runtime shows no per-op outputs anyway. The quantization the lower stage runs
(ExecuTorch's export recipe: torch.export, its quantizer, prepare_pt2e, the same calibration batches, convert_pt2e) is
run again, and torchao's PT2E numeric debugger (prepare_for_propagation_comparison) logs each node of the float and the
quantized graph, matched by their source nodes (one call of a torch function: all the ATen nodes of an
F.multi_head_attention_forward are one); the quantized graph's loggers hand on the float graph's value, so each node
is fed float inputs (quantized where the int8 graph quantizes them)."""

import copy

import torch
from executorch.export.stages import QuantizeStage
from torchao.quantization.pt2e._numeric_debugger import OutputLogger, prepare_for_propagation_comparison
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.executorch.worker import lower, pte
from mobilebuild.worker import capture_root, progress, quiet
from mobilebuild.worker.layers.common import MOVES, Errors, exclusions
from mobilebuild.worker.stages import fuse, modeling

DETAIL = ("PT2E numeric debugger (torchao prepare_for_propagation_comparison) on the int8 graph the lower stage "
          "quantizes, each node fed the float graph's input; not ETDump: the stock executorch runtime is built "
          "without the event tracer")


def quantized_graphs(model, config):
    """(the float graph, the int8 graph) as the lower stage's export recipe makes them: the same quantizer, the same
    calibration batches (dynamic mode: the example input, which calibrates nothing), the same seed."""
    exclude = exclusions(model, {"exclude": config.exclude})
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


def compare(inputs, config, chunks):
    """The layers hook (see mobilebuild.worker.stages.layers): both graphs logged, each int8 node fed the float
    graph's input."""
    made = pte.read(inputs["artifact"]).record if "artifact" in inputs else None
    if made and made.get("quantizer") == lower.TORCHAO_INT8:  # not PT2E's graph: nothing here to compare it with
        raise MobileBuildError(f"the artifact is torchao's dynamic int8, which the lower stage used where PT2E failed "
                               f"({made['why']}); this comparison runs PT2E's quantizer", field="targets")
    progress.note("quantizing as the lower stage does")
    model = capture_root.nested(fuse.load(inputs["model"], config), len(config.inputs))
    reference, quantized = quantized_graphs(model, config)
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
    errors = Errors()
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
    return errors, "pt2e", DETAIL


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
    """[(module path, class name)] of a node's nn_module_stack, outermost first, the root (and a capture root's
    model) left out."""
    found = []
    for path, kind in (stack.values() if isinstance(stack, dict) else ()):
        path = path.removeprefix("L['self']").removeprefix(".")
        kind = kind if isinstance(kind, str) else \
            f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', kind)}"
        if path and path != capture_root.ROOT:
            found.append((path, kind))
    return found

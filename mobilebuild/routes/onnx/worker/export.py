"""onnx: the fused float model to ONNX (.onnx) for ONNX Runtime, in fp32 or int8.

How it exports (the exporters, dynamic dims, names, opsets) and quantizes (static QDQ, dynamic), and why:
docs/onnx.md.
"""

import ast
import io
import linecache
import logging
import re
import tempfile
import traceback
import warnings
from pathlib import Path

import onnx
import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import capture_root, outputs, progress, torch_export
from mobilebuild.worker.quiet import dropped_logs, native_stdout_dropped, quiet
from mobilebuild.worker.stages import calibration, exclusion, fuse, modeling

ONNX_SCOPES = "pkg.torch.onnx.name_scopes"  # torch.onnx's (dynamo) node metadata: the module paths around a node

MIN_OPSET = 18  # the exporter's own floor (torch.onnx's TORCHLIB_OPSET)
TORCHSCRIPT_OPSETS = (7, 20)  # the TorchScript exporter's (torch.onnx._constants), read from torch where it has them
TORCH = Path(torch.__file__).resolve().parent
STAGES = Path(__file__).resolve().parents[1]  # mobilebuild/worker: frames of ours (the examples' models are not)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_USER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in \w+\n\s+(?P<code>\S[^\n]*)')
_ATEN_TARGET = re.compile(r"target=torch\.ops\.([\w.]+?)(?:\.default)?\]")


def check_opset(opset, exporter=None):
    if opset is None:
        return
    if exporter == "torchscript":
        low, high = torchscript_opsets()
        if not low <= opset <= high:
            raise MobileBuildError(f"opset {opset} is out of range: the TorchScript exporter (onnx.exporter: "
                                   f"torchscript) writes opsets {low} to {high}", field="targets.onnx.opset")
        return
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise MobileBuildError(f"opset {opset} is out of range: torch.onnx.export writes opsets {MIN_OPSET} to "
                               f"{newest}", field="targets.onnx.opset")


def torchscript_opsets():
    try:
        from torch.onnx import _constants
        return _constants.ONNX_MIN_OPSET, _constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET
    except (ImportError, AttributeError):
        return TORCHSCRIPT_OPSETS


def output_names(model, examples, names=None):
    """The ONNX output names: the recipe's, checked against the model's output tensors, or their paths."""
    with torch.no_grad():
        found = [name for name, _ in outputs.leaves(model(*examples))]
    if names is None:
        return found
    if len(names) != len(found):
        raise MobileBuildError(f"{len(names)} names for {len(found)} output tensor(s) ({', '.join(found)})",
                               field="outputs")
    return list(names)


def export_float(model, specs, opset=None, names=None, exporter=None, notes=True):
    """The float model as an ONNX ModelProto, weights inside, the inputs' dynamic dims as dynamic axes, made by
    torch.onnx's dynamo exporter or (`exporter` "torchscript") its TorchScript one; `notes`: print what the
    TorchScript exporter's trace recorded for the example only (the shipped export does, its per-layer
    comparison's export again does not)."""
    check_opset(opset, exporter)
    examples = tuple(x.contiguous() for x in modeling.example_inputs(specs))  # ONNX tensors have no memory format
    model = model.eval()
    produced = output_names(model, examples, names)
    if exporter == "torchscript":
        return export_torchscript(model, examples, specs, opset, produced, notes)
    shapes = torch_export.dynamic_shapes(specs)
    # On failure torch.export prints the partial graphs it captured and logs warnings about symbolic shapes; the
    # one-line error made of the exception says what matters.
    with torch.no_grad(), quiet(logs=logging.WARNING, warnings=False):
        try:
            program = torch.onnx.export(model, examples, dynamo=True, opset_version=opset, verbose=False,
                                        input_names=[spec["name"] for spec in specs], output_names=produced,
                                        **({"dynamic_shapes": shapes} if shapes else {}))
        except Exception as exc:  # torch.export and the ONNX translation raise many types
            held = outputs.held_objects(model, examples)
            if held:  # the generic advice (control flow) does not fit
                raise MobileBuildError(torch_export.held_message(held, "torch.onnx.export", list(_causes(exc))[-1]),
                                       field="targets") from None
            raise export_error(exc) from None
    proto = program.model_proto
    check_dims_kept(proto, specs)
    found = opset_of(proto)
    if opset is not None and found != opset:
        raise MobileBuildError(f"torch.onnx.export could not convert the model to opset {opset} (it wrote {found})",
                               field="targets.onnx.opset")
    return proto


def check_dims_kept(proto, specs):
    """Where the model pins a dynamic dim (an LSTM's unrolled steps), the exporter writes the example's size without
    a word, and ONNX Runtime would refuse any other; say so here, in one line, naming the setting that keeps an
    LSTM's dim dynamic."""
    pinned = sorted({dim["dim"] for spec, value in zip(specs, proto.graph.input) for dim in spec.get("dynamic", ())
                     if value.type.tensor_type.shape.dim[dim["axis"]].HasField("dim_value")})
    if pinned:
        raise MobileBuildError(torch_export.pinned_message(", ".join(pinned), "torch.onnx.export", TORCHSCRIPT_ADVICE),
                               field="targets")


TORCHSCRIPT_ADVICE = ("or, for nn.LSTM/GRU, set the target's `onnx: {exporter: torchscript}`: the TorchScript exporter "
                      "keeps each one ONNX LSTM/GRU of any length (it traces the model; verify checks the dim's "
                      "smallest and largest sizes)")


def export_torchscript(model, examples, specs, opset, produced, notes=True):
    """The float model through the TorchScript-based exporter (torch.onnx.export(dynamo=False)): the recipe's dims as
    dynamic_axes, the same input and output names as the dynamo path, constant folding on. Of its warnings the
    build shows one line, the trace's about the model's code (traced_line); torch's go (its deprecation, nn.LSTM's
    trace of itself, the batch size of an LSTM's export), and the model's own were shown when output_names ran it."""
    axes = {spec["name"]: {dim["axis"]: dim["dim"] for dim in spec["dynamic"]} for spec in specs
            if spec.get("dynamic")}
    buffer = io.BytesIO()
    # it writes the TorchScript graph of a failed export to the native stdout (torch turns its ONNX log on for every
    # export, and leaves it on), and warns: deprecated, the trace, LSTM's batch size
    with torch.no_grad(), native_stdout_dropped(), quiet(logs=logging.WARNING, warnings=False), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.onnx.export(model, examples, buffer, dynamo=False, verbose=False, do_constant_folding=True,
                              input_names=[spec["name"] for spec in specs], output_names=produced,
                              **({"opset_version": opset} if opset is not None else {}),
                              **({"dynamic_axes": axes} if axes else {}))
        except Exception as exc:  # the tracer and the symbolic functions raise many types
            raise torchscript_error(exc) from None
    proto = record_scopes(onnx.load_from_string(buffer.getvalue()), model)
    line = traced_line(caught) if notes else None
    if line:
        print(f"   {line}")
    check_dims_kept(proto, specs)
    return proto


def record_scopes(proto, model):
    """Give each node the module paths around it, and their classes, as the dynamo exporter's metadata has them
    (ONNX_SCOPES, CLASSES), so that quantize.exclude, the kept-float line and the per-layer comparison
    find a node's module as they do there; `reproducible` removes them from the shipped file.

    The TorchScript exporter names a node after its scopes: "/layer2/layer2.0/downsample/downsample.0/Conv", a
    module by its attribute name, a container's child by the container's name and its index, a module called again
    with "_1" added. Where a name does not lead to the model's modules, the node keeps the scopes that did."""
    modules = dict(model.named_modules())
    for node in proto.graph.node:
        if not node.name.startswith("/"):
            continue
        paths, full, previous = [], "", None
        for segment in node.name.split("/")[1:-1]:
            candidate = (full + segment[len(previous):] if previous and segment.startswith(previous + ".")
                         else f"{full}.{segment}" if full else segment)
            if candidate not in modules:
                candidate = re.sub(r"_\d+$", "", candidate)
            if candidate not in modules:
                break
            paths.append(candidate)
            full, previous = candidate, segment
        del node.metadata_props[:]
        node.metadata_props.add(key=ONNX_SCOPES, value=repr(["", *paths, node.name]))
        node.metadata_props.add(key=CLASSES, value=repr([_class_name(model), *(_class_name(modules[path])
                                                                               for path in paths), node.op_type]))
    return proto


def _class_name(module):
    return f"{type(module).__module__}.{type(module).__qualname__}"


CLASSES = "pkg.torch.onnx.class_hierarchy"  # the dynamo exporter's: the classes of the modules around a node


def _outside(filename, *folders):
    try:
        path = Path(filename).resolve()
    except (OSError, ValueError):
        return False
    return not any(path.is_relative_to(folder) for folder in folders)


def traced_line(caught):
    """One line naming the places in the model's code (not torch's: nn.LSTM's own checks warn too) where the trace
    turned a tensor into a Python value, recording the example input's branch or size only; None where there are
    none."""
    places = {}
    for warning in caught:
        if issubclass(warning.category, torch.jit.TracerWarning) and _outside(warning.filename, TORCH):
            code = linecache.getline(warning.filename, warning.lineno).strip()
            place = f"{Path(warning.filename).name}:{warning.lineno}" + (f" `{code}`" if code else "")
            places.setdefault(place, None)
    if not places:
        return None
    return (f"traced (onnx.exporter: torchscript): the model's code turns a tensor into a Python value at "
            f"{', '.join(places)}; the export recorded the example input's outcome only (verify checks each dim's "
            "smallest, example and largest size)")


def torchscript_error(exc):
    """One line from the TorchScript exporter's error: the operation it has no translation for, or the error and
    where in the model's code it was raised."""
    from torch.onnx.errors import UnsupportedOperatorError

    detail = f"{type(exc).__name__}: {modeling.first_line(exc)}"
    if isinstance(exc, UnsupportedOperatorError):
        operator = re.search(r"operator '([^']+)'", str(exc))
        what = f" for {operator[1]}" if operator else ""
        return MobileBuildError(
            f"no ONNX translation{what} in the TorchScript exporter ({detail}); "
            "replace that operation in the model, try another opset, or choose a target whose runtime has it "
            "(executorch, pytorch-mobile)", field="targets")
    where = ""
    for cause in reversed(list(_causes(exc))):  # the innermost error that passed through the model's code
        frames = [frame for frame in traceback.extract_tb(cause.__traceback__)
                  if _outside(frame.filename, TORCH, STAGES)]
        if frames:
            frame = frames[-1]
            where = f" at {Path(frame.filename).name}:{frame.lineno}" + (f" `{frame.line.strip()}`" if frame.line
                                                                         else "")
            break
    return MobileBuildError(f"torch.onnx.export (onnx.exporter: torchscript) failed ({detail}){where}",
                            field="targets")


def opset_of(proto):
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def _causes(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def export_error(exc):
    """One line from the exporter's chain of errors: the innermost cause, where it comes from in the user's code,
    and what to do about it."""
    chain = list(_causes(exc))
    text = _ANSI.sub("", "\n".join(str(e) for e in chain))
    cause = chain[-1]
    detail = f"{type(cause).__name__}: {modeling.first_line(cause)}"
    frame = _USER_FRAME.search(text)
    where = f" at {Path(frame['file']).name}:{frame['line']} `{frame['code'].strip()}`" if frame else ""
    kind = type(exc).__name__
    if kind == "TorchExportError":
        return MobileBuildError(
            f"torch.export cannot capture the model ({detail}){where}; ONNX export needs forward free of Python "
            "control flow on tensor values and of non-tensor outputs (torch.cond expresses branches)",
            field="targets")
    if kind == "ConversionError":
        if not any(type(error).__name__ == "DispatchError" for error in chain):
            # its steps after the capture (decompositions, translating a node) failed, not for want of a translation
            return MobileBuildError(f"torch.onnx.export failed on the graph torch.export captured ({detail}){where}",
                                    field="targets")
        target = _ATEN_TARGET.search(text)
        operation = f" for {target[1]}" if target else ""
        return MobileBuildError(
            f"no ONNX translation{operation} ({detail}){where}; replace that operation in the model, or choose a "
            "target whose runtime has it (executorch, pytorch-mobile)", field="targets")
    return MobileBuildError(f"torch.onnx.export failed ({kind}: {modeling.first_line(exc)}){where}",
                            field="targets")


def reproducible(proto):
    """Remove the free-form text exporters attach: torch's node metadata holds stack traces with absolute source
    paths (of the model's code, of torch, of this package) and FX node dumps, which differ between checkouts."""
    graphs = list(_graphs(proto.graph))
    nodes = [node for graph in graphs for node in graph.node]
    nodes += [node for function in proto.functions for node in function.node]
    for item in (proto, *proto.functions, *graphs, *nodes):
        del item.metadata_props[:]
        item.doc_string = ""
    for graph in graphs:
        for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
            value.doc_string = ""
    return proto


def _graphs(graph):
    """A graph and the subgraphs of its If/Loop/Scan nodes."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for subgraph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _graphs(subgraph)


class _CalibrationReader:
    """calibration.batches as ONNX Runtime's CalibrationDataReader, feeding every input by name; a batch the exported
    model cannot take (a size other than a fixed one) is the calibration setting's fault."""

    def __init__(self, batches, specs, field):
        self.batches, self.specs, self.field, self.seen = iter(batches), specs, field, 0

    def get_next(self):
        batch = next(self.batches, None)
        if batch is None:
            return None
        tensors = modeling.as_inputs(batch, self.specs, self.field)
        self.seen += 1
        return {spec["name"]: t.detach().contiguous().numpy() for spec, t in zip(self.specs, tensors)}


class _Feeds:
    """Calibration feeds already read (a list), as a CalibrationDataReader that quantize_static can also walk in
    strides (CalibStridedMinMax): `__len__` and `set_range`."""

    def __init__(self, feeds):
        self.feeds, self.at, self.stop = feeds, 0, len(feeds)

    def get_next(self):
        if self.at >= self.stop:
            return None
        self.at += 1
        return self.feeds[self.at - 1]

    def __len__(self):
        return len(self.feeds)

    def set_range(self, start_index, end_index):
        self.at, self.stop = start_index, min(end_index, len(self.feeds))


HISTOGRAM_OBSERVERS = ("percentile",)  # ONNX Runtime's HistogramCalibrater: one array per tensor of all batches


def histogram_feeds(reader, field):
    """The batches of `reader` for a histogram-based calibration, with quantize_static's extra options for them.

    ONNX Runtime's HistogramCollector stacks what each tensor took in all the batches into one array (np.asarray of
    the list), so batches of different sizes (a dynamic dim at its example, smallest and largest size in turn, or a
    calibration function's sentences) raised ValueError "inhomogeneous shape". Then the batches are given one at a
    time (CalibStridedMinMax: 1, which quantize_static applies to every calibrator): each tensor's histogram grows
    batch by batch, as ONNX Runtime merges histograms anyway. Batches all of one shape are given as before, at once."""
    feeds = list(iter(reader.get_next, None))
    if not feeds:
        raise MobileBuildError("calibration produced no batches", field=field)
    shapes = {tuple((name, value.shape) for name, value in feed.items()) for feed in feeds}
    return _Feeds(feeds), ({"CalibStridedMinMax": 1} if len(shapes) > 1 else {})


def calibration_options(observer):
    """quantize_static's arguments for quantize.observer (plan.routes.ORT_OBSERVERS); none for its default."""
    from onnxruntime.quantization import CalibrationMethod

    if observer is None:
        return {}
    if observer == "moving_average":
        return {"calibrate_method": CalibrationMethod.MinMax, "extra_options": {"CalibMovingAverage": True}}
    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}
    return {"calibrate_method": methods[observer]}


def quantize_int8(proto, settings, specs, weights=None, exclude=(), observer=None):
    """Static QDQ quantization of the float ONNX model, calibrated on the recipe's batches (`settings`: its
    quantize.calibration), with the nodes of the modules at `exclude` (exclusion.resolve's paths) kept float.

    Calibration's ranges are kept (quantize_static's calibration cache): where a tensor's range is not finite (the
    0 / -inf additive mask nn.MultiheadAttention makes of a padding mask, and the masked scores), ONNX Runtime would
    quantize it with a scale of inf, and every value of it dequantizes to NaN. The nodes that make or take such
    tensors are then kept float (nodes_to_exclude), quantized again from the same ranges without calibrating again,
    and the build says which in one line. A model whose ranges are all finite is quantized once, as it always was."""
    from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_static

    if not settings:
        raise MobileBuildError("int8 ONNX export needs calibration batches", field="quantize.calibration")
    field = calibration.field(settings)
    reader = _CalibrationReader(calibration.batches(settings, specs), specs, field)
    excluded = excluded_nodes(proto, exclude) if exclude else []
    arguments = {"quant_format": QuantFormat.QDQ, "per_channel": weights != "per_tensor",
                 "activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8,
                 **calibration_options(observer)}
    feeds, calibrating = reader, arguments
    if observer in HISTOGRAM_OBSERVERS:
        feeds, strided = histogram_feeds(reader, field)
        if strided:
            calibrating = {**arguments, "extra_options": {**arguments.get("extra_options", {}), **strided}}
    with tempfile.TemporaryDirectory(prefix="mobilebuild-onnx-") as folder:
        prepared, quantized = Path(folder) / "prepared.onnx", Path(folder) / "quantized.onnx"
        ranges = Path(folder) / "ranges.json"
        quant_pre_process(proto, prepared, skip_optimization=True, skip_symbolic_shape=True)
        try:
            # its warnings are shown once its model is known to be the one kept; a 1-D weight (a layer norm's) is
            # quantized per tensor where per-channel asks for an axis it lacks, which it logs for each one
            with warnings.catch_warnings(record=True) as caught, \
                    dropped_logs("qdq_quantizer", r"^Axis -?\d+ is out-of-range for weight"):
                quantize_static(prepared, quantized, feeds, calibration_cache_path=ranges,
                                **({"nodes_to_exclude": excluded} if excluded else {}), **calibrating)
        except ValueError as exc:
            if not reader.seen:  # ONNX Runtime's "No data is collected."
                raise MobileBuildError("calibration produced no batches", field=field) from None
            if observer in HISTOGRAM_OBSERVERS and "is not finite" in str(exc):
                # a histogram cannot hold -inf: the mask's tensors fail before their ranges can be kept float
                raise MobileBuildError(
                    f"the {observer} observer cannot calibrate tensors whose values reach -inf or inf, as an "
                    "additive attention mask's do (ONNX Runtime: autodetected range is not finite): use observer "
                    "minmax, which keeps those nodes float", field="quantize.observer") from None
            raise
        unbounded = non_finite_ranges(ranges)
        floated = [node for node in onnx.load(prepared).graph.node if node.name not in excluded
                   and set(unbounded).intersection((*node.input, *node.output))] if unbounded else []
        if not floated:
            for warning in caught:
                warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
            return onnx.load(quantized)
        unbounded = {name: reach for name, reach in unbounded.items()
                     if any(name in (*node.input, *node.output) for node in floated)}
        # the same ranges, read back from the cache: no second calibration (its log lines were the first run's)
        with quiet(logs=logging.WARNING, output=False):
            quantize_static(prepared, quantized, None, calibration_cache_path=ranges,
                            nodes_to_exclude=excluded + [node.name for node in floated], **arguments)
        print(f"   {kept_float_line(floated, unbounded)}")
        return onnx.load(quantized)


def non_finite_ranges(path):
    """{tensor name: what its calibrated range reaches} for each tensor whose range (quantize_static's calibration
    cache at `path`) is not finite: "-inf", "inf" or "NaN"."""
    import numpy
    from onnxruntime.quantization.calibrate import load_tensors_data

    found = {}
    for name, data in load_tensors_data(path).items():
        try:
            low, high = (numpy.asarray(end, dtype=numpy.float64) for end in data.range_value)
        except AttributeError:  # a method that keeps no range
            continue
        reaches = [text for text, hit in (("-inf", numpy.isneginf(low).any() or numpy.isneginf(high).any()),
                                          ("inf", numpy.isposinf(low).any() or numpy.isposinf(high).any()),
                                          ("NaN", numpy.isnan(low).any() or numpy.isnan(high).any())) if hit]
        if reaches:
            found[name] = " and ".join(reaches)
    return found


def kept_float_line(nodes, tensors):
    """One line: the nodes kept float because their tensors' ranges are not finite (non_finite_ranges), by the
    module the exporter recorded for them."""
    by_module = {}
    for node in nodes:
        scopes = next((entry.value for entry in node.metadata_props if entry.key == ONNX_SCOPES), None)
        try:
            path = [scope for scope in ast.literal_eval(scopes)[:-1] if scope][-1] if scopes else None
        except (ValueError, SyntaxError, TypeError, IndexError):
            path = None
        by_module.setdefault(path or "no module", []).append(f"{node.op_type} {node.name}")
    reaches = sorted(set(tensors.values()))
    mask = ", as an additive attention mask does" if reaches == ["-inf"] else ""
    where = "; ".join(f"{path}: {', '.join(found)}" for path, found in by_module.items())
    return (f"kept float: {len(nodes)} ONNX node(s) making or taking tensors whose calibrated range reaches "
            f"{' or '.join(reaches)}{mask} ({', '.join(sorted(tensors))}): int8 would give them a scale of inf and "
            f"NaN values; {where}")


def quantize_dynamic_int8(proto, weights=None, exclude=()):
    """ONNX Runtime's dynamic quantization of the float ONNX model (int8 weights; activations quantized as it runs),
    with the nodes of the modules at `exclude` (exclusion.resolve's paths) kept float. Pre-processed as static mode's
    is (shape inference only)."""
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    names = excluded_nodes(proto, exclude)
    # quantize_dynamic first rewrites each Gemm as a MatMul named "<its name>_MatMul" (and an Add), then matches
    # nodes_to_exclude against the new names: an excluded Gemm (a Linear on 2-D input) was quantized all the same
    gemms = {node.name for node in proto.graph.node if node.op_type == "Gemm"}
    names += [f"{name}_MatMul" for name in names if name in gemms]
    kept = {"nodes_to_exclude": names} if names else {}
    with tempfile.TemporaryDirectory(prefix="mobilebuild-onnx-") as folder:
        prepared, quantized = Path(folder) / "prepared.onnx", Path(folder) / "quantized.onnx"
        quant_pre_process(proto, prepared, skip_optimization=True, skip_symbolic_shape=True)
        quantize_dynamic(prepared, quantized, per_channel=weights != "per_tensor", weight_type=QuantType.QInt8,
                         **kept)
        return onnx.load(quantized)


RECURRENT = ("LSTM", "GRU", "RNN")  # ONNX's recurrent ops, which the TorchScript exporter writes for nn.LSTM...


def float_recurrent_line(proto, mode, excluded=()):
    """One line naming the recurrent nodes an int8 model still runs in float (ONNX Runtime's quantize_static has no
    int8 form of any; quantize_dynamic quantizes LSTM only, as DynamicQuantizeLSTM), those the recipe keeps float
    left out; None where there are none."""
    found = {}
    for node in proto.graph.node:
        if node.op_type in RECURRENT and node.name not in excluded:
            found.setdefault(node.op_type, []).append(node.name)
    if not found:
        return None
    nodes = ", ".join(f"{len(names)} ONNX {op} node(s) ({', '.join(names)})" for op, names in found.items())
    tool = "quantize_dynamic" if mode == "dynamic" else "quantize_static"
    advice = ("; quantize.mode: dynamic quantizes LSTM (DynamicQuantizeLSTM, int8 weights)"
              if "LSTM" in found and mode != "dynamic" else "")
    return f"kept float: {nodes}: {tool} has no int8 form of them (the rest of the model is int8){advice}"


def run(inputs, config, output):
    model = capture_root.nested(fuse.load(inputs["model"], config), len(config.inputs))
    exclude = exclusion.resolve(model, config.exclude) if config.precision == "int8" else ()
    options = config.options or {}
    exporter = options.get("exporter")
    progress.note("torch.onnx.export" + (" (TorchScript exporter)" if exporter == "torchscript" else ""))
    proto = export_float(model, config.inputs, options.get("opset"), config.outputs, exporter)
    excluded = excluded_nodes(proto, exclude) if exclude else []
    if config.precision == "int8" and config.mode == "dynamic":
        progress.note("quantizing with ONNX Runtime's quantize_dynamic")
        proto = quantize_dynamic_int8(proto, config.weights, exclude)
    elif config.precision == "int8":
        progress.note("quantizing with ONNX Runtime's quantize_static")
        proto = quantize_int8(proto, config.calibration, config.inputs, config.weights, exclude, config.observer)
    line = float_recurrent_line(proto, config.mode, excluded) if config.precision == "int8" else None
    if line:
        print(f"   {line}")
    data = reproducible(proto).SerializeToString()
    with open(output, "wb") as handle:
        handle.write(data)


def excluded_nodes(proto, paths):
    """The names of the nodes torch.onnx.export made for the modules at `paths` (or inside them), from the module
    paths it records on each node."""
    if not paths:
        return []
    found = []
    for node in proto.graph.node:
        scopes = next((entry.value for entry in node.metadata_props if entry.key == ONNX_SCOPES), None)
        if scopes is None:
            continue
        try:
            inside = set(ast.literal_eval(scopes)[:-1])  # the last is the node's own name, not a module's
        except (ValueError, SyntaxError, TypeError):
            continue
        if inside.intersection(paths):
            found.append(node.name)
    return found

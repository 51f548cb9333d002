"""quantize: eager-mode quantization with the target engine's qconfig: static post-training (the performance
recipe, step 2) calibrated on random, image-folder or user-supplied batches; dynamic (no calibration); or the
conversion of a quantization-aware-trained checkpoint."""

import contextlib
import copy
import warnings

import torch
import torch.ao.nn.intrinsic as nni
from torch import nn
from torch.ao import quantization as tq
from torch.overrides import TorchFunctionMode

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import failures, quiet
from mobilebuild.worker.stages import calibration, exclusion, fuse, fx_quantize, modeling

GRAPH_MODE = "graph_mode"  # marks a stored state_dict of an FX graph-mode model
ENGINE_ERRORS = (b"Error in QNNPACK",)  # where an engine says why it refuses an operator
# Linear-ReLU too: the fuse stage has usually fused them, and a fused one is no longer an nn.Linear.
DYNAMIC_TYPES = (nn.Linear, nni.LinearReLU, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)
# quantize.observer: the activation observer, for eager and FX graph mode alike (plan.routes.TORCH_OBSERVERS)
OBSERVERS = {"histogram": tq.HistogramObserver, "minmax": tq.MinMaxObserver,
             "moving_average": tq.MovingAverageMinMaxObserver}


def use_engine(engine):
    if engine not in torch.backends.quantized.supported_engines:
        raise MobileBuildError(f"this torch build has no {engine!r} quantized engine "
                               f"(has: {', '.join(torch.backends.quantized.supported_engines)})", field="targets")
    torch.backends.quantized.engine = engine


def qconfig_for(engine, weights=None, qat=False, observer=None):
    """The engine's default (QAT) qconfig, with per-channel or per-tensor weights and the activation observer
    (quantize.observer) when the recipe asks."""
    base = tq.get_default_qat_qconfig(engine) if qat else tq.get_default_qconfig(engine)
    if weights is None and observer is None:
        return base
    weight, activation = base.weight, base.activation
    per_channel = weights == "per_channel"
    if weights is not None and qat:
        weight = tq.default_per_channel_weight_fake_quant if per_channel else tq.default_weight_fake_quant
    elif weights is not None:
        weight = tq.default_per_channel_weight_observer if per_channel else tq.default_weight_observer
    if observer is not None:  # as the engines' defaults do: the full range on qnnpack, 7 bits on x86 and fbgemm
        activation = OBSERVERS[observer].with_args(reduce_range=engine in ("x86", "fbgemm"))
    return tq.QConfig(activation=activation, weight=weight)


class DequantizedOutputs(tq.QuantWrapper):
    """QuantWrapper for a model that returns several tensors (a tuple, a dict, nested): each one is dequantized, where
    QuantWrapper's single DeQuantStub fails on the structure ("'tuple' object has no attribute 'dequantize'")."""

    def forward(self, x):
        return _map_tensors(self.dequant, self.module(self.quant(x)))


def _map_tensors(function, value):
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, dict):
        return {key: _map_tensors(function, item) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(function, item) for item in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(function, item) for item in value)
    return value


def has_own_stubs(model):
    """A model with a QuantStub of its own was written for eager-mode quantization."""
    return any(isinstance(m, tq.QuantStub) for m in model.modules())


def eager_stubs_fit(specs):
    """Eager mode's stubs wrap a forward of one float input (QuantWrapper); other models are quantized in FX graph
    mode, which puts a quantizer on each float input and lets integer ones (token ids) through."""
    return len(specs) == 1 and modeling.DTYPES[specs[0]["dtype"]].is_floating_point


def _with_stubs(model, specs=None):
    """The model with a float interface around a quantized core (the NNAPI post's "core" mode), unless it has stubs
    of its own. A model that returns several tensors (seen on the example input) gets each one dequantized."""
    if has_own_stubs(model):
        return model
    if specs is not None:
        if not eager_stubs_fit(specs):
            raise MobileBuildError(f"eager static quantization puts one quantizer on the model's input, and this model "
                                   f"takes {modeling.describe_inputs(specs)}: use quantize.mode: dynamic, which "
                                   "quantizes Linear and recurrent weights and leaves the inputs alone",
                                   field="quantize.mode")
        with torch.no_grad():
            if not isinstance(model(*modeling.example_inputs(specs)), torch.Tensor):
                return DequantizedOutputs(model)
    return tq.QuantWrapper(model)


def prepared(model, engine, qconfig, specs=None, exclude=()):
    """The model with stubs, `qconfig` and observers: ready to calibrate. The modules at `exclude`
    (exclusion.resolve's paths) stay float, each between stubs of its own."""
    use_engine(engine)
    model = _with_stubs(model.eval(), specs).eval()
    exclusion.islands(model.module if isinstance(model, tq.QuantWrapper) else model, exclude,
                      model if specs else None, modeling.example_inputs(specs) if specs and exclude else ())
    model.qconfig = qconfig
    for _, embedding in embeddings(model):
        embedding.qconfig = None
    return tq.prepare(model, inplace=True)


def embeddings(model):
    """[(path, module)] of the model's embeddings, which eager static int8 keeps float: eager mode quantizes an
    embedding's weights alone (float_qparams_weight_only_qconfig, and refuses any other qconfig), into a module
    that only looks rows up, while models also read an embedding's weight as a tensor (Whisper's encoder adds
    embed_positions.weight to its features)."""
    return [(path, module) for path, module in model.named_modules()
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag))]


def prepare_qat_model(model, engine, fuse_setting="auto", weights=None):
    """What a `quantize.mode: qat` checkpoint is trained from: the float model fused for QAT (batch norm kept, to
    be folded at conversion), stubbed, with the engine's QAT qconfig and fake quantization. Train it, then save
    its state_dict."""
    use_engine(engine)
    fused, _ = fuse.fuse(model, fuse_setting, qat=True)
    fused = _with_stubs(fused).train()
    fused.qconfig = qconfig_for(engine, weights, qat=True)
    return tq.prepare_qat(fused, inplace=True)


def static(model, engine, batches, weights=None, field="quantize.calibration", specs=None, exclude=(),
           observer=None):
    """Calibrate on `batches` and convert; `field` is the recipe setting the batches come from, `specs` the inputs
    whose example shows the model's output structure, `exclude` the paths of the modules kept float."""
    model = prepared(model, engine, qconfig_for(engine, weights, observer=observer), specs, exclude)
    calibration.calibrate(model, batches, field)
    return tq.convert(model, inplace=True)


def static_any(model, engine, make_batches, weights, field, specs, source_field="model", exclude=(), observer=None):
    """(quantized model, note): eager mode, as the performance recipe does (the note: the embeddings it keeps float),
    or where eager mode cannot quantize a model not written for it (`x + y`, SiLU, layer norm on quantized tensors:
    an operation without a quantized kernel; several inputs, or integer ones), FX graph mode; the note says so, and
    which operations stay float.
    `make_batches()` gives the calibration batches afresh: eager mode may have used them up. `exclude`: the paths
    of the modules kept float (exclusion.resolve), `observer`: quantize.observer."""
    use_engine(engine)  # FX graph mode converts and checks on the engine too
    written_for_eager = has_own_stubs(model)
    if written_for_eager or eager_stubs_fit(specs):
        eager = static(model if written_for_eager else copy.deepcopy(model), engine, make_batches(), weights, field,
                       specs, exclude, observer)
        try:
            check_runs(eager, specs, engine, field=source_field)
            kept = embeddings(model)
            return eager, (f"note: eager static int8 keeps embeddings float: {few([path for path, _ in kept])} (its "
                           "int8 embeddings only look rows up, and take weight-only int8 alone)" if kept else None)
        except MobileBuildError as eager_failure:
            if written_for_eager:
                raise
            reason = eager_failure.message.split(": an operation")[0].removeprefix("the quantized model fails on the ")
            reason = f"fails on the {reason}"
    else:
        reason = f"its stubs take one float input, and the model takes {modeling.describe_inputs(specs)}"
    granularity = fx_quantize.weights(weights)
    qconfig = qconfig_for(engine, granularity, observer=observer)
    try:
        quantized = fx_quantize.static(model, engine, make_batches(), specs, qconfig, field, exclude)
    except fx_quantize.Untraceable as untraceable:
        raise fx_quantize.Untraceable(f"eager mode cannot quantize it ({reason}), and {untraceable.reason}",
                                      untraceable.control_flow) from None
    check_runs(quantized, specs, engine, field=source_field)
    kept = fx_quantize.kept_float(quantized)
    floats = ", ".join(f"{name} x{count}" for name, count in sorted(kept.items())) or "none"
    return quantized, f"eager mode cannot quantize it ({reason}): quantized in FX graph mode, weights " \
                      f"{granularity.replace('_', '-')}; operations kept float: {floats}"


def dynamic(model, engine, weights=None, exclude=()):
    """Weights of Linear and recurrent layers to int8, activations quantized on the fly: no calibration. The modules
    at `exclude` (and all they hold) keep float weights."""
    use_engine(engine)
    qconfig = tq.per_channel_dynamic_qconfig if weights == "per_channel" else tq.default_dynamic_qconfig
    spec = {kind: qconfig for kind in DYNAMIC_TYPES} | {path: None for path in exclude}  # a name overrides a type
    return tq.quantize_dynamic(model.eval(), spec, inplace=True)


def from_qat(source, trained_path, engine, fuse_setting, weights=None):
    model = prepare_qat_model(modeling.build_model(source, seed=0), engine, fuse_setting, weights)
    modeling.load_weights(model, trained_path, field="quantize.checkpoint")
    return tq.convert(model.eval(), inplace=True)


def load_quantized(inputs, config, saved=None):
    """Quantized eager modules do not survive pickling, so the quantize stage stores a state_dict; the module
    structure is rebuilt from the fused model the same way, then the quantized weights are loaded into it. Both
    files are read weights-only; `saved`: the stored state, where the caller has read it already."""
    engine, quantization, specs = config.engine, config.quantization, config.inputs
    fused = fuse.load(inputs["model"], config)
    exclude = exclusion.resolve(fused, quantization.get("exclude"))
    if saved is None:
        saved = modeling.load_weights_only(inputs["quantized"], field=None)
    if quantization["mode"] == "dynamic" or saved.get("mode") == "dynamic":  # the weights alone: recomputed exactly
        return dynamic(fused, engine, quantization["weights"], exclude).eval()
    # Static and QAT both convert to the same quantized modules. The observers' values are replaced by the stored
    # ones: the cheapest observer gives the same structure, where the engine's HistogramObserver would spend its
    # parameter search on nothing (timm's mobileone_s0 in FX graph mode: 281 s of a 30 s rebuild)
    graph_mode = isinstance(saved, dict) and saved.get(GRAPH_MODE) == "fx"
    weights = fx_quantize.weights(quantization["weights"]) if graph_mode else quantization["weights"]
    skeleton = tq.QConfig(activation=tq.MinMaxObserver.with_args(dtype=torch.quint8),
                          weight=qconfig_for(engine, weights).weight)
    if graph_mode:
        model = fx_quantize.rebuild(fused, engine, specs, skeleton, exclude)
        return fx_quantize.load_state(model, saved, inputs["quantized"]).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # converting uncalibrated observers warns
        model = tq.convert(prepared(fused, engine, skeleton, specs, exclude), inplace=True)
    model.load_state_dict(saved)
    return model.eval()


def made_otherwise(saved):
    """How the quantize stage's model, whose stored state is `saved`, was made where not as the recipe asked
    ({"int8": "dynamic", "asked": "static", "why": ...}: dynamic_instead), or None."""
    return saved.get("made") if saved.get("mode") == "dynamic" else None


class _FailingCall(TorchFunctionMode):
    """Notes the torch function that raised: a quantized model's own error ("empty_strided not supported on
    quantized tensors yet") seldom names the operation at fault."""

    def __init__(self):
        super().__init__()
        self.failed = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except Exception:
            self.failed = self.failed or func
            raise


def _call_name(func):
    if isinstance(func, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):  # torch.ops.quantized.add
        return f"torch.ops.{func._qualified_op_name.replace('::', '.')}"
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    if "." in name:
        return name.replace("TensorBase.", "Tensor.")
    return f"{getattr(func, '__module__', None) or 'torch'}.{name}"


def check_runs(model, specs, engine, field):
    """Eager conversion accepts operations that have no quantized kernel (`x + y` on two quantized tensors, without
    FloatFunctional); they would fail only later, when the model is traced or verified, or on the phone. Run the
    example inputs once here, so the failure names this stage and the operation."""
    said = []  # the engine's own reason, which its exception leaves out (the second run's is the same)

    def forward(watcher=contextlib.nullcontext()):
        with torch.no_grad(), watcher, quiet.native_stderr(kept=said, kept_prefix=ENGINE_ERRORS, once=True), \
                quiet.fx_reports_dropped():
            model(*modeling.example_inputs(specs))

    try:
        forward()
    except Exception as exc:
        detail = modeling.first_line(exc).split(". ")[0]
        watcher = _FailingCall()
        try:
            forward(watcher)  # again, only to find the operation: a TorchFunctionMode slows every call
        except Exception:
            pass
        if said:  # the engine's own reason ("scale ratio must be in [2**-14, 2**8) range"): its limit, not a gap
            reason = said[0].strip().removeprefix("Error in QNNPACK: ")
            where = f" in {_call_name(watcher.failed)}" if watcher.failed is not None else ""
            raise MobileBuildError(f"the quantized model fails on the {engine} engine{where}: {reason}"
                                   f"{_keep_float_advice(failures.model_part(exc.__traceback__))}",
                                   field=field) from None
        if watcher.failed is None:
            raise MobileBuildError(f"the quantized model fails on the {engine} engine: {detail}",
                                   field=field) from None
        raise MobileBuildError(
            f"the quantized model fails on the {engine} engine in {_call_name(watcher.failed)} ({detail}): an "
            "operation on quantized tensors without a quantized kernel; use torch.ao.nn.quantized.FloatFunctional "
            "for +, * and cat, or a DeQuantStub before it", field=field) from None


def _keep_float_advice(part):
    """What to keep float where the engine refuses a module's operation: the module holding it, since FX graph mode
    still feeds a module kept float alone its quantized input (timm's EfficientFormerV2: QNNPACK refuses its query's
    1x1 average pooling; the pooling float fails the same, the whole query float runs)."""
    if part is None:
        return ""
    path = part.split(" (")[0]
    holder = path.rpartition(".")[0] or path
    return f" (at {part}); keep the module holding it float (quantize.exclude: [{holder}]) or use another target"


def stored_state(quantized, engine, field):
    """The quantized model's state_dict; packed weights an engine cannot unpack (QNNPACK packs 2-D convolutions only:
    a Conv3d runs, and its weights cannot be read back) are the engine's limit, said in one line."""
    try:
        return quantized.state_dict()
    except RuntimeError as exc:
        kinds = sorted({type(m).__name__ for m in quantized.modules() if type(m).__name__.endswith("3d")})
        which = f" ({', '.join(kinds)})" if kinds else ""
        raise MobileBuildError(f"the {engine} engine cannot store the quantized model's weights{which}: "
                               f"{modeling.first_line(exc)}; keep this model on fp32 targets for {engine}",
                               field=field) from None


def dynamic_instead(model, engine, weights, exclude, untraceable):
    """(dynamic int8 of `model`, the note saying why) where static int8 cannot trace it (`untraceable`, FX graph
    mode's failure) and it has layers dynamic int8 quantizes (Linear, recurrent: a Transformer's); else the failure,
    as it was. The stored state says so (made_otherwise), and the artifact's record after it."""
    if not any(isinstance(module, DYNAMIC_TYPES) for module in model.modules()):
        raise untraceable
    note = (f"note: {untraceable.reason}: quantized dynamically instead (int8 weights of its Linear and recurrent "
            "layers, activations quantized as it runs; no calibration)")
    return dynamic(model, engine, weights, exclude), note


def run(inputs, config, output):
    engine, weights, mode = config.engine, config.weights, config.mode
    source_field = modeling.source_field(config.model)
    note = made = None
    if mode != "qat":
        fused = fuse.load(inputs["model"], config)
        exclude = exclusion.resolve(fused, config.exclude)  # before calibrating: a wrong name fails at once
    if mode == "static":
        try:
            quantized, note = static_any(fused, engine, lambda: calibration.batches(config.calibration,
                                                                                     config.inputs),
                                         weights, calibration.field(config.calibration), config.inputs, source_field,
                                         exclude, config.observer)
        except fx_quantize.Untraceable as untraceable:
            (quantized, note), mode = dynamic_instead(fused, engine, weights, exclude, untraceable), "dynamic"
            made = {"int8": "dynamic", "asked": "static", "why": untraceable.reason}
    elif mode == "dynamic":
        quantized = dynamic(fused, engine, weights, exclude)
    else:
        quantized = from_qat(config.model, inputs["trained"], engine, config.fuse, weights)
    if mode != "static":  # static_any has run it
        check_runs(quantized, config.inputs, engine, field=source_field)
    if note:
        print(f"   {note}")
    if mode == "dynamic":
        # Recurrent layers' packed weights pickle as TorchScript objects, which no weights-only load accepts; the
        # stages after this one recompute dynamic quantization from the fused weights (see load_quantized).
        state = {"mode": "dynamic", **({"made": made} if made else {})}
    else:
        state = stored_state(quantized, engine, source_field)
    if isinstance(quantized, torch.fx.GraphModule):
        # load_quantized rebuilds it with FX, not eager mode; packed weights are stored as their tensors
        state = {GRAPH_MODE: "fx", **fx_quantize.storable(state)}
    modeling.save(state, output)

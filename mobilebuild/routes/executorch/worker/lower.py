"""lower: the fused eager model as an ExecuTorch program (.pte) for one delegate: XNNPACK (CPU), Vulkan (GPU),
Core ML or MPS (Apple).

How it goes through ExecuTorch's export recipes, quantizes, keeps dynamic dims and lays inputs out, the torchao
fallback and the delegates' options: docs/executorch.md.
"""

import dataclasses
import re

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.executorch.plan import BACKEND_NAMES, undelegated_message
from mobilebuild.routes.executorch.worker import pte
from mobilebuild.routes.executorch.worker import runtime as et_runtime
from mobilebuild.routes.executorch.worker.coreml import reproducible_coreml
from mobilebuild.routes.executorch.worker.setup import ensure_flatc, softmax_in_nchw
from mobilebuild.worker import capture_root, outputs, progress, torch_export
from mobilebuild.worker.quiet import quiet
from mobilebuild.worker.stages import calibration, exclusion, fuse, modeling

DELEGATES = ("xnnpack", "vulkan", "coreml", "mps")
PRECISIONS = ("fp32", "int8")
INT8_DELEGATES = ("xnnpack", "coreml")
OPTION_CHOICES = {
    "xnnpack": {},
    "coreml": {"compute_units": ("all", "cpu_and_gpu", "cpu_and_ne", "cpu_only"),
               "compute_precision": ("fp16", "fp32")},
    "vulkan": {"compute_precision": ("fp32", "fp16")},
    "mps": {"compute_precision": ("fp16", "fp32")},
}


# --- options and recipes ---------------------------------------------------------------------------------------

def check_options(delegate, precision, options, weights=None, mode="static"):
    if delegate not in DELEGATES:
        raise MobileBuildError(f"unknown ExecuTorch delegate {delegate!r} (one of {', '.join(DELEGATES)})",
                               field="targets")
    if precision not in PRECISIONS:
        raise MobileBuildError(f"unknown precision {precision!r} (one of {', '.join(PRECISIONS)})", field="targets")
    if precision == "int8" and delegate not in INT8_DELEGATES:
        raise MobileBuildError(f"int8 lowering is supported for {' and '.join(INT8_DELEGATES)}, not {delegate}; "
                               "use fp32 (optionally compute_precision: fp16) for it", field="targets")
    choices = OPTION_CHOICES[delegate]
    for key, value in (options or {}).items():
        if key not in choices:
            known = ", ".join(choices) or "none"
            raise MobileBuildError(f"{delegate} has no option {key!r} (options: {known})", field="targets")
        if value not in choices[key]:
            raise MobileBuildError(f"{delegate} option {key}: {value!r} is not one of {', '.join(choices[key])}",
                                   field="targets")
    if precision == "int8" and delegate == "coreml" and weights == "per_tensor":
        raise MobileBuildError("Core ML's int8 recipe quantizes weights per channel only", field="quantize.weights")
    if precision == "int8" and mode == "dynamic" and delegate != "xnnpack":
        raise MobileBuildError(f"{BACKEND_NAMES[delegate]}'s int8 recipe is static (calibrated): mode 'dynamic' is "
                               "XNNPACK's", field="quantize.mode")
    if precision == "int8" and mode == "dynamic" and weights == "per_tensor":
        raise MobileBuildError("ExecuTorch's dynamic int8 recipe (XNNPACK) quantizes weights per channel only: "
                               "XNNPACK takes no dynamically quantized Linear with per-tensor weights (its "
                               "quantize ops stay outside the delegate, without a kernel); leave weights out",
                               field="quantize.weights")
    if precision == "int8" and "compute_precision" in (options or {}):
        raise MobileBuildError(f"{delegate} option compute_precision applies to fp32 lowering only",
                               field="targets")


def export_recipe(delegate, precision, options, weights=None, exclude=(), observer=None, mode="static"):
    """ExecuTorch's ExportRecipe for the delegate: the registry's where ExecuTorch has one. `weights`: the recipe's
    quantize.weights ("per_tensor" picks XNNPACK's per-tensor recipe; per-channel otherwise); `exclude` (module
    paths kept float) and `observer` (quantize.observer) adjust XNNPACK's int8 recipe; `mode` "dynamic" (quantize.mode)
    picks XNNPACK's dynamic int8 recipe."""
    from executorch.export import ExportRecipe, LoweringRecipe

    options = options or {}
    if delegate == "xnnpack":
        from executorch.backends.xnnpack.recipes import XNNPackRecipeType

        if precision == "fp32":
            kind = XNNPackRecipeType.FP32
        elif mode == "dynamic":
            kind = XNNPackRecipeType.PT2E_INT8_DYNAMIC_PER_CHANNEL
        elif weights == "per_tensor":
            kind = XNNPackRecipeType.PT2E_INT8_STATIC_PER_TENSOR
        else:
            kind = XNNPackRecipeType.PT2E_INT8_STATIC_PER_CHANNEL
        recipe = ExportRecipe.get_recipe(kind)
        if precision == "int8" and (exclude or observer):
            _adjust_xnnpack_int8(recipe, weights, exclude, observer)
        return recipe
    if delegate == "coreml":
        import coremltools as ct
        from executorch.backends.apple.coreml.recipes import CoreMLRecipeType

        units = {"all": ct.ComputeUnit.ALL, "cpu_and_gpu": ct.ComputeUnit.CPU_AND_GPU,
                 "cpu_and_ne": ct.ComputeUnit.CPU_AND_NE, "cpu_only": ct.ComputeUnit.CPU_ONLY}
        if precision == "int8":
            kind = CoreMLRecipeType.PT2E_INT8_STATIC
        else:
            kind = CoreMLRecipeType.FP32 if options.get("compute_precision") == "fp32" else CoreMLRecipeType.FP16
        return ExportRecipe.get_recipe(kind, compute_unit=units[options.get("compute_units", "all")])
    if delegate == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

        fp16 = options.get("compute_precision") == "fp16"
        partitioner = VulkanPartitioner({"force_fp16": True} if fp16 else None)
    else:
        from executorch.backends.apple.mps.partition import MPSPartitioner
        from executorch.exir.backend.compile_spec_schema import CompileSpec

        fp16 = options.get("compute_precision", "fp16") == "fp16"
        partitioner = MPSPartitioner([CompileSpec("use_fp16", bytes([fp16]))])
    return ExportRecipe(name=f"{delegate}_{precision}", lowering_recipe=LoweringRecipe(partitioners=[partitioner]))


PT2E_OBSERVERS = ("histogram", "minmax", "moving_average")  # plan.routes.TORCH_OBSERVERS, from torchao's pt2e


def _adjust_xnnpack_int8(recipe, weights, exclude, observer):
    """XNNPACK's int8 export recipe with its quantizer's activation observer replaced and the modules at `exclude`
    left unannotated (float)."""
    import dataclasses

    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config
    from torchao.quantization.pt2e import HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver
    from torchao.quantization.pt2e.quantizer.utils import get_module_name_filter

    (quantizer,) = recipe.quantization_recipe.quantizers
    if observer is not None:  # static only (plan.chain.Chain.quantize_options): dynamic mode observes no activations
        kind = dict(zip(PT2E_OBSERVERS, (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver)))[observer]
        config = get_symmetric_quantization_config(is_per_channel=weights != "per_tensor")
        activation = dataclasses.replace(config.input_activation,
                                         observer_or_fake_quant_ctr=kind.with_args(eps=2**-12))  # as the default's
        quantizer.set_global(dataclasses.replace(config, input_activation=activation, output_activation=activation))
    if exclude:
        inside = [get_module_name_filter(path) for path in exclude]
        quantizer.set_filter_function(lambda node: not any(found(node) for found in inside))


# --- calibration ---------------------------------------------------------------------------------------------

def in_layout(tensors):
    """The layout a program is exported for: NCHW (see the module's docstring)."""
    return tuple(tensor.contiguous() for tensor in tensors)


def calibration_samples(settings, specs):
    """The recipe's calibration batches as ExecuTorch's example inputs (tuples), in the layout the program is
    exported for (NCHW: contiguous). Of a model with dynamic dims, only the batches at the example sizes calibrate:
    PT2E runs them through the graph it captured at those sizes."""
    return calibration.at_example_sizes(settings, specs, "ExecuTorch's int8 calibration needs")


# --- lowering ----------------------------------------------------------------------------------------------

EXPORT_ADVICE = ("ExecuTorch needs one static graph: replace Python control flow on tensor values with torch.cond or "
                 "torch.where, or make it depend on shapes only")


def _export_error(exc):
    return type(exc).__module__.startswith(("torch._dynamo", "torch.export", "torch._export",
                                            "torch.fx.experimental"))


def _root_cause(exc):
    seen = {id(exc)}
    while (exc.__cause__ or exc.__context__) is not None and id(exc.__cause__ or exc.__context__) not in seen:
        exc = exc.__cause__ or exc.__context__
        seen.add(id(exc))
    return exc


def _detail(exc):
    """The error's first line, and the one that started it: a failed pass says only which pass failed."""
    root = _root_cause(exc)
    if root is exc:
        return modeling.first_line(exc)
    return f"{modeling.first_line(exc)} ({type(root).__name__}: {modeling.first_line(root)})"


CONSTRAINTS = re.compile(r"Constraints violated \(([^)]*)\)")
MISSING_OUT_VARIANTS = re.compile(r"Missing out variants: \{([^}]*)\}")


def pinned_dims(exc):
    """The dynamic dims torch.export found the model fixes ("Constraints violated (seq)"), or None."""
    found = CONSTRAINTS.search(str(exc)) or CONSTRAINTS.search(str(_root_cause(exc)))
    return found[1] if found else None


def failure_message(stage_type, delegate, exc):
    from executorch.export import StageType

    detail, pinned = _detail(exc), pinned_dims(exc)
    if pinned:
        return torch_export.pinned_message(pinned, "torch.export")
    if stage_type == StageType.TORCH_EXPORT or (stage_type == StageType.QUANTIZE and _export_error(exc)):
        return f"torch.export cannot capture the model ({detail}); {EXPORT_ADVICE}"
    if stage_type == StageType.QUANTIZE:
        return f"int8 quantization (PT2E) failed: {detail}"
    if stage_type == StageType.TO_EDGE_TRANSFORM_AND_LOWER:
        return f"lowering to {BACKEND_NAMES[delegate]} failed: {type(exc).__name__}: {detail}"
    missing = MISSING_OUT_VARIANTS.search(str(exc))
    if missing:  # seen: the XNNPACK quantizer quantized 3-D convolutions, which the delegate then did not take
        return (f"ExecuTorch has no kernel for {missing[1]}, left outside {BACKEND_NAMES[delegate]} (the delegate did "
                f"not take an operator the quantizer quantized): build this target in fp32")
    return f"ExecuTorch could not build the program: {type(exc).__name__}: {detail}"


def lower_to_bytes(model, specs, delegate, precision="fp32", options=None, samples=None, weights=None, exclude=(),
                   observer=None, mode="static"):
    """The .pte bytes of `model` lowered for `delegate`. `samples`: example inputs as tuples, the first one
    exported, all of them calibrating static int8 (default: the inputs' example); `exclude`: the paths of modules
    int8 keeps float (exclusion.resolve); `observer`: quantize.observer; `mode`: quantize.mode, static or dynamic.
    Raises MobileBuildError for settings and models that cannot be lowered, ImportError when the delegate's own
    dependency is missing."""
    check_options(delegate, precision, options, weights, mode)
    ensure_flatc()
    softmax_in_nchw()
    samples = samples or [in_layout(modeling.example_inputs(specs))]
    # static int8: the export recipe's quantize stage captures the graph at the example's sizes, which then stay fixed
    # (plan.routes.ET_INT8_FIXED); asked to keep them dynamic, torch.export finds them pinned. Dynamic int8 keeps
    # them: its quantization runs here, on a graph captured with them (quantized_with_dims)
    dynamic = precision == "int8" and mode == "dynamic"
    shapes = torch_export.dynamic_shapes(specs) if precision == "fp32" or dynamic else None
    with quiet():
        torch.manual_seed(0)
        recipe = export_recipe(delegate, precision, options, weights, exclude, observer, mode)
        model = model.eval()
        try:
            if dynamic and shapes:
                model = quantized_with_dims(model, samples[0], recipe, shapes, delegate)
                recipe = dataclasses.replace(recipe, quantization_recipe=None)
            return _exported(model, samples, recipe, shapes, delegate, precision, mode)
        except PT2EFailed as failed:
            why = failed.message
        if delegate != "xnnpack":
            raise MobileBuildError(why, field="targets")
        if exclude or observer:  # torchao's path has neither knob
            raise MobileBuildError(f"{why}; torchao's dynamic int8 would quantize it, but takes no quantize.exclude "
                                   "or quantize.observer: leave them out", field="targets")
        data = _torchao_int8(model, samples[0], shapes, mode, why)
    static = "" if mode == "dynamic" else "; no calibration: the recipe asked for static int8"
    print(f"   note: {why}: quantized by torchao instead ({TORCHAO_INT8}{static})")
    return data


class PT2EFailed(MobileBuildError):
    """PT2E quantization failed where torch.export did not: the model exports, its quantized graph does not run
    (transformers' mask code indexes with a float constant after prepare_pt2e)."""


def _exported(model, samples, recipe, shapes, delegate, precision, mode, record=None):
    """The .pte bytes of ExecuTorch's export session on `model`; `record` (a dict), where given, travels in the
    program as a constant method (pte.RECORD_METHOD) that verify reads back."""
    import json

    from executorch.export import ExportSession, StageType

    session = ExportSession(model=model, example_inputs=samples, export_recipe=recipe,
                            **({"dynamic_shapes": {"forward": shapes}} if shapes else {}),
                            **({"constant_methods": {pte.RECORD_METHOD: json.dumps(record, sort_keys=True)}}
                               if record else {}))
    _announce_stages(session, delegate, precision, len(samples), mode)
    try:
        with torch.no_grad(), reproducible_coreml(delegate):
            session.export()
    except MobileBuildError:
        raise
    except Exception as exc:  # torch.export, quantizers and partitioners raise anything
        done = session.get_stage_artifacts()
        failed = next((s for s in session.get_all_registered_stages() if s not in done), None)
        message = failure_message(failed, delegate, exc)
        held = outputs.held_objects(model, samples[0])
        if held:  # the generic advice (control flow) does not fit
            raise MobileBuildError(torch_export.held_message(held, "ExecuTorch's lowering", _root_cause(exc)),
                                   field="targets") from None
        if failed == StageType.QUANTIZE and not _export_error(exc) and not pinned_dims(exc):
            raise PT2EFailed(message, field="targets") from None
        raise MobileBuildError(message, field="targets") from None
    return session.get_pte_buffer()


TORCHAO_INT8 = ("torchao Int8DynamicActivationIntxWeightConfig: int8 weights per output channel, activations "
                "quantized per token as the program runs")


def _torchao_int8(model, example, shapes, mode, why):
    """Dynamic int8 from torchao's quantize_ (its Linear layers: int8 weights per channel, activations quantized
    as it runs), exported and lowered for XNNPACK, where PT2E failed (`why`): it quantizes the modules, not a
    captured graph, so the model's own index and mask code stays as it was. Takes the dims `shapes` keeps."""
    import copy

    from executorch.backends.xnnpack.recipes import XNNPackRecipeType
    from executorch.export import ExportRecipe
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    progress.note("quantizing with torchao instead (dynamic int8)")
    quantized = copy.deepcopy(model)
    try:
        quantize_(quantized, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8,
                                                                    weight_granularity=PerAxis(0)))
    except Exception as exc:  # torchao raises anything
        raise MobileBuildError(f"{why}; torchao's dynamic int8, its fallback, failed too: "
                               f"{modeling.first_line(exc)}", field="targets") from None
    record = {"int8": "dynamic", "asked": mode, "quantizer": TORCHAO_INT8, "why": why}
    try:
        return _exported(quantized, [example], ExportRecipe.get_recipe(XNNPackRecipeType.FP32), shapes, "xnnpack",
                         "fp32", "dynamic", record)
    except MobileBuildError as exc:
        raise MobileBuildError(f"{why}; torchao's dynamic int8, its fallback, failed too: {exc.message}",
                               field="targets") from None


def quantized_with_dims(model, example, recipe, shapes, delegate):
    """`model` quantized by the export recipe's own quantizer as its quantize stage does (torch.export, prepare_pt2e,
    the example through it, convert_pt2e), but on a graph captured with the dynamic dims, which that stage does not
    pass on: dynamic int8 observes no activations, so nothing ties the graph to the example's sizes."""
    from executorch.export import StageType
    from executorch.export.stages import QuantizeStage
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    progress.note("quantizing (dynamic: int8 weights, activations quantized as it runs)")
    quantizer = QuantizeStage(recipe.quantization_recipe)._get_quantizer_for_prepare_pt2e(
        recipe.quantization_recipe.quantizers)
    try:
        with torch.no_grad():  # as the export session runs its stages
            captured = torch.export.export(model, example, dynamic_shapes=shapes, strict=True).module()
    except Exception as exc:  # torch.export raises anything
        raise MobileBuildError(failure_message(StageType.QUANTIZE, delegate, exc), field="targets") from None
    try:
        with torch.no_grad():
            prepared = prepare_pt2e(captured, quantizer)
            prepared(*example)
            return convert_pt2e(prepared)
    except Exception as exc:  # the quantizer, or the graph it prepared, raise anything
        raise PT2EFailed(failure_message(StageType.QUANTIZE, delegate, exc), field="targets") from None


def _announce_stages(session, delegate, precision, batches, mode="static"):
    """A progress note as each of ExecuTorch's export stages that does work starts (an int8 MobileNetV2 takes half a
    minute)."""
    words = {"torch_export": "torch.export", "to_edge_transform_and_lower": f"lowering to {BACKEND_NAMES[delegate]}",
             "to_executorch": "writing the ExecuTorch program"}
    if precision == "int8" and mode == "dynamic":
        words["quantize"] = "quantizing (dynamic: int8 weights, activations quantized as it runs)"
    elif precision == "int8":
        words["quantize"] = f"quantizing, calibrated on {batches} batch{'es' if batches > 1 else ''}"
    for kind, stage in session.get_all_registered_stages().items():
        if kind.value in words:
            def announced(artifact, _run=stage.run, _text=words[kind.value]):
                progress.note(_text)
                return _run(artifact)

            stage.run = announced


# --- delegation summary ------------------------------------------------------------------------------------------

def preflight_delegation(model, specs, delegate, precision="fp32", options=None, weights=None, mode="static"):
    """Lower in memory and summarise, for a check before any build: how much would `delegate` take, and does the
    program load and run where the host can run it ("run_error": why not, or None)? Quantization is calibrated on the
    example input only: which operators get delegated does not depend on the ranges."""
    data = lower_to_bytes(model, specs, delegate, precision, options, weights=weights, mode=mode)
    try:
        check_runs(data, specs)
    except MobileBuildError as exc:
        return {**pte.read(data).delegation, "run_error": exc.message}
    return {**pte.read(data).delegation, "run_error": None}


def check_runs(data, specs):
    """A program whose delegates this host's runtime has must load and run in it: one needing an operator no kernel
    library has, or a kernel refusing its input (the portable convolution takes no 3-D input), is refused here, in
    one line, rather than written and failing in every app that runs it."""
    facts = pte.read(data)
    if not et_runtime.unavailable(facts.backends):
        et_runtime.callable_for(facts)(*in_layout(modeling.example_inputs(specs)))




def run(inputs, config, output):
    delegate, precision = config.delegate, config.precision
    model = capture_root.nested(fuse.load(inputs["model"], config), len(config.inputs))
    samples, exclude = None, ()
    if precision == "int8":
        exclude = exclusion.resolve(model, config.exclude)
    if precision == "int8" and config.mode == "static":
        if not config.calibration:
            raise MobileBuildError("int8 lowering needs calibration batches", field="quantize.calibration")
        samples = calibration_samples(config.calibration, config.inputs)
    try:
        data = lower_to_bytes(model, config.inputs, delegate, precision, config.options, samples, config.weights,
                              exclude, config.observer, config.mode)
    except ImportError as exc:  # a delegate's own dependency (coremltools) missing or broken
        raise MobileBuildError(f"ExecuTorch's {BACKEND_NAMES[delegate]} delegate cannot be loaded: "
                               f"{modeling.first_line(exc)}", field="targets") from None
    check_runs(data, config.inputs)
    with open(output, "wb") as handle:
        handle.write(data)
    return undelegated_message(pte.read(data).delegation, delegate)

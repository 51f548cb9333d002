"""What one target's toolchain makes of the model, in memory. The route names the check it gets (`Route.preflight`,
a method of TargetCheck here, or a function of its own stage module taking the TargetCheck)."""

import importlib
import json
import re
import subprocess

import torch

from mobilebuild import probe
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import graph, toolchain
from mobilebuild.preflight.advice import activation_findings, finding
from mobilebuild.worker import reproducible
from mobilebuild.worker.stages import export, lower, modeling, nnapi, optimize, quantize

# nnapi.unsupported_ops' lines: "aten::hardtanh_ (features.2, a ReLU6, and 3 more) [hint]"
NNAPI_LINE = re.compile(r"(?P<kind>\S+) \((?P<where>.*?)\)(?P<hint>.*)")


class TargetCheck:
    """What one target's toolchain makes of the model: findings, notes (what was not checked, and why), and facts
    such as the delegation summary."""

    def __init__(self, target, route, model, shared, interpreter):
        self.target, self.route, self.model, self.shared = target, route, model, shared
        self.interpreter = interpreter
        self.findings, self.notes, self.facts = [], [], {}

    def add(self, kind, detail, where):
        self.findings.append(finding(self.target.id, kind, detail, where))

    def memo(self, key, compute):
        """Targets asking the same question (two ONNX targets export the same float model) share the answer,
        failures included."""
        if key not in self.shared:
            try:
                self.shared[key] = (compute(), None)
            except MobileBuildError as exc:
                self.shared[key] = (None, exc)
        value, error = self.shared[key]
        if error is not None:
            raise error
        return value

    def run(self):
        """The check the target's route names (`Route.preflight`); a route without one is said to be unchecked."""
        if self.route.preflight is None:
            self.notes.append(f"no pre-flight check for {self.route.backend} ({self.route.runtime}): build it to see")
            return
        module, _, name = self.route.preflight.partition(":")
        check = importlib.import_module(module)
        for part in name.split("."):
            check = getattr(check, part)
        check(self)
        fixed = graph.fixed_shape(self.model.recipe, self.route, self.route.precision(self.target))
        if fixed:
            self.notes.append(fixed)
        if self.interpreter and self.route.final_stage != "optimize":
            self.notes.append(f"operations checked with this torch {torch.__version__}; the target builds with "
                              f"its toolchain {self.target.toolchain}")

    # PyTorch Mobile: optimize_for_mobile for CPU (XNNPACK, QNNPACK) or GPU (Vulkan, Metal)

    def pytorch_mobile(self):
        route, target = self.route, self.target
        try:
            build = torch_build(self.interpreter)
        except MobileBuildError as exc:
            self.add("needs-build", exc.message, "toolchain")
            return
        if route.backend in optimize.GPU_EXPORT_OPS:
            problem = gpu_export_problem(route.backend, self.interpreter, build)
            if problem:
                self.add("needs-build", problem, "optimize_for_mobile")
        elif not build["xnnpack"]:
            self.add("needs-build", f"optimize_for_mobile needs XNNPACK, and this torch {build['version']} was built "
                                    "without it (official wheels from 2.13 on); use torch 2.12 or name one built with "
                                    "USE_XNNPACK=1 in the target's `toolchain`", "optimize_for_mobile")
        if route.precision(target) == "int8":
            self.int8_kernels(build)
        self.findings += activation_findings(target.id, f"{route.backend}/{route.runtime}", self.model.activations)
        (first, *others) = self.model.inputs
        if route.backend == "xnnpack" and not others and first["memory_format"] != "channels_last" \
                and len(first["shape"]) == 4 and not self.model.converts_to_nhwc:
            self.add("advice", "the input is NCHW (contiguous): XNNPACK computes in NHWC and converts around every "
                               "convolution (MobileNetV2 here: about 415 ms against 28 ms); set "
                               "input.memory_format: channels_last (the performance recipe, step 4)",
                     "input.memory_format")

    def int8_kernels(self, build):
        engine = self.route.engine
        if engine not in build["engines"]:
            self.add("needs-build", f"this torch {build['version']} has no {engine!r} quantized engine (has: "
                                    f"{', '.join(build['engines'])})", "quantize")
            return
        if self.interpreter:
            self.notes.append("quantized kernels checked with this interpreter's torch, not the target's toolchain")
        settings = self.target.quantize
        try:
            quantized = self.model.quantized(engine, settings)
            quantize.check_runs(quantized, self.model.inputs, engine, field="model")
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message, f"int8 ({engine})")
            return
        note = self.model.quantization_notes.get((engine, settings["mode"], settings.get("weights")))
        if note:
            self.notes.append(note)

    # NNAPI: torch.backends._nnapi, traced NHWC

    def nnapi(self):
        mode = self.target.settings.get("nnapi", {}).get("mode", "none")
        if mode != "none" and self.route.engine not in torch_build()["engines"]:
            self.add("needs-build", f"this torch {torch.__version__} has no {self.route.engine!r} quantized engine, "
                                    f"which NNAPI mode {mode} quantizes with", "quantize")
            return
        try:
            if mode == "none":
                model, quantizer = nnapi.drop_dropout(self.model.float_copy()), None
            else:
                quantizer, model, _ = nnapi.split_quantized(nnapi.drop_dropout(
                    self.model.quantized(self.route.engine, self.target.quantize)))
            example = nnapi.nhwc_input(self.model.inputs, quantizer)
            with reproducible.jit_session():
                traced = nnapi.trace(model, example)
                unsupported = nnapi.unsupported_ops(traced, self.model.inputs)
                if not unsupported:  # every kind has a converter; the converter may still refuse their arguments
                    nnapi.to_nnapi(traced, example)
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message, f"NNAPI mode {mode}")
            unsupported = []
        for line in unsupported:
            parts = NNAPI_LINE.match(line)
            self.add("unsupported-op", f"torch.backends._nnapi has no conversion for {parts['kind']}{parts['hint']}",
                     parts["where"])
        self.findings += activation_findings(self.target.id, "nnapi/pytorch-mobile", self.model.activations)

    # ExecuTorch: lowered in memory for the delegate

    def executorch(self):
        options = dict(self.target.settings.get("executorch", {}))
        delegate = options.pop("delegate", self.route.delegate)
        precision = self.route.precision(self.target)
        self.facts["delegate"] = delegate
        key = ("lower", delegate, precision, json.dumps(options, sort_keys=True))
        try:
            summary = self.memo(key, lambda: lower.preflight_delegation(
                self.model.float_copy(), self.model.inputs, delegate, precision, options))
        except ImportError as exc:  # a delegate's optional dependency (coremltools) is missing
            self.notes.append(f"not checked: ExecuTorch's {delegate} delegate cannot be loaded here "
                              f"({modeling.first_line(exc)})")
            return
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message + self._layout_hint(exc.message), f"lowering to {delegate}")
            return
        summary = dict(summary)
        run_error = summary.pop("run_error")
        self.facts["delegation"] = summary
        if run_error:
            self.add("cannot-run", run_error, "ExecuTorch runtime")
        name = lower.BACKEND_NAMES[delegate]
        message = lower.undelegated_message(summary, delegate)
        if message:
            self.add("fallback", message, "whole program")
        else:
            for operator, calls in summary["fallback_ops"].items():
                if run_error and operator in run_error:
                    continue  # it has no kernel at all: the cannot-run finding says so
                self.add("fallback", f"{calls} call{'s' if calls > 1 else ''} on ExecuTorch's portable CPU kernels, "
                                     f"outside {name} (the program makes {summary['delegated_calls']} delegate "
                                     f"call{'s' if summary['delegated_calls'] > 1 else ''})"
                                     + self._layout_hint(operator), operator)
        self.findings += activation_findings(self.target.id, f"executorch/{delegate}", self.model.activations)

    def _layout_hint(self, text):
        """Both were seen with MobileNetV2 and a channels_last input, and are gone with a contiguous one."""
        if self.model.inputs[0]["memory_format"] != "channels_last":
            return ""
        if "as_strided" in text:
            return "; it is the reshape of an NHWC tensor, from the channels_last input (input.memory_format)"
        if "dim order" in text:
            return "; the input is channels_last (input.memory_format): Core ML lowers it contiguous"
        return ""

    # ONNX: torch.onnx.export of the float model

    def onnx(self):
        opset = self.target.settings.get("onnx", {}).get("opset")
        try:
            self.memo(("onnx", opset), lambda: export.export_float(self.model.float_copy(), self.model.inputs, opset,
                                                                 self.model.outputs)
                      .ByteSize())
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message, "torch.onnx.export")
            return
        if self.route.precision(self.target) == "int8":
            self.notes.append("int8: ONNX Runtime's static quantization is not tried here, only the float export it "
                              "starts from")


# --- what this torch (or the target's toolchain) was built with ----------------------------------------------------

_BUILDS = {}


def torch_build(interpreter=None):
    """The facts about a torch build that decide whether PyTorch Mobile targets can be made with it (probe.py)."""
    if interpreter not in _BUILDS:
        ops = {name: spec[:2] for name, spec in optimize.GPU_EXPORT_OPS.items()}
        if interpreter is None:
            _BUILDS[None] = probe.torch_build(ops)
        else:
            try:
                _BUILDS[interpreter] = toolchain.probe_interpreter(interpreter, ops)["torch_build"]
            except subprocess.CalledProcessError as exc:
                last = (exc.stderr.strip().splitlines() or ["no output"])[-1]
                raise MobileBuildError(f"the toolchain {interpreter} cannot import torch: {last}") from None
    return _BUILDS[interpreter]


def gpu_export_problem(backend, interpreter, build):
    if interpreter is None:
        try:
            optimize.check_gpu_export(backend)
        except MobileBuildError as exc:
            return exc.message
        return None
    if build["gpu"][backend]:
        return None
    namespace, op, needs = optimize.GPU_EXPORT_OPS[backend]
    return (f"optimize_for_mobile(backend={backend!r}) needs a torch built with {needs}; the target's toolchain "
            f"(torch {build['version']}) has no {namespace}::{op}")

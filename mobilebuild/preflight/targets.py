"""What one target's shipped artifact, once the build's own tasks have made it (shipped.py), and the model's structure
say for that target. The route names the check it gets (`Route.preflight`, a method of TargetCheck here, or a function
of its own stage module taking the TargetCheck); every target whose artifact was made and runs on this host is then
loaded and run once in its runtime, as verify would."""

import importlib
import os
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import graph
from mobilebuild.preflight.advice import activation_findings, finding
from mobilebuild.worker import measure_alone, pte, runtimes
from mobilebuild.worker.stages import fx_quantize, lower, modeling, quantize


class TargetCheck:
    """Findings, notes (what was not checked, and why) and facts (how the artifact was made, the delegation summary)
    for one target. `artifact`: the node that writes its shipped artifact; `nodes`: the project's nodes by task
    name."""

    def __init__(self, target, route, model, artifact, nodes):
        self.target, self.route, self.model, self.artifact = target, route, model, artifact
        self.nodes = nodes
        self.by_output = {node.output: node for node in nodes.values()}
        self.findings, self.notes, self.facts = [], [], {}
        self.built = False

    def add(self, kind, detail, where):
        self.findings.append(finding(self.target.id, kind, detail, where))

    def run(self, outcome):
        """`outcome`: how the build's tasks ended for the artifact (shipped.Outcome)."""
        self.facts.update(artifact=self.artifact.output, made=outcome.made)
        self.built = outcome.made != "failed"
        if not self.built:
            self.add("build-fails", outcome.error + self._layout_hint(outcome.error), outcome.failed_task)
        if self.route.preflight is None:
            self.notes.append(f"no pre-flight check of its own for {self.route.backend} ({self.route.runtime}): the "
                              "build's tasks are all it ran")
        else:
            module, _, name = self.route.preflight.partition(":")
            check = importlib.import_module(module)
            for part in name.split("."):
                check = getattr(check, part)
            check(self)
        if self.built:
            self.host_run()
        fixed = graph.fixed_shape(self.model.recipe, self.route, self.route.precision(self.target),
                                  self.target.quantize.get("mode", "static"))
        if fixed:
            self.notes.append(fixed)

    # --- what runs the artifact ---------------------------------------------------------------------------------

    def host_run(self):
        """The artifact loaded in its runtime and run once on the example inputs, as verify loads it: a program this
        host's runtime cannot load or run (a missing kernel) cannot run."""
        if not self.route.runs_on_host:
            self.notes.append(f"not run here: it runs only on {self.route.device_only}")
            return
        if self.artifact.interpreter:
            self.notes.append(f"not run here: the target's toolchain {self.target.toolchain} built it, and its "
                              "verify runs it there")
            return
        verify = self.nodes[f"verify:{self.artifact.name}"]
        where = f"{self.route.runtime} runtime"
        try:
            with measure_alone.stage_running(f"check:{self.artifact.name}", os.getcwd()), torch.no_grad():
                program = runtimes.load(Path(self.artifact.output), verify.settings)
                program(*modeling.example_inputs(self.model.inputs))
        except MobileBuildError as exc:
            self.add("cannot-run", exc.message, where)
        except Exception as exc:  # noqa: BLE001 - runtimes raise their own types (RuntimeError, ORT's Fail...)
            self.add("cannot-run", f"it cannot run on this host's {self.route.runtime}: {modeling.first_line(exc)}",
                     where)

    def upstream(self, role):
        """The first node of the artifact's chain that reads an input of `role`, or None."""
        pending, seen = [self.artifact], set()
        while pending:
            node = pending.pop(0)
            if role in node.inputs:
                return node
            seen.add(node.task_name)
            pending += [self.by_output[path] for path in node.inputs.values()
                        if path in self.by_output and self.by_output[path].task_name not in seen]
        return None

    def quantization_note(self):
        """Where eager mode could not quantize the model, the quantize stage quantized it in FX graph mode: which
        operations stay float, from the quantized model the build stored."""
        reader = self.upstream("quantized")
        if reader is None:
            return
        saved = modeling.load_weights_only(reader.inputs["quantized"], field=None)
        if not (isinstance(saved, dict) and saved.get(quantize.GRAPH_MODE) == "fx"):
            return
        quantized = quantize.load_quantized({role: Path(path) for role, path in reader.inputs.items()},
                                            reader.settings)
        kept = fx_quantize.kept_float(quantized)
        floats = ", ".join(f"{name} x{count}" for name, count in sorted(kept.items())) or "none"
        self.notes.append(f"int8: eager mode cannot quantize the model, so the build quantized it in FX graph mode; "
                          f"operations kept float: {floats}")

    # PyTorch Mobile: optimize_for_mobile for CPU (XNNPACK, QNNPACK) or GPU (Vulkan, Metal)

    def pytorch_mobile(self):
        route, target = self.route, self.target
        if self.built and route.precision(target) == "int8":
            self.quantization_note()
        self.findings += activation_findings(target.id, f"{route.backend}/{route.runtime}", self.model.activations)
        (first, *others) = self.model.inputs
        if route.backend == "xnnpack" and not others and first["memory_format"] != "channels_last" \
                and len(first["shape"]) == 4 and not self.model.converts_to_nhwc:
            self.add("advice", "the input is NCHW (contiguous): XNNPACK computes in NHWC and converts around every "
                               "convolution (MobileNetV2 here: about 415 ms against 28 ms); set "
                               "input.memory_format: channels_last (the performance recipe, step 4)",
                     "input.memory_format")

    # NNAPI: torch.backends._nnapi, traced NHWC

    def nnapi(self):
        if self.built and self.route.precision(self.target) == "int8":
            self.quantization_note()
        self.findings += activation_findings(self.target.id, "nnapi/pytorch-mobile", self.model.activations)

    # ExecuTorch: what the program delegates, read from the .pte

    def executorch(self):
        delegate = self.artifact.config.get("delegate") or self.route.delegate
        self.facts["delegate"] = delegate
        self.findings += activation_findings(self.target.id, f"executorch/{delegate}", self.model.activations)
        if not self.built:
            return
        summary = pte.read(self.artifact.output).delegation
        self.facts["delegation"] = summary
        name = lower.BACKEND_NAMES[delegate]
        message = lower.undelegated_message(summary, delegate)
        if message:
            self.add("fallback", message, "whole program")
            return
        for operator, calls in summary["fallback_ops"].items():
            self.add("fallback", f"{calls} call{'s' if calls > 1 else ''} on ExecuTorch's portable CPU kernels, "
                                 f"outside {name} (the program makes {summary['delegated_calls']} delegate "
                                 f"call{'s' if summary['delegated_calls'] > 1 else ''})"
                                 + self._layout_hint(operator), operator)

    def _layout_hint(self, text):
        """Both were seen with MobileNetV2 and a channels_last input, and are gone with a contiguous one."""
        if self.route.runtime != "executorch" or self.model.inputs[0]["memory_format"] != "channels_last":
            return ""
        if "as_strided" in text:
            return "; it is the reshape of an NHWC tensor, from the channels_last input (input.memory_format)"
        if "dim order" in text:
            return "; the input is channels_last (input.memory_format): Core ML lowers it contiguous"
        return ""

    # ONNX: the exported model; loading it in ONNX Runtime is the host run

    def onnx(self):
        pass

"""What one target's shipped artifact, once the build's own tasks have made it (shipped.py), and the model's structure
say for that target. The route brings the check it gets (`Checks.preflight`, a function of its route module taking the
TargetCheck); every target whose artifact was made and runs on this host is then
loaded and run once in its runtime, as verify would, unless the build's verify already ran those very bytes here (its
result is up to date): then its recorded outcome stands, as do the delegation facts it read from an ExecuTorch
program. Where verify would then fail the target on the recipe itself (its evaluation data, its output names:
verification.py), the target is blocked on its verify task, as the build fails it. torch, ExecuTorch and the stages
are imported only where something is left to compute."""

import os
from pathlib import Path

from mobilebuild.errors import MobileBuildError
from mobilebuild.preflight.advice import activation_findings, finding
from mobilebuild.preflight.interface import findings as interface_findings
from mobilebuild.preflight.recorded import (
    RAN_ON_HOST,
    cached_quantized_note,
    outcome_line,
    remember_quantized_note,
    verify_result,
)
from mobilebuild.worker import measure_alone, runtimes


class TargetCheck:
    """Findings, notes (what was not checked, and why) and facts (how the artifact was made, the delegation summary)
    for one target. `artifact`: the node that writes its shipped artifact; `nodes`: the project's nodes by task
    name; `memory`: what earlier checks of the recipe found (preflight.recorded.Memory), or None; `verification`:
    the recipe's verify checks (preflight.verification.RecipeVerification), or None."""

    def __init__(self, target, route, model, artifact, nodes, memory=None, verification=None):
        self.target, self.route, self.model, self.artifact = target, route, model, artifact
        self.nodes = nodes
        self.memory = memory
        self.verification = verification
        self.by_output = {node.output: node for node in nodes.values()}
        self.findings, self.notes, self.facts = [], [], {}
        self.built = False
        self.verified = None  # the build's verify result about these very bytes, where there is one
        self.verify_current = False  # ... and doit found that verify task up to date: the same settings too

    def add(self, kind, detail, where):
        self.findings.append(finding(self.target.id, kind, detail, where))

    def run(self, outcome):
        """`outcome`: how the build's tasks ended for the artifact (shipped.Outcome)."""
        self.facts.update(artifact=self.artifact.output, made=outcome.made)
        self.built = outcome.made != "failed"
        if not self.built:
            self.add("build-fails", outcome.error + self.hint(outcome.error), outcome.failed_task)
        else:
            self.recorded_verify(outcome)
        if self.route.checks.preflight is None:
            self.notes.append(f"no pre-flight check of its own for {self.route.backend} ({self.route.runtime}): the "
                              "build's tasks are all it ran")
        else:
            self.route.checks.preflight(self)
        if self.built:
            problem = self.verify_problem()
            if problem and not problem.after_run:
                self.add("build-fails", problem.line, problem.task)
            self.host_run()
            # verify names the outputs once it has run the artifact: one that cannot run fails it first
            if problem and problem.after_run and not any(item["kind"] == "cannot-run" for item in self.findings):
                self.add("build-fails", problem.line, problem.task)
        fixed = self.route.fixed_shape(self.model.recipe, self.route.precision(self.target),
                                       self.target.quantize.get("mode", "static"))
        self.findings += interface_findings(self.target, self.route, self.model.recipe,
                                            {"outputs": self.model.outputs_structure,
                                             "own_stubs": self.model.own_stubs}, self.built, fixed)

    # --- what runs the artifact ---------------------------------------------------------------------------------

    def recorded_verify(self, outcome):
        """The build's verify result for the artifact, when it is about the artifact's present bytes: doit found the
        verify task up to date before this check, and the artifact's task up to date (or the result names the
        artifact's sha256)."""
        verify = self.nodes.get(f"verify:{self.artifact.name}")
        if verify is None:
            return
        self.verify_current = outcome.verify_current
        self.verified = verify_result(verify.output, self.artifact.output,
                                               outcome.verify_current and outcome.made == "up to date")
        if self.verified is None:
            self.verify_current = False

    def artifact_facts(self, needed):
        """What the host reads of the artifact without running it (its runtime's `inspect`, worker/runtimes), holding
        `needed`: as the build's verify recorded them for these very bytes, or read now."""
        facts = (self.verified or {}).get("artifact")
        if isinstance(facts, dict) and needed in facts:
            return facts
        verify = self.nodes[f"verify:{self.artifact.name}"]
        return runtimes.inspect(Path(self.artifact.output), verify.settings)

    def verify_problem(self):
        """Where the build's verify task for the artifact fails on the recipe itself (preflight.verification.Problem),
        or None: not for an artifact verify does not run here (it checks nothing then), nor where that verify task is
        up to date for these very bytes (it passed those checks with these settings)."""
        verify = self.nodes.get(f"verify:{self.artifact.name}")
        if verify is None or self.verification is None or not verify.settings.runs_on_host or self.verify_current:
            return None
        return self.verification.problem(verify)

    def host_run(self):
        """The artifact loaded in its runtime and run once on the example inputs, as verify loads it: a program this
        host's runtime cannot load or run (a missing kernel) cannot run. Where the build's verify, up to date, ran
        these very bytes on this host (it passed or missed its thresholds: it loaded and ran), its outcome stands."""
        if not self.route.runs_on_host:
            self.notes.append(f"not run here: it runs only on {self.route.runs_in.device_only}")
            return
        if self.artifact.interpreter:
            self.notes.append(f"not run here: the target's toolchain {self.target.toolchain} built it, and its "
                              "verify runs it there")
            return
        if self.verify_current and self.verified.get("status") in RAN_ON_HOST:
            self.facts["host_run"] = {"by": "verify", "status": self.verified["status"]}
            self.notes.append(f"not run again: the build's verify ran these bytes here: "
                              f"{outcome_line(self.verified)}")
            return
        import torch

        from mobilebuild.worker.stages import modeling

        verify = self.nodes[f"verify:{self.artifact.name}"]
        where = f"{self.route.runtime} runtime"
        self.facts["host_run"] = {"by": "check"}
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
        operations stay float, from the quantized model the build stored (what an earlier check found in the same
        bytes, where one did)."""
        reader = self.upstream("quantized")
        if reader is None:
            return
        path = reader.inputs["quantized"]
        digest, note = cached_quantized_note(self.memory, path) if self.memory else (None, False)
        if note is False:
            note = self._fx_note(reader)
            if self.memory:
                remember_quantized_note(self.memory, path, digest, note)
        if note:
            self.notes.append(note)

    @staticmethod
    def _fx_note(reader):
        from mobilebuild.worker.stages import fx_quantize, modeling, quantize

        saved = modeling.load_weights_only(reader.inputs["quantized"], field=None)
        if not (isinstance(saved, dict) and saved.get(quantize.GRAPH_MODE) == "fx"):
            return None
        quantized = quantize.load_quantized({role: Path(path) for role, path in reader.inputs.items()},
                                            reader.settings)
        kept = fx_quantize.kept_float(quantized)
        floats = ", ".join(f"{name} x{count}" for name, count in sorted(kept.items())) or "none"
        return (f"int8: eager mode cannot quantize the model, so the build quantized it in FX graph mode; operations "
                f"kept float: {floats}")

    def activation_advice(self, fusion):
        """Advice on the model's activations that `fusion` (plan.routes.ActivationFusion, or None) does not fuse."""
        self.findings += activation_findings(self.target.id, fusion, self.model.activations)

    def hint(self, line):
        """What the route adds to a build error's line, or ""."""
        return self.route.checks.hint(self, line) if self.route.checks.hint is not None else ""

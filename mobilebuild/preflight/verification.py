"""What the build's verify checks of the recipe itself, whatever the artifact: its evaluation data (verify.evaluation:
the function runs, and returns one label per input; calibration-holdout finds inputs calibration did not read) and its
`outputs` names, one per output tensor of the model. verify meets them only once the artifact is made, and then fails
each target's verify task on them; the check never runs verify, so it runs verify's own functions for them
(worker.stages.verify.evaluation_data and output_names), once per recipe (once per distinct verify settings they
read), on the eager model's output tensors as the structure analysis found them (structure.analyse). What they found
is kept in `.mobilebuild/check/<recipe>.json` under a key of what they read (recorded.verification_key): torch only
where something is left to compute."""

from dataclasses import dataclass
from pathlib import Path

from mobilebuild import store
from mobilebuild.engine.doit_reporters import first_line
from mobilebuild.engine.execute import recipe_field
from mobilebuild.errors import MobileBuildError
from mobilebuild.preflight.recorded import cached_verification, remember_verification, verification_key

# The verify settings (plan.stages.VerifyConfig) that evaluation_data and output_names read; the calibration too, for
# calibration-holdout, whose data it is.
READS = ("inputs", "outputs", "evaluation", "samples", "seed", "fixed_shape")
HOLDOUT = "calibration-holdout"


@dataclass
class Problem:
    """A verify task of the build that fails on the recipe: the task, the build's one line, and whether verify meets
    it only after running the artifact (an `outputs` count: the artifact's outputs are named first)."""

    task: str
    line: str
    after_run: bool


class RecipeVerification:
    """The recipe's verify checks for the targets of one check, in the repository `root`. `output_names`: the eager
    model's output tensors (the structure facts' "output_names"), or None where they are not known (then only the
    evaluation data is checked); `memory`: preflight.recorded.Memory, or None."""

    def __init__(self, root, output_names, memory=None):
        self.root, self.output_names, self.memory = Path(root), output_names, memory
        self.problems = {}  # key -> the problem ({"message", "field"}) or None, found or recalled in this check
        self.sha256 = {}  # path -> its sha256, each file hashed once

    def problem(self, verify):
        """Where the build's verify task `verify` (a node) fails on the recipe: a Problem, or None."""
        reads = {name: verify.config.get(name) for name in READS}
        if reads["evaluation"] == HOLDOUT:
            reads["calibration"] = verify.config.get("calibration")
        key = verification_key(reads, {path: self._sha256(path) for path in verify.files}, self.output_names)
        if key not in self.problems:
            known, found = cached_verification(self.memory, key) if self.memory else (False, None)
            self.problems[key] = found if known else self._run(verify.settings)
            if not known and self.memory:
                remember_verification(self.memory, {used: problem for used, problem in self.problems.items()
                                                    if not (problem or {}).get("crashed")})
        found = self.problems[key]
        if found is None:
            return None
        if found.get("crashed"):
            return Problem(verify.task_name, found["message"], False)
        # as the build renders a stage's error (engine.execute.run_node): the field where the target sets it
        error = MobileBuildError(found["message"], file=verify.recipe_file,
                                 field=recipe_field(found["field"], verify.fields))
        return Problem(verify.task_name, first_line(error), found["field"] == "outputs")

    def _sha256(self, path):
        if path not in self.sha256:
            try:
                self.sha256[path] = store.sha256_file(self.root / path)
            except OSError:
                self.sha256[path] = None
        return self.sha256[path]

    def _run(self, settings):
        """The problem verify's functions raise for `settings` ({"message", "field"}; {"message", "crashed"} for a
        bug of ours, not remembered), or None. In verify's order: the evaluation data, then the output names."""
        from mobilebuild.preflight.structure import importable  # torch, and the evaluation function's own imports
        from mobilebuild.worker import quiet
        from mobilebuild.worker.stages import modeling, verify

        try:
            with importable(self.root), quiet.quiet(logs=None):  # what the user's function prints is not the report
                verify.evaluation_data(settings)
                if self.output_names is not None:
                    verify.output_names(settings.outputs, self.output_names)
        except MobileBuildError as exc:
            return {"message": exc.message, "field": exc.field}
        except Exception as exc:  # noqa: BLE001 - the build's verify would crash on it too: a bug in mobilebuild
            return {"message": f"crashed (a bug in mobilebuild): {modeling.first_line(exc)}", "crashed": True}
        return None

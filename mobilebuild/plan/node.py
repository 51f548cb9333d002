"""A node of the graph: one stage run that writes one file. Names, settings and paths only."""

import functools
from dataclasses import dataclass, field

from mobilebuild.plan import toolchain
from mobilebuild.plan.stages import as_json


@dataclass(frozen=True)
class Node:
    stage: str
    name: str  # unique within its stage; the doit task is "<stage>:<name>"
    recipe: str
    recipe_file: str
    settings: object  # the stage's settings (its contract's dataclass)
    inputs: dict  # role -> output path of an upstream node, or a file of the repository
    output: str
    files: tuple = ()  # files from outside the graph that the node reads
    describes: dict = field(default_factory=dict)  # backend/runtime, for the manifest
    # Where settings a stage names by their recipe-level field sit for this node, when elsewhere: a target's own
    # `prune` or `quantize`, the target itself for "targets". Not part of the key: reordering targets rebuilds nothing.
    fields: dict = field(default_factory=dict)
    interpreter: str | None = None  # another Python that runs the stage (a target's `toolchain`)
    # Seconds it may run before its worker is stopped (the recipe's `limits`, by its stage's Stage.limit); None: no
    # limit. Not part of the key: it changes no artifact.
    time_limit: float | None = None
    # The packages of the route whose stage this is (Route.runs_in.packages) and the library of models it builds the
    # model with (ModelSource.library), beyond torch and torchvision: the versions that key it (toolchain.versions).
    # Shared nodes (checkpoint, prune, fuse, quantize, manifest) have no route's.
    packages: tuple = ()
    # Why it cannot run here: one line naming what of `packages` its interpreter lacks and the extra of mobilebuild
    # that installs it (plan.routes.not_installed), or None. Not part of the key: installing it changes no setting.
    not_installed: str | None = None

    @functools.cached_property
    def config(self):
        """The settings as JSON: what keys the node and travels to the worker."""
        return as_json(self.settings)

    @property
    def task_name(self):
        return f"{self.stage}:{self.name}"

    def key(self):
        return {"stage": self.stage, "config": self.config,
                "toolchain": toolchain.versions(self.interpreter, self.packages)}

    def dependencies(self):
        return [*self.inputs.values(), *self.files]

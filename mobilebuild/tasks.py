"""Graph nodes as doit tasks: one task group per stage, one file target per task. No torch here: loading the
tasks (`doit list`, an up-to-date `doit`) stays fast.
"""

import functools
import os

from doit.dependency import MD5Checker
from doit.exceptions import InvalidDodoFile
from doit.tools import config_changed

from mobilebuild import graph, recipe, store
from mobilebuild.errors import RecipeErrors
from mobilebuild.execute import clean_output, run_node
from mobilebuild.reporter import Reporter

__all__ = ["DOIT_CONFIG", "task_train", "task_checkpoint", "task_fuse", "task_quantize", "task_script",
           "task_optimize", "task_manifest", "task_build"]



class ContentChecker(MD5Checker):
    """doit's default check (timestamp first, then content), with sha256 in place of md5: faster here, and shared
    through store.sha256_file with the manifest, so each artifact is hashed once per run."""

    def check_modified(self, file_path, file_stat, state):
        timestamp, size, digest = state
        if file_stat.st_mtime == timestamp:
            return False
        return file_stat.st_size != size or digest != store.sha256_file(file_path)

    def get_state(self, dep, current_state):
        timestamp = os.path.getmtime(dep)
        if current_state and current_state[0] == timestamp:
            return None
        return timestamp, os.path.getsize(dep), store.sha256_file(dep)


DOIT_CONFIG = {
    "default_tasks": ["build"],
    "check_file_uptodate": ContentChecker,
    "verbosity": 2,
    "reporter": Reporter,
    "subtasks": True,  # `doit list` shows every artifact's task, e.g. optimize:mobilenet_v2-xnnpack
}


@functools.lru_cache(maxsize=None)
def project_nodes(root):
    try:
        return graph.build(recipe.load_all(root), root)
    except RecipeErrors as exc:
        raise InvalidDodoFile(str(exc)) from None  # doit prints it without a traceback and exits non-zero


def _tasks(stage):
    for node in project_nodes(os.getcwd()):
        if node.stage == stage:
            yield {
                "name": node.name,
                "actions": [(run_node, [node])],
                "file_dep": node.dependencies(),
                "targets": [node.output],
                "uptodate": [config_changed(node.key())],
                "clean": [(clean_output, [node.output])],
                "doc": f"{node.output} ({node.recipe_file})",
            }


def task_train():
    """Train models whose recipe has model.train; their weights become the checkpoint."""
    yield from _tasks("train")


def task_checkpoint():
    """Materialise each model's weights as a state_dict."""
    yield from _tasks("checkpoint")


def task_fuse():
    """Fold batch norm and fuse Conv/Linear-BN-ReLU sequences in eager mode."""
    yield from _tasks("fuse")


def task_quantize():
    """Static post-training quantization per engine."""
    yield from _tasks("quantize")


def task_script():
    """TorchScript per precision (script or trace)."""
    yield from _tasks("script")


def task_optimize():
    """optimize_for_mobile per target, saved for the lite interpreter (.ptl)."""
    yield from _tasks("optimize")


def task_manifest():
    """artifacts/<recipe>/manifest.json: every file with its stage, target, sha256 and size."""
    yield from _tasks("manifest")


def task_build():
    """Build every artifact of every recipe (the default)."""
    return {"actions": None, "task_dep": [s for s in graph.STAGES], "doc": task_build.__doc__}

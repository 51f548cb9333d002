"""Bad input: one clear line per problem naming the file and the field, a non-zero exit, no traceback, and nothing
written or damaged.

Each directory of tests/corpus is one broken input (tests/corpus/README.md lists them): the files to drop into a
project (recipes, model modules, images) and a `case.yaml` saying how to run it and which lines to expect. Binary
inputs (checkpoints, truncated files, pickles carrying code, images) are generated here, at test time, by the
MAKERS below, as `make:` asks.

Every case runs in a copy of one project where a good recipe is already built, so that a broken recipe beside it
is seen not to touch the good recipe's artifacts (same sha256 before and after).
"""

import hashlib
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINYNET, Project, tiny_recipe

from mobilebuild import store

pytestmark = pytest.mark.slow  # the bad-input corpus, a real doit run per case

CORPUS = Path(__file__).with_name("corpus")
REPORT = ("report.md", "report.html", "plots/")  # below artifacts/
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "case.yaml").is_file())
MOBILEBUILD = str(Path(sys.executable).with_name("mobilebuild"))
MARKER = "code-was-run"  # what a checkpoint carrying code would create if it were ever unpickled


def load_case(name):
    return yaml.safe_load((CORPUS / name / "case.yaml").read_text())


# --- generated inputs -------------------------------------------------------------------------------------------

def _tinynet_state(width=4):
    namespace = {}
    exec(TINYNET, namespace)
    return namespace["make"](width).state_dict()


def _saved(obj):
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


class _RunsCode:
    """Unpickling this runs a shell command: what a malicious or careless checkpoint can carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def make_empty(root, outside, path):
    (root / path).write_bytes(b"")


def make_checkpoint(root, outside, path, width=4):
    """The tiny model's state_dict (width 4 matches tinynet:make; another width does not)."""
    (root / path).write_bytes(_saved(_tinynet_state(width)))


def make_truncated_checkpoint(root, outside, path):
    data = _saved(_tinynet_state())
    (root / path).write_bytes(data[: len(data) // 2])


def make_foreign_checkpoint(root, outside, path):
    """A real state_dict, of another model."""
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Linear(8, 10))
    (root / path).write_bytes(_saved(model.state_dict()))


def make_tensor_checkpoint(root, outside, path):
    """One tensor where a state_dict is expected."""
    import torch

    (root / path).write_bytes(_saved(torch.zeros(4, 3, 3, 3)))


def make_code_checkpoint(root, outside, path):
    """torch.save's zip format, with a pickle that runs a command when loaded without weights_only."""
    state = dict(_tinynet_state())
    state["conv.weight"] = _RunsCode(root / MARKER)
    (root / path).write_bytes(_saved(state))


def make_code_pickle(root, outside, path):
    """A bare (legacy-format) pickle that runs a command when loaded without weights_only."""
    (root / path).write_bytes(pickle.dumps({"conv.weight": _RunsCode(root / MARKER)}, protocol=2))


def make_image(root, outside, path, size=8, truncate=False):
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 90)).save(buffer, format="PNG")
    data = buffer.getvalue()
    (root / path).write_bytes(data[: len(data) // 2] if truncate else data)


def make_outside(root, outside, path, source):
    """A file outside the repository, made by another maker, and a symlink to it at `path` inside."""
    MAKERS[source["kind"]](outside, outside, **{k: v for k, v in source.items() if k != "kind"})
    (root / path).symlink_to(outside / source["path"])


def make_directory(root, outside, path):
    (root / path).mkdir(parents=True, exist_ok=True)


def make_encoded(root, outside, path, text, encoding):
    """Text in another encoding than UTF-8 (a recipe saved as Latin-1, say)."""
    (root / path).write_bytes(text.encode(encoding))


MAKERS = {name.removeprefix("make_"): value for name, value in globals().items() if name.startswith("make_")}


# --- running a case ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_project(tmp_path_factory):
    """A project with a good recipe built (artifacts, manifest, report): each case starts from a copy of it."""
    project = Project(tmp_path_factory.mktemp("good"))
    project.write_recipe(tiny_recipe("good"))
    project.doit()
    return project.root


def sha256_tree(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


# Runs the command in argv[2:] with a file-size limit of argv[1] bytes. Ignored, SIGXFSZ no longer kills the writer:
# the write fails with EFBIG, as on a full disk (both survive the exec). Not a preexec_fn: that forks this process,
# which has imported JAX (litert-torch), and a fork of it may deadlock.
LIMITED = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2); os.execv(sys.argv[2], sys.argv[2:])")


def doit(root, args, limit=None):
    limited = [sys.executable, "-c", LIMITED, str(limit)] if limit else []
    return subprocess.run([*limited, sys.executable, "-m", "doit", *args], cwd=root, capture_output=True, text=True,
                          timeout=600)


def run_case(case, root):
    if case["command"] == "validate":
        return subprocess.run([MOBILEBUILD, "validate"], cwd=root, capture_output=True, text=True, timeout=600)
    return doit(root, case.get("args", []), case.get("file_size_limit"))


def expected_prefix(case, entry):
    """`recipes/x.yaml: field: ` from validate; `ERROR: task: recipes/x.yaml: field: ` from doit (a failed write
    names no recipe field: `ERROR: task: cannot write ...`)."""
    task = ["ERROR", entry["task"]] if case["command"] == "doit" else []
    return "".join(f"{part}: " for part in [*task, entry["file"], entry["field"]] if part)


@pytest.mark.parametrize("name", CASES)
def test_bad_input_fails_in_one_clear_line_and_writes_nothing(name, good_project, tmp_path, request):
    case = load_case(name)
    if "xfail" in case:  # strict: once fixed, the case passes and its marker must go
        request.applymarker(pytest.mark.xfail(reason=case["xfail"], strict=True))
    root, outside = tmp_path / "project", tmp_path / "outside"
    shutil.copytree(good_project, root, symlinks=True)
    outside.mkdir()
    shutil.copytree(CORPUS / name, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("case.yaml"))
    for item in case.get("make", []):
        (root / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        MAKERS[item["kind"]](root, outside, **{k: v for k, v in item.items() if k != "kind"})
    for args in case.get("prepare", []):  # what comes before the failing stage, built without any limit
        prepared = doit(root, args.split())
        assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    before = sha256_tree(root / "artifacts")

    result = run_case(case, root)
    output = result.stdout + result.stderr

    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    # One line per problem: for doit, the reporter's ERROR lines (progress and "skipped" lines may sit beside them);
    # for validate, every line on stderr.
    lines = result.stderr.splitlines()
    if case["command"] == "doit":
        lines = [line for line in lines if line.startswith("ERROR")]
    assert len(lines) == len(case["expect"]), output
    unmatched = list(lines)
    for entry in case["expect"]:
        prefix = expected_prefix(case, entry)
        found = [line for line in unmatched if line.startswith(prefix)
                 and re.search(entry["message"], line.removeprefix(prefix))]
        assert found, f"no line starts with {prefix!r} and matches {entry['message']!r}:\n{output}"
        unmatched.remove(found[0])

    after = sha256_tree(root / "artifacts")
    # The report covers every recipe: a run that failed rewrites it, naming the recipe it could not build.
    if after.get("report.md") != before.get("report.md"):
        assert " NOT BUILT, " in (root / "artifacts" / "report.md").read_text(), output
    before, after = ({path: digest for path, digest in tree.items() if not path.startswith(REPORT)}
                     for tree in (before, after))
    assert {path: after.get(path) for path in before} == before, "an existing artifact changed or vanished"
    assert set(after) - set(before) == set(case.get("writes", [])), output  # paths below artifacts/
    assert not [p for p in root.rglob(f"*{store.TEMP_MARKER}*")], "a temporary file was left behind"
    assert not (root / MARKER).exists(), "the checkpoint's code was run"


def test_the_corpus_is_large_and_listed_in_its_readme():
    readme = (CORPUS / "README.md").read_text()
    assert len(CASES) >= 30
    listed = re.findall(r"^\| `([a-z0-9_]+)` \|", readme, flags=re.MULTILINE)
    assert listed == CASES
    for name in CASES:
        case = load_case(name)
        assert case["command"] in ("validate", "doit") and case["broken"] and case["expect"], name
        assert all(item["kind"] in MAKERS for item in case.get("make", [])), name

"""How often `mobilebuild check`'s verdict for a target matches what the build then does with it.

For each case (a recipe and the files it needs) it writes a fresh project in a temporary folder (the real dodo.py, the
recipe under recipes/, the factory files), runs `mobilebuild check RECIPE --json` there (a subprocess; the report's
findings per target give the verdict), then `mobilebuild build -n 1` in the same project, and reads each target's
outcome from the manifest (artifacts/<recipe>/manifest.json: the target's status, and for a failed chain the task
that failed and its line) or, where no manifest was written (no target built), from the build's ERROR lines and the
artifacts on disk. The shared artifact cache is off, so every check is cold; the build after it starts from what the
check made, as it would after a real check.

The cases (`--list`):
  examples  the bundled recipes (recipes/*.yaml): 19 targets, MobileNetV2's 9 the heavy part (`--skip-examples`);
  models    the models of the check's tests (tests/test_preflight*.py, read by path; tests/tiny_models.py and
            conftest's TinyNet, copied into the project), in recipes like the tests': a model that scripts badly,
            portable fallbacks, a kernel ExecuTorch lacks (erfinv), NNAPI's in-place ops, control flow, Vulkan and
            Metal on stock torch, int8 in FX graph mode, outputs and inputs routes cannot keep, an int8 model that
            misses its thresholds, ONNX's percentile observer on an attention mask;
  corpus    the bad-input corpus (tests/corpus/) cases that build (`command: doit`), but those needing binary inputs
            made by test_bad_inputs.py's helpers (`make`: checkpoints, pickles, images) and those simulating a full
            disk (`file_size_limit`: the machine, not the recipe).

Verdicts: check's "blocked" (a build-fails or cannot-run finding), "ok" (no finding) or "warn" (fallback, interface
or advice findings only); exit status 2 (a recipe it cannot read, or a model it cannot build) is "refused", one row for
the whole recipe (target "*"). Outcomes: "verified", "FAILED verification" (built and run here, below the recipe's
thresholds), "not run on host" (built; it runs on a device only), "not verified", "verify error" (built, and the build's
verify task failed: it could not load or run it, or the recipe's verify settings failed) and "not built" (a task of
its chain failed, or the recipe is invalid).

Agreement, per row:
  ok / warn  <->  verified, FAILED verification, not run on host, not verified: the build delivers the artifact.
                  A verification below its thresholds counts as delivered: check does not predict accuracy (it builds
                  the artifact and runs it once), and the artifact was made and ran; the build then fails its
                  `verified:` gate, which `mobilebuild tune` is for. Such rows are counted apart in the summary.
  blocked    <->  not built, verify error: the build refuses the target or cannot run it here.
  refused    <->  no target of the recipe delivered.
Anything else (check crashed, a target one side does not know) disagrees.

Target: every verdict agrees (exit status 1 otherwise, each disagreement listed with both sides' lines).

    .venv/bin/python benchmarks/check_agreement.py [--quick | --only NAME[,NAME]] [--skip-examples] [--keep DIR]
"""

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from _bench import REPO, bytecode_env, table, verdict

MOBILEBUILD = Path(sys.executable).with_name("mobilebuild")
TESTS = REPO / "tests"
CORPUS = TESTS / "corpus"
# The finding kinds that block (mobilebuild/preflight/advice.py's BLOCKING; not imported, which would load the build's
# tasks module): each report's own count of blocking findings is checked against it.
BLOCKING = ("build-fails", "cannot-run")
TIMEOUT = 1800  # seconds, per check or build: MobileNetV2's cold build takes a few minutes here

# --- the models, from the tests (read by path: importing a test module would import pytest) ----------------------


def test_source(path, name):
    """The text of the module-level `name = textwrap.dedent('''...''')` (or a plain string) in the test file `path`."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            value = node.value.args[0] if isinstance(node.value, ast.Call) else node.value
            return textwrap.dedent(ast.literal_eval(value)).lstrip("\n")
    sys.exit(f"FAIL: no {name} = '...' in {path.relative_to(REPO)}: the cases read their models from there")


def model_files():
    """{file name in the project: its text}: every models case gets them all (a few KB)."""
    return {"preflight_models.py": test_source(TESTS / "test_preflight.py", "MODELS"),
            "interface_models.py": test_source(TESTS / "test_preflight_interface.py", "MODELS"),
            "reuse_net.py": test_source(TESTS / "test_preflight_recorded.py", "MODEL"),
            "tinynet.py": test_source(TESTS / "conftest.py", "TINYNET"),
            "tiny_models.py": (TESTS / "tiny_models.py").read_text()}


@dataclass
class Case:
    name: str  # group/short name
    what: str
    recipes: dict  # {path under recipes/: the recipe as a mapping, or None for a file copied with `files`}
    files: dict = field(default_factory=dict)  # {path in the project: text}
    tree: Path | None = None  # a folder copied into the project first (a corpus case)


NHWC = {"shape": [1, 3, 12, 12], "memory_format": "channels_last"}
NCHW = {"shape": [1, 3, 12, 12]}
IMAGE = {"input": {"shape": [1, 3, 8, 8]}}
IDS = {"inputs": [{"name": "ids", "shape": [1, "seq"], "dtype": "int64", "range": [0, 16]},
                  {"name": "extra", "shape": [1, 8]}],
       "dims": {"seq": {"min": 2, "max": 12, "example": 6}}}
EVERY_HOST_ROUTE = [{"backend": "xnnpack"}, {"backend": "qnnpack"}, {"backend": "nnapi"},
                    {"backend": "xnnpack", "runtime": "executorch", "name": "et"},
                    {"backend": "xnnpack", "runtime": "executorch", "name": "et-int8", "precision": "int8"},
                    {"backend": "onnx"}, {"backend": "onnx", "name": "onnx-int8", "precision": "int8"}]
ET = {"backend": "xnnpack", "runtime": "executorch"}
TOKENS = [{"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100]},
          {"name": "mask", "shape": [1, 16], "dtype": "int64", "range": [0, 2]}]


def preflight_recipe(name, factory, targets, input_config=NHWC, **settings):
    """As tests/test_preflight.py's write_recipe."""
    return {"name": name, "model": {"factory": f"preflight_models:{factory}"}, "input": input_config,
            "quantize": {"calibration": {"source": "random", "batches": 1, "seed": 0}},
            "benchmark": {"warmup": 1, "iters": 2}, "targets": targets, **settings}


def interface_recipe(name, model, interface_spec, script="script"):
    """As tests/test_preflight_interface.py's write."""
    return {"name": name, "model": {"factory": "interface_models:make", "kwargs": {"name": model}},
            **interface_spec, "quantize": {"calibration": {"source": "random", "batches": 2, "seed": 0}},
            "script": script, "verify": {"samples": 2, "layers": False}, "benchmark": {"warmup": 1, "iters": 2},
            "targets": EVERY_HOST_ROUTE}


def tiny_recipe(name, factory, targets, **settings):
    """A tests/tiny_models.py model with the default verification thresholds."""
    return {"name": name, "model": {"factory": f"tiny_models:{factory}"}, "input": {"shape": [1, 3, 8, 8]},
            "quantize": {"calibration": {"source": "random", "batches": 4, "seed": 0}},
            "benchmark": {"warmup": 1, "iters": 2}, "targets": targets, **settings}


RELAXED_INT8 = {"sqnr_db": 0, "cosine": 0, "max_rel_error": 10}
MODELS = [  # (name, what, recipe)
    ("pythonic", "torch.jit.script cannot compile the model (a generator over *args); ONNX exports it",
     preflight_recipe("pythonic", "pythonic", [{"backend": "xnnpack"}, {"backend": "onnx"}], NCHW)),
    ("partly", "cumsum outside the XNNPACK delegate: portable fallback",
     preflight_recipe("partly", "cumulative", [ET], NCHW)),
    ("missing", "erfinv: no kernel in ExecuTorch's runtime",
     preflight_recipe("missing", "inverse_error", [ET], NCHW)),
    ("clean", "a clean Conv-BN-ReLU model on four routes",
     preflight_recipe("clean", "clean", [{"backend": "xnnpack"}, {"backend": "qnnpack"}, {"backend": "nnapi"},
                                         {"backend": "onnx"}])),
    ("relu6", "ReLU6 (NNAPI advice), three CPU routes",
     preflight_recipe("relu6", "relu6", [{"backend": "xnnpack"}, {"backend": "qnnpack"}, {"backend": "onnx"}])),
    ("relu6_inplace", "ReLU6(inplace=True): the NNAPI converter has no aten::hardtanh_",
     preflight_recipe("relu6_inplace", "relu6_inplace", [{"backend": "nnapi"}, {"backend": "xnnpack"}])),
    ("branchy", "control flow on a tensor's value: torch.export cannot capture it",
     preflight_recipe("branchy", "branchy", [{"backend": "onnx"}, {"backend": "xnnpack"}, ET])),
    ("gpu", "Vulkan and Metal: optimize_for_mobile on a stock torch, and ExecuTorch's delegates",
     preflight_recipe("gpu", "clean", [{"backend": "vulkan"}, {"backend": "metal"},
                                       {"backend": "vulkan", "runtime": "executorch", "name": "et-vulkan"},
                                       {"backend": "metal", "runtime": "executorch", "name": "et-metal"}], NCHW)),
    ("plain_add", "+ on quantized tensors: eager mode cannot, FX graph mode quantizes it",
     preflight_recipe("plain_add", "plain_add", [{"backend": "qnnpack"}])),
    ("hardswish", "Hardswish and an NCHW input (advice)",
     preflight_recipe("hardswish", "hardswish", [{"backend": "xnnpack"}, {"backend": "onnx"}], NCHW)),
    ("dict_out", "a dict output on every host route (eager int8 and NNAPI cannot return it)",
     interface_recipe("dict_out", "DictOut", IMAGE)),
    ("ids", "int64 token ids and a dynamic dim on every host route, traced",
     interface_recipe("ids", "Ids", IDS, script="trace")),
    ("reuse", "+ on quantized tensors and cumsum, four routes, relaxed int8 thresholds",
     {"name": "reuse", "model": {"factory": "reuse_net:make"}, "input": {"shape": [1, 3, 8, 8]},
      "quantize": {"calibration": {"source": "random", "batches": 2, "seed": 0}},
      "verify": {"samples": 2, "layers": False, "thresholds": {"int8": RELAXED_INT8}},
      "benchmark": {"warmup": 1, "iters": 2},
      "targets": [{"backend": "xnnpack"}, {"backend": "qnnpack"}, ET, {"backend": "onnx"}]}),
    ("broken_conv", "a convolution int8 rounds to nothing: qnnpack misses int8 thresholds of 40 dB (24 dB)",
     tiny_recipe("broken_conv", "broken_conv", [{"backend": "xnnpack"}, {"backend": "qnnpack"}],
                 verify={"thresholds": {"int8": {"sqnr_db": 40}}})),
    ("encoder", "nn.TransformerEncoder with a padding mask, ONNX int8: minmax, and percentile (refused)",
     tiny_recipe("encoder", "tiny_encoder", [
         {"backend": "onnx", "precision": "int8", "name": "onnx-minmax", "quantize": {"observer": "minmax"}},
         {"backend": "onnx", "precision": "int8", "name": "onnx-percentile", "quantize": {"observer": "percentile"}}],
         input=None, inputs=TOKENS)),
    ("transformer", "a tiny Transformer on token ids, traced, qnnpack dynamic int8",
     tiny_recipe("transformer", "tiny_transformer", [{"backend": "xnnpack"}, {"backend": "qnnpack"}, ET],
                 input={"shape": [1, 16], "dtype": "int64", "range": [0, 100]}, script="trace",
                 quantize={"mode": "dynamic"})),
    ("hardswish_fx", "Hardswish(inplace) without stubs: int8 in FX graph mode, PyTorch Mobile and ExecuTorch",
     tiny_recipe("hardswish_fx", "tiny_hardswish",
                 [{"backend": "qnnpack"}, {**ET, "precision": "int8", "name": "et-int8"}])),
]

QUICK = ["models/pythonic", "models/missing", "models/gpu", "models/broken_conv", "corpus/script_cannot_compile",
         "corpus/factory_raises", "corpus/verify_evaluation_raises"]


def cases():
    models = model_files()
    found = [Case(f"examples/{path.stem}", f"the bundled example {path.name}", {path.name: yaml.safe_load(
        path.read_text())}) for path in sorted((REPO / "recipes").glob("*.yaml"))]
    for name, what, recipe in MODELS:
        recipe = {key: value for key, value in recipe.items() if value is not None}
        found.append(Case(f"models/{name}", what, {f"{name}.yaml": recipe}, models))
    for folder in sorted(path for path in CORPUS.iterdir() if (path / "case.yaml").is_file()):
        case = yaml.safe_load((folder / "case.yaml").read_text())
        if case["command"] != "doit" or case.get("make") or case.get("file_size_limit"):
            continue
        recipes = {str(path.relative_to(folder / "recipes")): None for path in (folder / "recipes").rglob("*.yaml")}
        found.append(Case(f"corpus/{folder.name}", case["broken"], recipes,
                          {"tinynet.py": models["tinynet.py"]}, folder))
    return found


def select(all_cases, args):
    chosen = all_cases
    if args.quick:
        chosen = [case for case in chosen if case.name in QUICK]
    if args.only:
        names = args.only.split(",")
        unknown = [name for name in names if not any(name in (case.name, *case.name.split("/")) for case in chosen)]
        if unknown:
            sys.exit(f"no case {', '.join(unknown)} (--list lists them)")
        chosen = [case for case in chosen if set(names) & {case.name, *case.name.split("/")}]
    if args.skip_examples:
        chosen = [case for case in chosen if not case.name.startswith("examples/")]
    return chosen


def write_project(case, root):
    shutil.rmtree(root, ignore_errors=True)  # --keep: a project of an earlier run
    if case.tree is not None:
        shutil.copytree(case.tree, root, symlinks=True, ignore=shutil.ignore_patterns("case.yaml"))
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    for path, text in case.files.items():
        (root / path).write_text(text)
    for path, recipe in case.recipes.items():
        if recipe is not None:
            (root / "recipes" / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "recipes" / path).write_text(yaml.safe_dump(recipe, sort_keys=False))


# --- one side each ---------------------------------------------------------------------------------------------


@dataclass
class Side:
    label: str  # what the table shows
    delivers: bool | None  # check: the build will deliver it (ok, warn); build: it did. None: neither can say
    detail: str = ""  # the line behind it (a blocking finding, the build's error)
    task: str | None = None  # the task named as failing


def run(command, root, env):
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {TIMEOUT} s", time.perf_counter() - started
    return done.returncode, done.stdout, done.stderr, time.perf_counter() - started


def first_line(text):
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def check_verdicts(status, stdout, stderr):
    """({target: Side}, {target: artifact path}) from `mobilebuild check --json`: its exit status and report."""
    if status == 2:
        return {"*": Side("refused", False, first_line(stderr))}, {}
    try:
        report = json.loads(stdout)
    except ValueError:
        return {"*": Side(f"check failed (exit {status})", None, (stderr.strip().splitlines() or [""])[-1])}, {}
    model_blocking = [item for item in report["model"]["findings"] if item["kind"] in BLOCKING]
    counted = len(model_blocking) + sum(item["kind"] in BLOCKING for result in report["targets"]
                                        for item in result["findings"])
    if counted != report["blocking"]:
        return {"*": Side("check's kinds changed", None, f"{counted} blocking findings of kinds {BLOCKING}, the "
                                                        f"report counts {report['blocking']}: update BLOCKING")}, {}
    verdicts, artifacts = {}, {}
    for result in report["targets"]:
        findings = model_blocking + result["findings"]
        blocking = [item for item in findings if item["kind"] in BLOCKING]
        artifacts[result["target"]] = result.get("artifact")
        if blocking:
            first = blocking[0]
            verdicts[result["target"]] = Side(f"blocked ({first['kind']})", False, f"{first['where']}: "
                                              f"{first['detail']}", first["where"] if ":" in first["where"] else None)
        else:
            kinds = sorted({item["kind"] for item in findings})
            verdicts[result["target"]] = Side(f"warn ({', '.join(kinds)})" if kinds else "ok", True)
    return verdicts, artifacts


ERROR = re.compile(r"^ERROR: (\S+:\S+): (.*)$")
SKIPPED = re.compile(r"^skipped (\S+): it needs (.+), which failed$")


def failed_tasks(output):
    """({task: its error line}, {task doit skipped: the tasks it needed that failed}) from the build's output."""
    errors = dict(match.groups() for match in map(ERROR.match, output.splitlines()) if match)
    skipped = {match[1]: match[2].split() for match in map(SKIPPED.match, output.splitlines()) if match}
    return errors, skipped


def cause(task, errors, skipped, seen=()):
    """The failed task at the root of `task`'s (followed through the tasks doit skipped for it), or None."""
    if task in errors:
        return task
    for needed in skipped.get(task, ()):
        if needed not in seen:
            found = cause(needed, errors, skipped, (*seen, task))
            if found:
                return found
    return None


def build_outcomes(root, recipe_name, artifacts, output):
    """{target: Side} from the manifest the build wrote, else (no target built: none is written) from its lines: the
    failed task at the root of the target's verify task, and whether the artifact check said it ships is on disk."""
    manifest = root / "artifacts" / recipe_name / "manifest.json"
    if manifest.is_file():
        document = json.loads(manifest.read_text())
        return {target["target"]: _manifest_outcome(target, document.get("verification", {}))
                for target in document["targets"]}
    errors, skipped = failed_tasks(output)
    invalid = next((task for task in errors if task.startswith("invalid:")), None)
    outcomes = {}
    for target, path in artifacts.items():
        task = invalid or cause(f"verify:{recipe_name}-{target}", errors, skipped)
        line = f"{task}: {errors[task]}" if task else first_line(output)
        built = bool(path) and (root / path).is_file() and not invalid
        if task is None:
            outcomes[target] = Side("built, no manifest" if built else "not built, no error", None, line)
        else:
            outcomes[target] = Side("verify error" if built else "not built", False, line, task)
    if outcomes:
        return outcomes
    task = invalid or next(iter(errors), None)
    return {"*": Side("no target built", False, f"{task}: {errors[task]}" if task else first_line(output), task)}


def _manifest_outcome(target, verification):
    status, reason = target.get("status"), target.get("reason")
    if status == "failed" and reason:
        task = reason.split(": ", 1)[0]
        built = target.get("bytes") is not None or task.split(":")[0] in ("verify", "bench", "layers")
        return Side("verify error" if built else "not built", False, reason, task)
    if status == "failed":
        failures = (verification.get(target["target"]) or {}).get("failures") or []
        return Side("FAILED verification", True, "; ".join(failures))
    return Side({"passed": "verified"}.get(status, status), True)


def agree(check, build):
    if check is None or build is None or check.delivers is None or build.delivers is None:
        return False
    return check.delivers == build.delivers


# --- the run -----------------------------------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    target: str
    check: Side | None
    build: Side | None

    @property
    def agrees(self):
        return agree(self.check, self.build)


def measure_case(case, root, env):
    """(rows, check seconds, build seconds) for one case, in a fresh project at `root`."""
    write_project(case, root)
    rows, check_seconds = [], 0.0
    checked = {}
    for path in sorted((root / "recipes").rglob("*.yaml")):
        recipe = path.relative_to(root).as_posix()
        status, stdout, stderr, seconds = run([str(MOBILEBUILD), "check", recipe, "--json"], root, env)
        check_seconds += seconds
        checked[path] = check_verdicts(status, stdout, stderr)
    # -r verbose: the console reporter counts the tasks a failure kept from running; verbose names them (SKIPPED)
    status, stdout, stderr, build_seconds = run([str(MOBILEBUILD), "build", "-n", "1", "-r", "verbose"], root, env)
    for path, (verdicts, artifacts) in checked.items():
        try:
            name = yaml.safe_load(path.read_text())["name"]
        except Exception:  # noqa: BLE001 - a broken recipe is a case: its name is the file's
            name = path.stem
        outcomes = build_outcomes(root, name, artifacts, stdout + "\n" + stderr)
        if "*" in verdicts:  # refused: the recipe as a whole, against whether any target was delivered
            delivered = [target for target, side in outcomes.items() if side.delivers]
            build = (Side(f"delivered {', '.join(delivered)}", True) if delivered else
                     Side("no target built", False, next((side.detail for side in outcomes.values()), "")))
            rows.append(Row(case.name, "*", verdicts["*"], build))
            continue
        for target in list(verdicts) + [target for target in outcomes if target not in verdicts]:
            rows.append(Row(case.name, target, verdicts.get(target), outcomes.get(target)))
    return rows, check_seconds, build_seconds


def cell(side):
    return "(none)" if side is None else side.label


def report(rows):
    table(["case", "target", "check", "build", "agree"],
          [[row.case, row.target, cell(row.check), cell(row.build), "yes" if row.agrees else "NO"] for row in rows],
          left=5)
    disagreements = [row for row in rows if not row.agrees]
    for row in disagreements:
        print(f"\nDISAGREE {row.case} {row.target}:")
        for side, name in ((row.check, "check"), (row.build, "build")):
            print(f"  {name}: {cell(side)}" + (f": {side.detail}" if side and side.detail else ""))
    both_blocked = [row for row in rows if row.agrees and not row.check.delivers and row.check.task and row.build.task]
    elsewhere = [row for row in both_blocked if row.check.task != row.build.task]
    for row in elsewhere:
        print(f"note: {row.case} {row.target}: check blames {row.check.task}, the build {row.build.task}")
    below = sum(row.agrees and row.build.label == "FAILED verification" for row in rows)
    print(f"\n{len(rows) - len(disagreements)} of {len(rows)} agree ({below} of them built and below their "
          f"thresholds, counted as delivered; where both block, the same task named in "
          f"{len(both_blocked) - len(elsewhere)} of {len(both_blocked)})")
    return disagreements


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="cases by name (models/gpu), short name (gpu) or "
                                                              "group (examples, models, corpus)")
    parser.add_argument("--skip-examples", action="store_true", help="leave out the bundled examples (MobileNetV2)")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the projects there and keep them")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    chosen = select(cases(), args)
    if args.list:
        width = max(len(case.name) for case in chosen)
        for case in chosen:
            print(f"{case.name:<{width}}  {case.what}")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="check-agreement-"))
    base = args.keep or scratch
    env = {**bytecode_env(scratch), "MOBILEBUILD_CACHE": "off"}  # cold: every check computes, every case alone
    rows, started = [], time.perf_counter()
    try:
        for index, case in enumerate(chosen, 1):
            case_rows, check_seconds, build_seconds = measure_case(case, base / case.name.replace("/", "-"), env)
            rows += case_rows
            agreeing = sum(row.agrees for row in case_rows)
            print(f"[{index}/{len(chosen)}] {case.name}: {agreeing} of {len(case_rows)} agree (check "
                  f"{check_seconds:.1f} s, build {build_seconds:.1f} s)", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    disagreements = report(rows)
    print(f"{len(chosen)} cases in {time.perf_counter() - started:.0f} s")
    return verdict(not disagreements, f"{len(rows) - len(disagreements)} of {len(rows)} target verdicts of "
                                      f"`mobilebuild check` agree with the build (target: all)")


if __name__ == "__main__":
    sys.exit(main())

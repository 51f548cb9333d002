"""What the report says, as data: every recipe's targets side by side against eager fp32, what to ship and why, and
the notes under each table. Plain text and numbers only: report_markdown and report_html render it alike, so both
always say the same thing; report.py writes them. The plots read its rows too. No torch here.

The input is the manifests the build writes. Any part of one may be missing (a stage not built yet, a benchmark
skipped, an older manifest without verification): the report shows what is there, says why the rest is not, and
never fails on it. The same manifests always give byte-identical files (no timestamps, dictionaries in sorted
order), so an unchanged build leaves the report unchanged.
"""

import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from mobilebuild.plan import routes
from mobilebuild.plan.routes import mapping as _dict  # a level of an untrusted file: a dict, or an empty one
from mobilebuild.plan.routes import text as _text  # a fact as a cell: NONE where absent
from mobilebuild.results import report_arm64

TITLE = "mobilebuild report"
EAGER = "eager"  # the benchmarks key of the eager fp32 baseline
EAGER_LABEL = "eager fp32"
NONE = routes.NONE  # a value that is absent or does not apply; the reason, when known, is given beside the table
PLOTS_DIR = "plots"

# (label, must be at least / at most) for the verification thresholds, in the table's column order; unknown
# names follow, sorted, as they are.
THRESHOLDS = {
    "sqnr_db": ("SQNR dB", ">="),
    "cosine": ("cosine", ">="),
    "max_rel_error": ("max rel. error", "<="),
    "top1_agreement": ("top-1 agreement", ">="),
    "accuracy_drop": ("accuracy drop", "<="),
    "agreement": ("greedy agreement", ">="),  # a language model's (generate:)
    "perplexity_ratio": ("perplexity ratio", "<="),
}
STATE_ORDER = ("passed", "failed", "not run on host", "not verified")
RELAXED = "passed (relaxed)"  # passed, against thresholds the recipe set looser than the defaults


# ---------------------------------------------------------------------------------------------- reading the input


def _get(mapping, key):
    """mapping[key], or None when either is missing or not what the format says: input is never trusted."""
    return mapping.get(key) if isinstance(mapping, dict) else None


def _number(value):
    """A real number as a float, else None (null, a string, a boolean: nothing to compute with)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def finite(value):
    """A number that can be plotted and divided: timings and sizes, where inf or nan mean a broken record."""
    value = _number(value)
    return value if value is not None and math.isfinite(value) else None


@dataclass
class Row:
    """One line of a recipe's table: a target, or the eager fp32 baseline."""

    label: str
    backend: str | None
    runtime: str | None
    precision: str | None
    size_bytes: float | None
    benchmark: dict
    verification: dict
    state: str  # "reference", "passed", "failed", "not run on host", "not verified", or whatever the manifest says
    status: str  # the state as shown
    target: dict = field(default_factory=dict)  # the manifest's entry (pruning, quantization); empty for eager
    reason: str | None = None  # why it has that state, where the manifest says
    arm64: dict = field(default_factory=dict)  # {CPU model: its result on that emulated ARM CPU} (report_arm64)

    @property
    def median_ms(self):
        return finite(self.timing("median_ms"))

    def timing(self, key):
        """A timing number, only from a benchmark that ran: a skipped one may carry stale or placeholder values."""
        if _get(self.benchmark, "status") not in ("ran", None):
            return None
        return self.benchmark.get(key)

    def metric(self, key):
        return _number(_get(_get(self.verification, "metrics"), key))


def _targets(manifest):
    """The manifest's targets; for an older manifest without them, the final artifacts that name a target."""
    targets = _get(manifest, "targets")
    if isinstance(targets, list):
        return [t for t in targets if isinstance(t, dict)]
    seen = {}
    for artifact in _get(manifest, "artifacts") or []:
        label = _get(artifact, "target")
        if label is not None:
            seen[label] = artifact  # the last stage listed for a target is the artifact it ships
    return list(seen.values())


def _target_bytes(target, manifest):
    size = finite(target.get("bytes"))
    if size is None:
        for artifact in _get(manifest, "artifacts") or []:
            if _get(artifact, "path") == target.get("path") and target.get("path") is not None:
                size = finite(artifact.get("bytes"))
    return size


def _status(target, verification):
    """(state, shown, reason): the target's own status first, then its verification's, else "not verified". What
    is shown stays short, so that the status column never wraps; the reason goes under the table."""
    state = target.get("status") or _get(verification, "status") or "not verified"
    reason = target.get("reason") or _get(verification, "reason")
    if state == "passed":
        return state, RELAXED if _get(verification, "relaxed") else "passed", None
    if state == "failed":
        return state, "FAILED", None  # the failures under the table say why
    return str(state), str(state), reason


def table_rows(manifest):
    """The eager fp32 baseline, then every target in the manifest's order."""
    benchmarks = _dict(_get(manifest, "benchmarks"))
    verifications = _dict(_get(manifest, "verification"))
    eager = _dict(benchmarks.get(EAGER))
    rows = [Row(EAGER_LABEL, None, _get(eager, "runtime") or EAGER, "fp32", finite(eager.get("artifact_bytes")),
                eager, {}, "reference", "reference")]
    for target in _targets(manifest):
        label = str(target.get("target") or target.get("backend") or "?")
        verification = _dict(verifications.get(label))
        state, shown, reason = _status(target, verification)
        rows.append(Row(label, target.get("backend"), target.get("runtime"),
                        target.get("precision") or _get(verification, "precision"), _target_bytes(target, manifest),
                        _dict(benchmarks.get(label)), verification, state, shown, target, reason,
                        report_arm64.results(manifest, label)))
    return rows


def load_manifests(artifacts_dir):
    """Every artifacts/*/manifest.json, sorted by recipe name; an unreadable one is skipped with a warning."""
    found = []
    for path in sorted(Path(artifacts_dir).glob("*/manifest.json")):
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            print(f"warning: {path}: skipped, not readable as JSON ({exc})", file=sys.stderr)
            continue
        if not isinstance(manifest, dict):
            print(f"warning: {path}: skipped, expected a JSON object, got {type(manifest).__name__}",
                  file=sys.stderr)
            continue
        found.append(manifest)
    return sorted(found, key=recipe_name)


# ------------------------------------------------------------------------------------------------------ formatting


def _fixed(value, digits):
    value = _number(value)
    return NONE if value is None else f"{value:.{digits}f}"


def two_or_three_decimals(value):
    """Two decimals, three below 1: a small model's 0.004 MB or 0.031 ms is not rounded to nothing."""
    value = _number(value)
    if value is None:
        return NONE
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def _megabytes(size_bytes):
    return NONE if size_bytes is None else two_or_three_decimals(size_bytes / 1e6)


def _ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator == 0:
        return NONE
    return f"{numerator / denominator:.2f}x"


def _scientific(value):
    value = _number(value)
    return NONE if value is None else f"{value:.2e}"


def _percent(value):
    value = _number(value)
    return NONE if value is None else f"{value:.1%}"


def _accuracy(row):
    reference, artifact = row.metric("accuracy_reference"), row.metric("accuracy_artifact")
    if reference is None and artifact is None:
        return NONE
    return f"{_percent(reference)} -> {_percent(artifact)}"


def _short(value):
    """A sha256 is shown by its first 12 digits: enough to tell builds apart, short enough to read."""
    text = str(value)
    return text[:12] if re.fullmatch(r"[0-9a-f]{64}", text) else text


def _pairs(mapping):
    return ", ".join(f"{key} {_short(value)}" for key, value in sorted(mapping.items(), key=lambda kv: str(kv[0])))


def _reasoned(status, reason):
    return f"{status} ({reason})" if reason else str(status)


def _relaxed(relaxed):
    """What the recipe relaxed, against the defaults: a verdict to read with that in mind."""
    if not relaxed:
        return ""
    shown = ", ".join(f"{THRESHOLDS.get(key, (key, ':'))[0]} {_dict(values).get('used')} (default "
                      f"{_dict(values).get('default')})" for key, values in relaxed.items())
    return f"; RELAXED by the recipe: {shown}"


def _threshold_order(thresholds):
    return [key for key in THRESHOLDS if key in thresholds] + sorted(
        (key for key in thresholds if key not in THRESHOLDS), key=str)


def _thresholds(thresholds):
    shown = []
    for key in _threshold_order(thresholds):
        label, direction = THRESHOLDS.get(key, (key, ":"))
        shown.append(f"{label} {direction} {thresholds[key]}")
    return ", ".join(shown)


# ------------------------------------------------------------------------------------------------- the report model


@dataclass(frozen=True)
class Column:
    name: str
    group: str  # the heading it sits under in HTML ("" for none); Markdown has no grouped headings
    numeric: bool  # right-aligned
    cell: Callable  # (row) -> its text


@dataclass
class Table:
    columns: list[Column]
    cells: list[list[str]]  # per row, per column
    states: list[str]  # per row, for highlighting

    @property
    def header(self):
        return [column.name for column in self.columns]

    @property
    def numeric(self):
        return [column.numeric for column in self.columns]

    def groups(self):
        """[(heading, span)] over the columns, in order."""
        found = []
        for column in self.columns:
            if found and found[-1][0] == column.group:
                found[-1] = (column.group, found[-1][1] + 1)
            else:
                found.append((column.group, 1))
        return found


@dataclass
class Section:
    recipe: str
    rows: list[Row]
    about: list[str]
    recommendation: list[str]  # what to ship, and why: its first line answers the question
    table: Table  # what a person compares: status, latency, size, quality
    details: Table | None  # the rest, per target: compression, other metrics, the graph; None when all empty
    failures: list[str]
    notes: list[str]
    plot: str | None = None  # its figure's file name under plots/
    no_plots: str | None = None
    layers: Table | None = None  # per int8 target, the layers that add the most error (worker/stages/layers.py)
    layers_notes: list[str] = field(default_factory=list)  # how each target's layers were compared, what failed
    arm64: Table | None = None  # each CPU artifact on emulated ARM CPUs (report_arm64)
    arm64_notes: list[str] = field(default_factory=list)
    generation: Table | None = None  # a language model's (generate:) token-by-token results, eager first


@dataclass
class Report:
    about: list[str]
    summary: list[str]
    sections: list[Section]
    summary_states: list[str] = field(default_factory=list)  # per summary line: "not-built", "failed" or "built"


def recipe_name(manifest):
    return str(_get(manifest, "recipe") or "unnamed")


def file_stem(recipe):
    """A recipe name safe as a file name (names are validated at build time; a hand-edited manifest is not)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", recipe).lstrip(".") or "unnamed"


def plot_name(recipe):
    """The recipe's figure under plots/, as the plot stage writes it (plan.graph)."""
    return f"{file_stem(recipe)}.png"


def plot_href(filename):
    """The figure's address, relative to the report."""
    return f"{PLOTS_DIR}/{quote(filename)}"


def plot_title(recipe):
    return f"{recipe}: median latency on the host (p10-p90), and size and quality against it"


def family(row):
    """'ExecuTorch': the runtime family of a target (a row), as its route names it; its runtime's name where no
    route is known."""
    return {**routes.families(), EAGER: "PyTorch eager"}.get(row.runtime, _text(row.runtime))


def layer_method(name):
    """'FX numeric suite': how a target's layers were compared (the manifest's `layers.<target>.method`), as the
    route that compares that way describes it."""
    return _text(routes.layer_methods().get(name, name))


def _runs_on(row):
    """'ExecuTorch, xnnpack, int8': the runtime family, the backend, the precision."""
    return ", ".join(part for part in (family(row), row.backend, row.precision) if part)


def reference_accuracy(rows):
    """Eager fp32's accuracy, as the targets' verifications measured it. A pruned target's reference is its pruned
    eager model: the accuracy comes from an unpruned one."""
    return next((r.metric("accuracy_reference") for r in rows
                 if r.metric("accuracy_reference") is not None and not _get(r.target, "pruning")), None)


def _main_table(rows):
    eager = rows[0]
    quality = "quality vs eager fp32"
    columns = [
        Column("target", "", False, lambda row: row.label),
        Column("status", "", False, lambda row: row.status),
        Column("runs on", "", False, _runs_on),
        Column("median (ms)", "latency on the host", True, lambda row: two_or_three_decimals(row.median_ms)),
        Column("p90 (ms)", "latency on the host", True, lambda row: two_or_three_decimals(row.timing("p90_ms"))),
        Column("speed-up", "latency on the host", True, lambda row: _ratio(eager.median_ms, row.median_ms)),
        Column("MB", "size", True, lambda row: _megabytes(row.size_bytes)),
        Column("vs eager", "size", True, lambda row: _ratio(row.size_bytes, eager.size_bytes)),
        Column("SQNR (dB)", quality, True, lambda row: _fixed(row.metric("sqnr_db"), 1)),
        Column("top-1 agreement", quality, True, lambda row: _fixed(row.metric("top1_agreement"), 3)),
    ]
    if any(row.metric("accuracy_reference") is not None or row.metric("accuracy_artifact") is not None
           for row in rows):
        reference = reference_accuracy(rows)
        columns.append(Column("accuracy", quality, True,
                              lambda row: _percent(reference) if row is eager else _accuracy(row)))
    if any(isinstance(_get(row.verification, "against_unpruned"), dict) for row in rows):
        columns.append(Column("vs unpruned fp32", quality, True, _against_unpruned))
    return _filled(columns, rows)


def _against_unpruned(row):
    """A pruned target's loss against the model before pruning ('-9.2 pt accuracy'): its other columns compare it
    with the pruned model, whose verdict alone reads "passed"."""
    against = _dict(_get(row.verification, "against_unpruned"))
    reference, artifact = _number(against.get("accuracy_reference")), _number(against.get("accuracy_artifact"))
    if reference is not None and artifact is not None:
        return f"{(artifact - reference) * 100:+.1f} pt accuracy"
    agreement, sqnr = _number(against.get("top1_agreement")), _number(against.get("sqnr_db"))
    if agreement is not None:
        return f"top-1 {agreement:.3f}"
    return f"SQNR {sqnr:.1f} dB" if sqnr is not None else NONE


def _details_table(rows):
    """The columns a person reads for one target rather than compares: only those with something in them."""
    columns = [
        Column("target", "", False, lambda row: row.label),
        Column("compression", "", False, _compression),
        Column("zipped (MB)", "", True, lambda row: _megabytes(finite(row.benchmark.get("artifact_compressed_bytes")))),
        Column("sparsity", "", True, lambda row: _percent(_number(_get(_get(row.verification, "sparsity"),
                                                                          "overall")))),
        Column("cosine", "", True, lambda row: _fixed(row.metric("cosine"), 6)),
        Column("max rel. error", "", True, lambda row: _scientific(row.metric("max_rel_error"))),
        Column("graph (host-checked)", "", False, lambda row: _structure(row) or NONE),
    ]
    table = _filled(columns, rows)
    kept = [index for index in range(len(columns)) if index == 0 or any(cells[index] != NONE
                                                                         for cells in table.cells)]
    if len(kept) == 1:
        return None
    return Table([columns[i] for i in kept], [[cells[i] for i in kept] for cells in table.cells], table.states)


def _filled(columns, rows):
    return Table(columns, [[column.cell(row) for column in columns] for row in rows], [row.state for row in rows])


# --------------------------------------------------------------------------------------- what to ship, and why


def _missed(metrics, thresholds):
    """'SQNR dB 13.2 < 15' for each threshold a measured metric misses; unmeasured ones are not judged."""
    missed = []
    for key in _threshold_order(thresholds):
        value, limit = _number(_get(metrics, key)), _number(thresholds[key])
        label, direction = THRESHOLDS.get(key, (key, None))
        if value is None or limit is None or direction is None:
            continue
        if (direction == ">=" and value < limit) or (direction == "<=" and value > limit):
            missed.append(f"{label} {value:.3g} {'<' if direction == '>=' else '>'} {limit:g}")
    return missed


def shortfall(row):
    """Why a target is not a candidate to ship (None when it is): it must be verified on this host and pass the
    schema's default thresholds, not only the ones its recipe relaxed, against the unpruned model too."""
    if row.state == "failed":
        missed = _missed(_dict(_get(row.verification, "metrics")), _dict(_get(row.verification, "thresholds")))
        return f"FAILED ({', '.join(missed)})" if missed else "FAILED"
    if row.state != "passed":
        return row.status
    on_arm = report_arm64.failed(row.arm64)
    if on_arm:
        return f"FAILED {on_arm}"
    if row.median_ms is None:
        return "no host benchmark"
    used = _dict(_get(row.verification, "thresholds"))
    defaults = {**used, **{key: _get(values, "default") for key, values in
                           _dict(_get(row.verification, "relaxed")).items()}}
    missed = _missed(_dict(_get(row.verification, "metrics")), defaults)
    if missed:
        return f"passed only with relaxed thresholds ({', '.join(missed)})"
    against = _get(row.verification, "against_unpruned")
    missed = _missed(_dict(against), defaults) if isinstance(against, dict) else []
    if missed:
        return f"against the unpruned fp32 model: {', '.join(missed)}"
    return None


def _quality(row):
    """'accuracy 90.3%, top-1 agreement 0.920': what the artifact gives up, in the measures that were taken."""
    accuracy, sqnr, agreement = row.metric("accuracy_artifact"), row.metric("sqnr_db"), row.metric("top1_agreement")
    parts = [f"accuracy {_percent(accuracy)}" if accuracy is not None else
             f"SQNR {_fixed(sqnr, 1)} dB" if sqnr is not None else None]
    if agreement is not None:
        parts.append(f"top-1 agreement {_fixed(agreement, 3)}")
    return ", ".join(part for part in parts if part) or "no quality measured"


def _pitch(row, eager):
    speed = _ratio(eager.median_ms, row.median_ms)
    # eager's harness, where another timed the row (a language model's engine against eager's generator)
    harness = _get(eager.benchmark, "harness")
    other = f", timed by {harness}" if harness and _get(row.benchmark, "harness") not in (None, harness) else ""
    return (f"{two_or_three_decimals(row.median_ms)} ms median"
            + (f" ({speed} eager fp32{other})" if speed != NONE else "")
            + f", {_megabytes(row.size_bytes)} MB, {_quality(row)}")


def _spread(row):
    """(p10, p90) of a row's timed iterations; the median stands in for one not recorded."""
    median = row.median_ms
    low, high = finite(row.timing("p10_ms")), finite(row.timing("p90_ms"))
    return (min(median, low) if low is not None else median, max(median, high) if high is not None else median)


def _overlap(first, second):
    """Whether two host medians are closer than their spread: either inside the other's p10-p90."""
    (low, high), (other_low, other_high) = _spread(first), _spread(second)
    return other_low <= first.median_ms <= other_high or low <= second.median_ms <= high


def _host_caveat(candidates):
    """What the timings the pick rests on are: this machine's CPU, not a phone's."""
    cpus = sorted({str(_get(_get(row.benchmark, "host"), "cpu")) for row in candidates
                   if _get(_get(row.benchmark, "host"), "cpu")})
    threads = sorted({str(row.benchmark.get("threads")) for row in candidates if row.benchmark.get("threads")})
    where = f" ({'; '.join(cpus)}{', ' + '/'.join(threads) + ' thread(s)' if threads else ''})" if cpus else ""
    return (f"Speed here is the build host's CPU{where}, not a phone's: a device's CPU, and its NPU or GPU delegates, "
            "may rank these artifacts otherwise; time them on the device (benchmark.device) before choosing on speed.")


def unranked(row):
    """Why its route's host timings are no candidate's (ncnn's Vulkan path on a software driver), or None."""
    route = routes.get(row.backend, row.runtime)
    return route.runs_in.unranked if route is not None else None


def recommend(rows):
    """Lines that answer "which artifact do I ship?": the fastest host-verified artifact that passes the default
    thresholds, the best of each runtime family, what is faster but left out (and why), what only a device can
    measure. A language model's rows are each timed by what its app runs (lm_bench: the engine its family embeds,
    else its runtime's generator): the line names the harness, or where they differ the generation table does."""
    eager, targets = rows[0], rows[1:]
    if not targets:
        return []
    why = {row.label: shortfall(row) or unranked(row) for row in targets}  # None: a candidate
    candidates = sorted((row for row in targets if why[row.label] is None), key=lambda row: row.median_ms)
    lines = []
    if candidates:
        best = candidates[0]
        harnesses = {_get(row.benchmark, "harness") for row in candidates} - {None}
        timed = (f", each timed by {harnesses.pop()}" if len(harnesses) == 1 else
                 ", each timed by what its app runs (the generation table's 'timed by')" if harnesses else "")
        lines.append(f"Ship {best.label} ({_runs_on(best)}): the fastest of {len(candidates)} artifact(s) verified "
                     f"on this host that pass the default thresholds{timed}; {_pitch(best, eager)}.")
        lines.append(_host_caveat(candidates))
        tied = [row for row in candidates[1:] if _overlap(best, row)]
        if tied:
            lines.append(f"Not told apart by this run: {best.label} and "
                         + ", ".join(f"{row.label} ({two_or_three_decimals(row.median_ms)} ms)" for row in tied)
                         + ", whose medians lie within the other's p10-p90 spread of timed iterations; choose among "
                           "them by size or quality, or time them on the device.")
        lines += report_arm64.lines(candidates, [best, *tied])
        families = {}
        for row in candidates:
            families.setdefault(family(row), row)
        missing = sorted({family(row) for row in targets if row.median_ms is not None} - set(families))
        if len(families) > 1 or missing:
            shown = [f"{name}: {row.label} ({two_or_three_decimals(row.median_ms)} ms)" for name, row in
                     families.items()] + [f"{name}: none passes" for name in missing]
            lines.append(f"Best per runtime: {'; '.join(shown)}.")
        limit = best.median_ms
    else:
        lines.append("Nothing to ship yet: no artifact verified on this host passes the default thresholds.")
        limit = math.inf
    left_out = [row for row in targets if row.median_ms is not None and row.median_ms < limit
                and why[row.label] is not None]
    if left_out:
        lines.append(("Faster, but left out: " if candidates else "Left out: ") + "; ".join(
            f"{row.label} ({two_or_three_decimals(row.median_ms)} ms): {why[row.label]}"
            for row in sorted(left_out, key=lambda row: row.median_ms)) + ".")
    device = [row for row in targets if row.state == "not run on host"]
    if device:
        lines.append("To measure on a device (built; this host cannot run them): "
                     + ", ".join(f"{row.label} ({_runs_on(row)})" for row in device) + ".")
    return lines


def _compression(row):
    """What was done to the weights beyond the precision: pruning, and the quantization mode of int8 targets."""
    parts = []
    pruning = _dict(_get(row.target, "pruning"))
    if pruning:
        parts.append(f"{pruning.get('method', 'pruned')} {_text(pruning.get('amount'))}")
    quantization = _dict(_get(row.target, "quantization"))
    if quantization:
        parts.append(" ".join(_text(v) for v in (quantization.get("mode"), quantization.get("weights")) if v))
    return ", ".join(parts) or NONE


def _structure(row):
    """What the host read from the artifact itself, as its route summarises it: how much went to the delegate
    (ExecuTorch), the NNAPI model's size, the ONNX graph's quantized share."""
    route = routes.get(row.backend, row.runtime)
    facts = _dict(_get(row.verification, "artifact"))
    return route.runs_in.structure(facts) if route is not None and route.runs_in.structure is not None else ""


def _artifact_notes(rows):
    """What each artifact's route notes of what the host read from it (Runtime.notes: the operators an ExecuTorch
    program runs outside its delegate), a line per note naming the targets it holds for."""
    said = []
    for row in rows:
        route = routes.get(row.backend, row.runtime)
        if route is not None and route.runs_in.notes is not None:
            said += [(row.label, line) for line in route.runs_in.notes(_dict(_get(row.verification, "artifact")))]
    return [f"{line} ({', '.join(labels)})" for line, labels in _grouped(said).items()]


def _failures(rows):
    found = []
    for row in rows[1:]:
        messages = [str(m) for m in _get(row.verification, "failures") or []]
        if row.state == "failed" and not messages:
            reason = row.target.get("reason") or _get(row.verification, "reason")
            messages = [str(reason or "no failure message in the manifest")]
        messages += [str(m) for result in row.arm64.values() for m in result.get("failures") or []]
        found.extend(f"{row.label}: {message}" for message in messages)
    return found


def _grouped(items):
    """[(label, description)] -> one line per distinct description, naming the labels that share it."""
    groups = {}
    for label, description in items:
        groups.setdefault(description, []).append(label)
    return groups


def _isolation(benchmark):
    """How a timing was kept apart from the build's stages (worker/measure_alone.py)."""
    taken = _dict(benchmark.get("isolation"))
    if taken.get("policy") == "reserved core":
        return f", on core {_text(taken.get('core'))} set aside for measuring (stages ran on the others)"
    if taken.get("policy") == "cleared core":
        cores = ", ".join(_text(core) for core in taken.get("cores") or [taken.get("core")])
        return (f", on core {cores} cleared of the {_text(taken.get('stages'))} stage(s) still running after the "
                "wait for them (they went on on the others)")
    return ", with no other stage running" if taken else ""


def _notes(rows):
    why = _grouped((row.label, (row.state, row.reason)) for row in rows[1:] if row.reason)
    notes = [f"{state} ({', '.join(labels)}): {reason}" for (state, reason), labels in why.items()]
    for row in rows:
        status = _get(row.benchmark, "status")
        if not row.benchmark:
            consequence = ": no speed-up or size ratio" if row is rows[0] else ""
            notes.append(f"benchmark {row.label}: not run (none in the manifest){consequence}")
        elif status not in ("ran", None) and _get(row.benchmark, "reason") != row.reason:  # not said just above
            notes.append(f"benchmark {row.label}: {_reasoned(status, _get(row.benchmark, 'reason'))}")

    settings = _grouped(
        (row.label, f"{_text(row.benchmark.get('threads'))} thread(s), {_text(row.benchmark.get('warmup'))} warm-up "
                    f"and {_text(row.benchmark.get('iters'))} timed iterations on the host{_isolation(row.benchmark)}")
        for row in rows if row.median_ms is not None)
    notes.extend(f"latency ({', '.join(labels)}): {text}" for text, labels in settings.items())

    # a language model's timings: the engine its family's apps embed (no Python between steps), else its runtime's
    # generator from Python, which also cross-checks every engine's row (docs/llm.md)
    harnesses = _grouped((row.label, row.benchmark["harness"]) for row in rows if "harness" in row.benchmark)
    if len(harnesses) > 1:
        notes.extend(f"timed by ({', '.join(labels)}): {text}" for text, labels in harnesses.items())
    checked = [row.label for row in rows if _cross_check(row)]
    if checked:
        notes.append(f"cross-check ({', '.join(checked)}): also timed by its runtime's generator from Python, the "
                     "harness of the rows without an engine: the generation table's generator columns, not ranked")

    devices = _grouped((row.label, _device(row.benchmark["device"])) for row in rows if "device" in row.benchmark)
    benchmarked = [row.label for row in rows if row.benchmark]
    for text, labels in devices.items():
        notes.append(f"device: {text}" if labels == benchmarked else f"device ({', '.join(labels)}): {text}")

    verified = _grouped(
        (row.label, f"{_text(_get(row.verification, 'samples'))} {_text(_get(row.verification, 'data'))} samples"
                    f"{_sizes(_dict(_get(row.verification, 'sizes')))}; "
                    f"thresholds: {_thresholds(_dict(_get(row.verification, 'thresholds'))) or NONE}"
                    f"{_relaxed(_dict(_get(row.verification, 'relaxed')))}")
        for row in rows[1:] if isinstance(_get(row.verification, "metrics"), dict))  # only what was checked
    notes.extend(f"verification ({', '.join(labels)}): {text}" for text, labels in verified.items())
    mismatched = _grouped((row.label, _get(row.verification, "data_note")) for row in rows[1:]
                          if _get(row.verification, "data_note"))
    notes.extend(f"verification data ({', '.join(labels)}): {text}" for text, labels in mismatched.items())
    degenerate = _grouped((row.label, _get(row.verification, "reference_note")) for row in rows[1:]
                          if _get(row.verification, "reference_note"))
    notes.extend(f"eager reference ({', '.join(labels)}): {text}" for text, labels in degenerate.items())
    fixed = _grouped((row.label, _get(row.verification, "fixed_shape")) for row in rows[1:]
                     if _get(row.verification, "fixed_shape"))
    notes.extend(f"sizes ({', '.join(labels)}): {text}" for text, labels in fixed.items())
    for row in rows[1:]:  # what pruning cost, beside the verdict against the pruned model
        summary = _get(_get(row.verification, "against_unpruned"), "summary")
        if summary:
            notes.append(f"against the unpruned fp32 model ({row.label}): {summary}")
    notes.extend(_artifact_notes(rows))
    return notes


def _sizes(sizes):
    """' at the dims' min (4), example (32) and max (64) sizes': where a model with dynamic dims was checked."""
    if not sizes:
        return ""
    order = ("min", "example", "max")
    shown = []
    for size, found in sorted(sizes.items(), key=lambda item: order.index(item[0]) if item[0] in order else 3):
        shapes = _dict(_get(found, "shapes"))
        first = next(iter(shapes.values()), None)
        shown.append(f"{_text(size)} {_text(first)}" if first is not None else _text(size))
    return f" at the {', '.join(shown)} sizes"


def _device(device):
    if not isinstance(device, dict):
        return _text(device)
    shown = _reasoned(device.get("status") or "unknown", device.get("reason"))
    if device.get("serial"):
        shown += f" on {device['serial']}"
    # speed_benchmark_torch reports total time / iterations, a mean: it is named as such, never as a median.
    for key, name in (("median_ms", "median"), ("mean_ms", "mean")):
        value = finite(device.get(key))
        if value is not None:
            return f"{shown}, {name} {value:.2f} ms"
    return shown


def _section(manifest):
    recipe = recipe_name(manifest)
    rows = table_rows(manifest)
    about = []
    if _get(manifest, "recipe_file") or _get(manifest, "recipe_sha256"):
        about.append(f"Recipe {_text(_get(manifest, 'recipe_file'))}, sha256 "
                     f"{_short(_text(_get(manifest, 'recipe_sha256')))}.")
    interface = _interface(manifest)
    if interface:
        about.append(interface)
    if not isinstance(_get(manifest, "targets"), list):
        about.append("This manifest lists no targets, verification or benchmarks (written by an older mobilebuild?): "
                     "targets are taken from its artifacts.")
    section = Section(recipe, rows, about, recommend(rows), _main_table(rows), _details_table(rows),
                      _failures(rows), _notes(rows))
    section.layers, section.layers_notes = _layers(manifest, rows)
    section.arm64 = report_arm64.table(rows[1:], Table, Column)
    section.arm64_notes = report_arm64.notes(rows[1:])
    section.generation = _generation(rows)
    if any(row.median_ms is not None for row in rows):
        section.plot = plot_name(recipe)
    else:
        section.no_plots = "No plots: no benchmark ran for this recipe."
    return section


GENERATION_TITLE = ("Generation, token by token (a language model with its KV cache; the main table's latency is one "
                    "decode step, timed by what an app runs: the engine its family embeds where it has one, else its "
                    "runtime's generator from Python, which cross-checks the engines' rows): time to first token per "
                    "prompt length, greedy agreement with eager, the lowest logits SQNR, held-out perplexity")


def _cross_check(row):
    """The generator's timings of a row an engine timed (lm_bench), {} where there are none."""
    return _dict(_get(row.benchmark, "generator")) if row.timing("median_ms") is not None else {}


def _per_length(timings, key, digits):
    lengths = _dict(_get(timings, "prompt_lengths"))
    return ", ".join(f"{length}: {_fixed(_get(values, key), digits)}" for length, values in lengths.items()) or NONE


def _on_device(row):
    """What the device run of a language model's artifact found, or that there was none."""
    found = _dict(_get(row.benchmark, "device"))
    if found.get("status") != "ran":
        return "not measured on a device"
    lengths = _dict(found.get("prompt_lengths"))
    return ", ".join(f"{length}: TTFT {_fixed(_get(values, 'ttft_ms'), 0)} ms, "
                     f"{_fixed(_get(values, 'decode_ms_per_token'), 1)} ms/token" for length, values in lengths.items()
                     ) + f" on {found.get('serial')}"


RANKED = "what an app runs (ranked)"
CROSS_CHECK = "its runtime's generator, from Python (cross-check)"
GENERATION_COLUMNS = [
    Column("target", "", False, lambda row: row.label),
    Column("precision", "", False, lambda row: _text(row.precision)),
    Column("status", "", False, lambda row: row.status),
    Column("size (MB)", "", True, lambda row: _megabytes(row.size_bytes)),
    Column("timed by", RANKED, False, lambda row: _text(_get(row.benchmark, "harness"))
           if row.timing("median_ms") is not None else NONE),
    Column("TTFT ms (prompt length: ms)", RANKED, True, lambda row: _per_length(row.benchmark, "ttft_ms", 2)),
    Column("decode tokens/s", RANKED, True, lambda row: _fixed(finite(_get(row.benchmark, "decode_tokens_per_s")), 0)),
    Column("generator TTFT ms", CROSS_CHECK, True, lambda row: _per_length(_cross_check(row), "ttft_ms", 2)
           if _cross_check(row) else NONE),
    Column("generator decode tokens/s", CROSS_CHECK, True,
           lambda row: _fixed(finite(_get(_cross_check(row), "decode_tokens_per_s")), 0)),
    Column("peak RSS (MB)", "", True, lambda row: _fixed(finite(_get(row.benchmark, "peak_rss_mb")), 0)),
    Column("greedy agreement", "", True, lambda row: _fixed(row.metric("agreement"), 3)),
    Column("SQNR (dB)", "", True, lambda row: _fixed(row.metric("sqnr_db"), 1)),
    Column("perplexity", "", True, lambda row: _fixed(row.metric("perplexity_artifact"), 3)),
    Column("eager perplexity", "", True, lambda row: _fixed(row.metric("perplexity_eager"), 3)),
    Column("on a device (prompt length: the runner's figures)", "", False, _on_device),
]


def _generation(rows):
    """The token-by-token table of a language model's recipe, or None for any other."""
    if not any(_get(row.benchmark, "generation") or _get(row.verification, "generation") for row in rows):
        return None
    # the cross-check's columns only where an engine timed a row
    columns = [column for column in GENERATION_COLUMNS if column.group != CROSS_CHECK or any(map(_cross_check, rows))]
    return Table(columns, [[column.cell(row) for column in columns] for row in rows], [row.state for row in rows])


LAYERS_TITLE = "Worst layers of the int8 artifacts (each layer fed the float model's inputs; lowest SQNR first)"
LAYER_COLUMNS = [
    Column("target", "", False, lambda item: item[0]),
    Column("#", "", True, lambda item: str(item[1])),
    Column("layer", "", False, lambda item: _text(_get(item[2], "name"))),
    Column("op", "", False, lambda item: _text(_get(item[2], "op"))),
    Column("SQNR (dB)", "", True, lambda item: _fixed(_number(_get(item[2], "sqnr_db")), 1)),
]


def _layers(manifest, rows):
    """(a table of each int8 target's worst layers, worst first, and a line per target on how they were compared):
    the manifest's per-layer comparisons, in the main table's order of targets."""
    found = _dict(_get(manifest, "layers"))
    items, notes, states = [], [], []
    for row in rows[1:]:
        result = _dict(found.get(_get(row.target, "target")))
        if not result:
            continue
        if _get(result, "error"):
            notes.append(f"worst layers ({row.label}): {_text(result['error'])}")
            continue
        ranked = [layer for layer in (_get(result, "layers") or []) if isinstance(layer, dict)]
        items += [(row.label, rank, layer) for rank, layer in enumerate(ranked, 1)]
        states += [row.state] * len(ranked)
        method = layer_method(_get(result, "method"))
        seconds = _number(_get(result, "seconds"))
        notes.append(f"worst layers ({row.label}): {method}, {_text(_get(result, 'compared'))} layers compared on "
                     f"{_text(_get(result, 'samples'))} {_text(_get(result, 'data'))} samples"
                     + (f", {seconds:.1f} s" if seconds is not None else ""))
        uncompared = [layer for layer in (_get(result, "not_compared") or []) if isinstance(layer, dict)]
        if uncompared:  # layers with no SQNR (int8 gives NaN where float does not, ...): said, not ranked
            notes.append(f"no SQNR ({row.label}): " + "; ".join(
                f"{_text(_get(layer, 'name'))} ({_text(_get(layer, 'op'))}): {_text(_get(layer, 'reason'))}"
                for layer in uncompared))
    if not items:
        return None, notes
    return Table(LAYER_COLUMNS, [[column.cell(item) for column in LAYER_COLUMNS] for item in items], states), notes


def _interface(manifest):
    """'Inputs: ids [1, seq] int64 in [0, 64), ...; seq from 4 to 64. Outputs: scores [1, 4] float32.': what an app
    feeds the model and reads from it."""
    inputs = [spec for spec in (_get(manifest, "inputs") or []) if isinstance(spec, dict)]
    if not inputs:
        return None
    dims, described = {}, []
    for spec in inputs:
        shape = [_text(size) for size in (spec.get("shape") if isinstance(spec.get("shape"), list) else [])]
        for dim in spec.get("dynamic") if isinstance(spec.get("dynamic"), list) else []:
            if isinstance(dim, dict) and isinstance(dim.get("axis"), int) and 0 <= dim["axis"] < len(shape):
                shape[dim["axis"]] = _text(dim.get("dim"))
                dims[_text(dim.get("dim"))] = f"from {_text(dim.get('min'))} to {_text(dim.get('max'))}"
        values = f" in [{', '.join(map(_text, spec['range']))})" if isinstance(spec.get("range"), list) else ""
        described.append(f"{_text(spec.get('name'))} [{', '.join(shape)}] {_text(spec.get('dtype'))}{values}")
    text = f"Inputs: {', '.join(described)}"
    text += "".join(f"; {name} {extent}" for name, extent in dims.items())
    outputs = next((_get(target, "outputs") for target in (_get(manifest, "targets") or [])
                    if isinstance(_get(target, "outputs"), list)), None)
    if outputs:
        text += ". Outputs: " + ", ".join(f"{_text(_get(out, 'name'))} {_text(_get(out, 'shape'))} "
                                          f"{_text(_get(out, 'dtype'))}" for out in outputs if isinstance(out, dict))
    return text + "."


def _distinct_lines(title, sourced, empty):
    """One line when every source agrees; otherwise one per distinct value, naming its sources."""
    groups = _grouped((source, _pairs(values)) for source, values in sourced if values)
    if not groups:
        return [f"{title}: {empty}"]
    if len(groups) == 1:
        return [f"{title}: {next(iter(groups))}"]
    return [f"{title} ({', '.join(sources)}): {text}" for text, sources in groups.items()]


def _summary(section):
    recipe, rows = section.recipe, section.rows
    states = Counter(row.state for row in rows[1:])
    order = [s for s in STATE_ORDER if s in states] + sorted(s for s in states if s not in STATE_ORDER)
    counts = ", ".join(f"{states[s]} {'FAILED' if s == 'failed' else s}" for s in order)
    return f"{recipe}: {len(rows) - 1} target(s){': ' + counts if counts else ''}"


def build(manifests, unbuilt=None):
    """The whole report as data, rendered alike to Markdown and HTML: both always say the same thing. `unbuilt`:
    {recipe: [error line, ...]} for recipes that failed to build, listed in the summary."""
    sections, toolchains, hosts = [], [], []
    summary = [f"{recipe}: NOT BUILT, {len(errors)} error(s): {'; '.join(errors)}"
               for recipe, errors in sorted((unbuilt or {}).items())]
    states = ["not-built"] * len(summary)
    for manifest in manifests:
        section = _section(manifest)
        sections.append(section)
        summary.append(_summary(section))
        states.append("failed" if any(row.state == "failed" for row in section.rows) else "built")
        toolchains.append((section.recipe, _dict(_get(manifest, "toolchain"))))
        for row in section.rows:
            if row.benchmark:
                source = f"{section.recipe} {row.label}"
                hosts.append((source, _dict(row.benchmark.get("host"))))
                # A benchmark run with another toolchain than the build's is worth seeing, so it is listed apart.
                measured_with = _dict(row.benchmark.get("toolchain"))
                if measured_with and measured_with != _dict(_get(manifest, "toolchain")):
                    toolchains.append((f"{source} benchmark", measured_with))
    about = (_distinct_lines("Toolchain", toolchains, "not recorded")
             + _distinct_lines("Host", hosts, "no benchmark recorded one"))
    return Report(about, summary, sections, states)

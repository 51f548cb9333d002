"""`mobilebuild check RECIPE [--json] [--target ID ...]`: the report as text (a line per target as it finishes, then
the findings) or JSON, and the exit status."""

import argparse
import json
import sys
from pathlib import Path

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.preflight.advice import BLOCKING, KINDS
from mobilebuild.preflight.whole_recipe import run

# What an "ok" covers: a target can pass check and still fail the build's verify, which compares its outputs.
STRUCTURE_ONLY = "check judges structure and host runs, not accuracy: the build's verify does"


def _status(findings):
    blocking = sum(item["kind"] in BLOCKING for item in findings)
    if blocking:
        return f"BLOCKED ({blocking})"
    return f"ok, {_counts(findings)}" if findings else "ok"


def _counts(findings):
    """'4 fallback, 1 advice': the findings that do not block, by kind."""
    counts = {kind: sum(item["kind"] == kind for item in findings) for kind in KINDS if kind not in BLOCKING}
    return ", ".join(f"{count} {kind}" for kind, count in counts.items() if count) or "0 advice"


def _table(findings, notes, indent="    "):
    if not findings and not notes:
        return []
    # A "where" wider than the column pushes its detail right, never into it: two spaces always part them.
    where_width = min(max([len(item["where"]) for item in findings] + [5]), 48)
    lines = [f"{indent}{'kind':<15}{'where':<{where_width}}  detail"] if findings else []
    order = {kind: index for index, kind in enumerate(KINDS)}
    for item in sorted(findings, key=lambda item: order[item["kind"]]):
        lines.append(f"{indent}{item['kind']:<15}{item['where']:<{where_width}}  {item['detail']}")
    lines += [f"{indent}note: {note}" for note in notes]
    return lines


def _route(result):
    delegate = f" -> {result['delegate']}" if result.get("delegate") else ""
    return f"{result['target']} ({result['backend']}, {result['runtime']}{delegate}, {result['precision']})"


def header(report):
    """The lines before any target has finished: the recipe, the versions, the model's own findings."""
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items() if version)
    model = report["model"]
    how = ("structure as the last check found it (same model, inputs, fusion and code)" if model.get("cached")
           else f"built and fused in {model['seconds']:.1f} s")
    lines = [f"{report['recipe']} ({report['file']}): {versions}", *_families(report.get("families")),
             f"model: {how}; all targets: {_status(model['findings'])} ({STRUCTURE_ONLY})"]
    return lines + _table(model["findings"], model["notes"])


def _families(families):
    """The route families installed, and what installs the others (plan.routes.installed_families)."""
    if not families:
        return []
    missing = "; ".join(line for line in families.values() if line)
    return [f"route families installed: {', '.join(name for name, line in families.items() if not line) or 'none'}"
            + (f"; not installed: {missing}" if missing else "")]


def target_line(result):
    """One target, as soon as it has finished: how its artifact came to be, and the verdict; a blocked target's line
    carries the first reason."""
    made = "not made" if result["made"] == "failed" else result["made"]
    blocking = [item for item in result["findings"] if item["kind"] in BLOCKING]
    if blocking:
        more = f" (and {len(blocking) - 1} more)" if len(blocking) > 1 else ""
        verdict = f"BLOCKED: {blocking[0]['where']}: {blocking[0]['detail']}{more}"
    else:
        verdict = _status(result["findings"])
    return f"{_route(result)}: {made} in {result['seconds']:.1f} s: {verdict}"


def footer(report):
    """The findings and notes of each target, then the verdict."""
    lines = []
    for result in report["targets"]:
        table = _table(result["findings"], result["notes"])
        if table:
            lines += [f"{result['target']}:", *table]
    verdict = "blocked" if report["blocking"] else f"no blocking findings ({STRUCTURE_ONLY})"
    every = report["model"]["findings"] + [item for result in report["targets"] for item in result["findings"]]
    lines.append(f"{report['blocking']} blocking, {_counts(every)}: {verdict} (exit {report['exit_code']})")
    return lines


def format(report):
    """The report as text: the header, a line per target, then each target's findings and the verdict."""
    return "\n".join([*header(report), *map(target_line, report["targets"]), *footer(report)])


def _say(lines, stream):
    for line in lines:
        print(line, file=stream, flush=True)


def check_command(argv):
    """`mobilebuild check RECIPE [--json] [--target ID ...]`: 0 when nothing blocks (warnings and advice only), 1 when a
    target is blocked (its build fails, or its artifact cannot run on this host), 2 for a bad recipe or command line.
    A line per target as it finishes (on stderr with --json, whose report alone goes to stdout)."""
    parser = argparse.ArgumentParser(prog="mobilebuild check", description="Pre-flight: build each target of a "
                                     "recipe up to its artifact with the build's own tasks (reusing and leaving what "
                                     "the build makes), run it on this host where it runs here, and say what blocks "
                                     "it, what falls back and which architecture advice applies.")
    parser.add_argument("recipe", type=Path, help="the recipe file (one under recipes/)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--target", action="append", metavar="ID", help="check only this target (repeatable)")
    try:
        options = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code
    progress = sys.stderr if options.json else sys.stdout
    try:
        report = run(options.recipe, Path.cwd(), targets=options.target,
                     on_model=lambda report: _say(header(report), progress),
                     on_target=lambda result: _say([target_line(result)], progress))
    except RecipeErrors as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 2
    except MobileBuildError as exc:
        print(exc, file=sys.stderr)
        return 2
    if options.json:
        print(json.dumps(report, indent=2))
    else:
        _say(footer(report), sys.stdout)
    return report["exit_code"]

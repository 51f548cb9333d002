"""`mobilebuild check RECIPE [--json] [--target ID ...]`: the report as text or JSON, and the exit status."""

import argparse
import json
import sys
from pathlib import Path

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.preflight.advice import BLOCKING, KINDS
from mobilebuild.preflight.whole_recipe import run
from mobilebuild.worker import measure_alone


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
    where_width = min(max([len(item["where"]) for item in findings] + [5]), 48)
    lines = [f"{indent}{'kind':<15}{'where':<{where_width + 2}}detail"] if findings else []
    order = {kind: index for index, kind in enumerate(KINDS)}
    for item in sorted(findings, key=lambda item: order[item["kind"]]):
        lines.append(f"{indent}{item['kind']:<15}{item['where']:<{where_width + 2}}{item['detail']}")
    lines += [f"{indent}note: {note}" for note in notes]
    return lines


def format(report):
    """The report as text: a header, then a table per target (the model's own findings first)."""
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items() if version)
    model = report["model"]
    lines = [f"{report['recipe']} ({report['file']}): {versions}",
             f"model: built and fused in {model['seconds']:.1f} s; all targets: {_status(model['findings'])}"]
    lines += _table(model["findings"], model["notes"])
    for result in report["targets"]:
        delegate = f" -> {result['delegate']}" if result.get("delegate") else ""
        lines.append(f"{result['target']} ({result['backend']}, {result['runtime']}{delegate}, {result['precision']})"
                     f" in {result['seconds']:.1f} s: {_status(result['findings'])}")
        lines += _table(result["findings"], result["notes"])
    verdict = "blocked" if report["blocking"] else "no blocking findings"
    every = model["findings"] + [item for result in report["targets"] for item in result["findings"]]
    lines.append(f"{report['blocking']} blocking, {_counts(every)}: {verdict} (exit {report['exit_code']})")
    return "\n".join(lines)


def check_command(argv):
    """`mobilebuild check RECIPE [--json] [--target ID ...]`: 0 when nothing blocks (advice only), 1 when a target
    cannot take the model as it is, 2 for a bad recipe or command line."""
    parser = argparse.ArgumentParser(prog="mobilebuild check", description="Before any build: what each target of a "
                                     "recipe cannot take of its model, and which architecture advice applies.")
    parser.add_argument("recipe", type=Path, help="the recipe file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--target", action="append", metavar="ID", help="check only this target (repeatable)")
    try:
        options = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code
    try:
        with measure_alone.stage_running():  # it converts and lowers models, as stages do: benchmarks measure alone
            report = run(options.recipe, Path.cwd(), targets=options.target)
    except RecipeErrors as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 2
    except MobileBuildError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if options.json else format(report))
    return report["exit_code"]

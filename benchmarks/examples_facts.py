"""docs/examples.md: what a build of the bundled examples made, written from that build, so that no page states a
count, a timing or a recommendation by hand (tests/test_docs.py checks the counts against the recipes).

From the repository root, after the README's main job (or with --build, which runs it: `doit` in this interpreter,
timed, with the machine's load average beside the time):

    .venv/bin/python benchmarks/examples_facts.py [--build [--cold]]

It then runs `doit` once more, which must find everything up to date, and records the line that run printed.
"""

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import mobilebuild.routes  # noqa: E402,F401 - the route families, which name each runtime as the report does
from mobilebuild.results import report_data  # noqa: E402 - the repository's own package, beside this script

OUT = REPO / "docs" / "examples.md"
MARK = "<!-- written by benchmarks/examples_facts.py from a build of the examples: run it again, do not edit -->"
UP_TO_DATE = re.compile(r"^all (\d+) tasks up to date: nothing to do$")


def doit(*args, env=None):
    """`doit` in the repository root, as the README's main job runs it; (seconds, load averages before and after,
    its output)."""
    before = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=REPO, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"doit failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds, before, os.getloadavg(), done.stdout


def recipe_lines(section):
    rows = section.rows[1:]
    built = [row for row in rows if row.size_bytes is not None]
    states = ", ".join(f"{sum(row.state == state for row in rows)} {state}" for state in
                       dict.fromkeys(row.state for row in rows))
    pick = section.recommendation[0] if section.recommendation else "no target"
    return f"| {section.recipe} | {len(rows)} | {len(built)} | {states} | {pick} |"


def outputs(output):
    """(outputs written, of which fetched from the shared artifact cache) by a build, from its lines."""
    written = [line for line in output.splitlines() if re.match(r"^   artifacts/\S+ \(", line)]
    return len(written), sum(line.endswith("(from the cache)") for line in written)


def write(build_seconds, loads, build_output=""):
    _, _, _, output = doit()
    line = output.strip().splitlines()[-1] if output.strip() else ""
    if not UP_TO_DATE.match(line):
        sys.exit(f"a second doit should find everything up to date; it printed: {line!r}")
    report = report_data.build(report_data.load_manifests(REPO / "artifacts"))
    sections = report.sections
    targets = sum(len(section.rows) - 1 for section in sections)
    built = sum(row.size_bytes is not None for section in sections for row in section.rows[1:])
    lines = ["# The bundled examples, as a build made them", "", MARK, "",
             "What `doit` made of `recipes/*.yaml` in the run that wrote this page. The recommendation is the "
             "report's first line for each recipe: it rests on host timings, and a run on another machine (or the "
             "same one under other load) may pick another target where two are close.", "",
             "| recipe | targets | artifacts built | states | the report's recommendation |",
             "|---|---:|---:|---|---|", *map(recipe_lines, sections), "",
             f"- {len(sections)} recipes, {targets} targets, {built} deployable artifacts built.",
             f"- A second `doit` printed one line: `{line}`.",
             *[f"- {about}" for about in report.about]]
    if build_seconds is not None:
        made, fetched = outputs(build_output)
        lines.append(f"- That build took {build_seconds:.0f} s on {os.cpu_count()} cores ({platform.machine()}), "
                     f"load average {loads[0][0]:.1f} before and {loads[1][0]:.1f} after it; {fetched} of the "
                     f"{made} outputs it wrote came from the shared artifact cache (a cold build computes them all). "
                     "It grows with the machine's load: benchmarks wait for other builds' stages on the host to "
                     "finish.")
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="run the build first, and time it")
    parser.add_argument("--cold", action="store_true", help="with --build: `doit clean` first, and build without "
                        "the shared artifact cache, as a first build on a new machine does")
    options = parser.parse_args()
    if options.build:
        env = None
        if options.cold:
            doit("clean")
            env = {**os.environ, "MOBILEBUILD_CACHE": "off"}
        seconds, before, after, output = doit(env=env)
        write(seconds, (before, after), output)
    else:
        write(None, None)


if __name__ == "__main__":
    main()

"""What both benchmarks share: timing a command as a subprocess (wall and CPU time, its own peak RSS), interleaved
repeats, medians, a plain table and the PASS/FAIL line."""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


@dataclass
class Run:
    seconds: float
    cpu_seconds: float  # user + system: less sensitive than wall time to other load on the machine
    peak_rss_mb: float
    returncode: int
    output: str  # stdout
    errors: str  # stderr


def bytecode_env(scratch):
    """Bytecode caching on, in a temporary folder: with PYTHONDONTWRITEBYTECODE (set in some sandboxes) every run
    would recompile mobilebuild's sources, which a developer's machine does once."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(Path(scratch) / "pycache")}


def measure(cmd, cwd, env=None):
    """Run `cmd` to completion. Output goes to files rather than pipes so reading it never paces the child;
    wait4 gives this child's own peak RSS (RUSAGE_CHILDREN would be the maximum over every child so far)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Run(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode,
                   out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def interleave(contenders, repeats, check=None):
    """{name: zero-argument callable returning a Run} -> {name: [Run, ...]}. The order flips every round so
    that neither contender always runs right after the other (caches, CPU frequency)."""
    runs = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else reversed(names):
            run = contenders[name]()
            if check:
                check(name, run)
            runs[name].append(run)
            print(f"  round {round_ + 1}/{repeats} {name}: {run.seconds:.3f} s", flush=True)
    return runs


def median(values):
    return statistics.median(values)


def table(header, rows, left=1):
    """Print rows of cells as aligned columns; the first `left` columns are left-aligned, the others right-aligned."""
    rows = [header, *rows]
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = [str(cell).ljust(w) if i < left else str(cell).rjust(w)
                 for i, (cell, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())


def summary(runs, baseline, contender, digits=3):
    """Print wall, CPU and peak RSS of two contenders side by side; return the ratio of median wall times."""
    def row(label, value, reduce=median, ratio=True, places=digits):
        base, other = (reduce(value(r) for r in runs[name]) for name in (baseline, contender))
        return [label, f"{base:.{places}f}", f"{other:.{places}f}", f"{other / base:.2f}x" if ratio else ""]

    rows = [row("wall median (s)", lambda r: r.seconds),
            row("wall min (s)", lambda r: r.seconds, min, False),
            row("wall max (s)", lambda r: r.seconds, max, False),
            row("CPU user+sys median (s)", lambda r: r.cpu_seconds),
            row("peak RSS median (MB)", lambda r: r.peak_rss_mb, places=1)]
    table(["", baseline, contender, "ratio"], rows)
    return median(r.seconds for r in runs[contender]) / median(r.seconds for r in runs[baseline])


def verdict(ok, message):
    print(f"{'PASS' if ok else 'FAIL'}: {message}")
    return 0 if ok else 1


def fail(message, run=None):
    """Stop the benchmark: a contender that fails or does the wrong work makes every number meaningless."""
    if run is not None:
        print(run.output[-3000:], run.errors[-3000:], sep="\n", file=sys.stderr)
    print(f"FAIL: {message}")
    sys.exit(1)

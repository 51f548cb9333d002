"""`mobilebuild tune RECIPE --target ID`: the int8 settings (layers kept float, observer) that meet the recipe's
thresholds with the fewest float layers.

The command: its options, and the search's rounds (search.py) built one doit run each by the session (session.py:
the generated recipe of the candidates, their outcomes), shown as they go by the table (table.py). No torch here: the
stages run in the build's workers (or on Dask).
"""

import argparse
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from mobilebuild.errors import MobileBuildError
from mobilebuild.tune import search
from mobilebuild.tune.session import TUNE_DIR, Refused, Session
from mobilebuild.tune.table import Table
from mobilebuild.worker import progress, quiet  # no torch there

DEFAULT_BUDGET = 16
__all__ = ["DEFAULT_BUDGET", "TUNE_DIR", "Refused", "Session", "parser", "tune", "tune_command"]


def parser():
    found = argparse.ArgumentParser(
        prog="mobilebuild tune", description="Find the int8 settings (layers kept float, observer) that meet the "
        "recipe's verification thresholds with the fewest float layers, or the layers a quantized language model "
        "target keeps float (docs/llm.md); every candidate is a cached build node.")
    found.add_argument("recipe", help="a recipe file of this repository")
    found.add_argument("--target", required=True, help="the int8 (or quantized language model) target's id")
    found.add_argument("--goal", action="append", default=[], metavar="recipe|defaults|NAME=VALUE",
                       help="what to meet: the recipe's verify.thresholds.int8 (a language model's "
                            "generate.thresholds) (default), the defaults, or a threshold set here (sqnr_db=25; "
                            "repeatable, over the others)")
    found.add_argument("--max-candidates", type=int, default=DEFAULT_BUDGET,
                       help=f"the most candidates built (default {DEFAULT_BUDGET})")
    found.add_argument("--dask", metavar="ADDRESS|local", help="run the stages on Dask workers")
    found.add_argument("-n", "--process", type=int, default=None, help="doit processes per round")
    found.add_argument("--write", action="store_true", help="apply the winning settings to the recipe file")
    found.add_argument("--no-cache", action="store_true", help="neither read nor fill the shared artifact cache")
    found.add_argument("--cache-read-only", action="store_true", help="read the shared artifact cache only")
    return found


def tune_command(args, root="."):
    options = parser().parse_args(args)
    if options.no_cache:
        os.environ["MOBILEBUILD_CACHE"] = "off"
    if options.cache_read_only:
        os.environ["MOBILEBUILD_CACHE_READ_ONLY"] = "1"
    try:
        if options.max_candidates < 1:
            raise Refused(f"mobilebuild tune: --max-candidates: expected at least 1, got {options.max_candidates}")
        session = Session(Path(root), options)
    except Refused as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 2
    # the table's rows say how far it is: the stages' progress lines, and each warning for every candidate, would
    # bury them (the workers, started by the first round, inherit both settings)
    with _dask(options.dask) as slots, quiet.shown_warnings_list(), quiet.environment(progress.SILENT, "1"):
        try:
            return tune(session, slots)
        except Refused as exc:
            for line in exc.lines:
                print(line, file=sys.stderr)
            return 2
        except MobileBuildError as exc:
            print(f"mobilebuild tune: {exc}", file=sys.stderr)
            return 1


@contextmanager
def _dask(address):
    """The number of doit threads a round runs in with `--dask` (as `mobilebuild build --dask`), or None."""
    if not address:
        yield None
        return
    from mobilebuild.engine import distributed

    with distributed.cluster(address) as slots:
        yield slots


def tune(session, slots):
    """The whole search: its rounds built, a row each candidate; then the winner and its patch. The exit status."""
    started = time.perf_counter()
    table = Table(session)
    table.started()
    layers = session.start()
    table.header()

    def ranking():
        found = session.ranking(layers)
        table.ranking(found)
        return session.excludable(found)

    first = True
    for batch in search.plan(session.observers, ranking, session.options.max_candidates, session.results):
        session.build(batch, slots, extra=[layers.task_name] if first else (), on_result=table.row)
        if first:
            session.check_goal(batch)
            if session.results[session.baseline].error:
                table.baseline_failed()
                return 1
        first = False
    table.summary(time.perf_counter() - started)
    chosen = search.winner(session.results)
    if chosen is None:
        table.no_winner(search.best_effort(session.results))
        return 1
    table.winner(chosen)
    table.proposal(session.propose(chosen))
    return 0

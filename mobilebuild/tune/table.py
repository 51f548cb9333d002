"""What `mobilebuild tune` prints of a Session (session.py): the goal, the table of candidates (a row as each is
built), the ranking the search walks, the summary and the winner's settings as a patch of the recipe."""

import sys

from mobilebuild.plan.recipe import TUNE_DIR
from mobilebuild.tune import patch
from mobilebuild.worker import metrics  # no torch there


class Table:
    """The lines of one tune, printed as the session goes."""

    COLUMNS = (("#", 3), ("float", 5), ("layers kept float", 30), ("observer", 15), ("SQNR dB", 8), ("top-1", 6),
               ("accuracy", 9), ("size", 9), ("host ms", 8))

    def __init__(self, session):
        self.session = session

    def started(self):
        session = self.session
        goal = ", ".join(f"{name} {'>=' if name in metrics.AT_LEAST else '<='} {value:g}"
                         for name, value in sorted(session.goal.items()) if value is not None)
        origin = session.threshold_field if session.from_recipe else "--goal"
        print(f"tuning {session.recipe.file} {session.target.id} ({session.route.backend}, {session.route.runtime}, "
              f"{session.precision}): {goal} ({origin}); at most {session.options.max_candidates} candidates",
              flush=True)

    def header(self):
        print("  ".join(f"{name:<{width}}" for name, width in self.COLUMNS) + "  verdict", flush=True)

    def cells(self, candidate):
        session = self.session
        outcome = session.results[candidate]
        found = outcome.metrics or {}
        accuracy = found.get("accuracy_artifact")
        values = (str(session.order.index(candidate) + 1), str(candidate.floats), shorten(candidate.exclude, 30),
                  session.effective[candidate.observer],
                  _number(found.get("sqnr_db"), ".2f"), _number(found.get("top1_agreement"), ".3f"),
                  _number(accuracy, ".3f"), _size(outcome.size_bytes), _number(outcome.median_ms, ".3f"))
        if outcome.error:
            verdict = f"not built: {outcome.error}"
        elif outcome.passed:
            verdict = "meets the goal"
        else:
            verdict = f"misses: {'; '.join(outcome.missed)}"
        return values, verdict

    def row(self, candidate):
        values, verdict = self.cells(candidate)
        print("  ".join(f"{value:<{width}}" for value, (_, width) in zip(values, self.COLUMNS)) + f"  {verdict}",
              flush=True)

    def ranking(self, found):
        print(f"ranking ({found.get('method')}, worst first): "
              + ", ".join(f"{row['name']} {row['sqnr_db']:.1f} dB" for row in found.get("layers", [])[:8]),
              flush=True)

    def baseline_failed(self):
        print(f"the recipe's own settings do not build: {self.session.results[self.session.baseline].error}",
              file=sys.stderr)

    def summary(self, seconds):
        made = ", ".join(f"{count} tasks {how}" for how, count in self.session.made.items() if count)
        print(f"{len(self.session.results)} candidates in {seconds:.1f} s ({made or 'nothing run'})", flush=True)

    def no_winner(self, best):
        """`best`: the best effort, or None."""
        session = self.session
        print(f"no candidate meets the goal within {session.options.max_candidates} candidates"
              + (f"; the best, #{session.order.index(best) + 1}: {self.describe(best)}" if best else ""),
              flush=True)
        if best is not None:
            print(f"its settings, {session.where()}:\n  quantize: {patch.flow(session.settings(best))}", flush=True)

    def winner(self, chosen):
        print(f"winner: #{self.session.order.index(chosen) + 1}: {self.describe(chosen)}", flush=True)

    def describe(self, candidate):
        session = self.session
        outcome = session.results[candidate]
        floats = ", ".join(candidate.exclude) or "none"
        sqnr = _number(outcome.metrics.get("sqnr_db"), ".2f")
        parts = [f"{candidate.floats} float layer{'s' if candidate.floats != 1 else ''} ({floats})",
                 f"observer {session.effective[candidate.observer]}", f"SQNR {sqnr} dB"]
        baseline = session.results.get(session.baseline)
        if baseline is not None and baseline.metrics and candidate.exclude:
            parts[-1] += f" (was {_number(baseline.metrics.get('sqnr_db'), '.2f')})"
            if baseline.median_ms and outcome.median_ms:
                parts.append(f"host {outcome.median_ms:.3f} ms (was {baseline.median_ms:.3f})")
            if baseline.size_bytes and outcome.size_bytes:
                parts.append(f"size {_size(outcome.size_bytes)} (was {_size(baseline.size_bytes)})")
        elif outcome.median_ms is not None:
            parts.append(f"host {outcome.median_ms:.3f} ms, size {_size(outcome.size_bytes)}")
        if outcome.missed:
            parts.append(f"misses {'; '.join(outcome.missed)}")
        return ", ".join(parts)

    def proposal(self, proposal):
        """The winner's settings, and the patch of the recipe file (session.Proposal)."""
        session = self.session
        print(f"settings, {session.where()}:\n  quantize: {patch.flow(proposal.settings)}", flush=True)
        if proposal.edited is None:
            print(f"(no patch: this file's layout needs a hand edit of {session.where()})", flush=True)
            return
        if proposal.diff is None:
            print(f"{session.recipe.file} already has these settings", flush=True)
            return
        patch_file = proposal.patch_file
        print(f"{patch_file.relative_to(session.root).as_posix() if not patch_file.is_absolute() else patch_file}:",
              flush=True)
        print(proposal.diff, end="", flush=True)
        if proposal.written:
            print(f"wrote {session.recipe.file}", flush=True)
        else:
            print(f"(not applied: --write applies it, or `git apply {TUNE_DIR}/{patch_file.name}`)",
                  flush=True)


def shorten(names, width):
    """'broken.1, broken.0' within `width` characters: as many names as fit, then '+N'."""
    if not names:
        return "—"
    text = ", ".join(names)
    if len(text) <= width:
        return text
    shown = []
    for name in names:
        rest = len(names) - len(shown) - 1
        candidate = ", ".join([*shown, name]) + (f" +{rest}" if rest else "")
        if len(candidate) > width:
            break
        shown.append(name)
    rest = len(names) - len(shown)
    return (", ".join(shown) + f" +{rest}") if shown else f"{names[0][:width - 6]}… +{rest - 1}"


def _number(value, spec):
    return "—" if value is None else format(value, spec)


def _size(value):
    if value is None:
        return "—"
    return f"{value / 1e6:.2f} MB" if value >= 1e5 else f"{value / 1e3:.1f} kB"

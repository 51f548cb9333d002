"""The search `mobilebuild tune` runs: which candidates to build, in which rounds, when to stop, and which one wins.
Plain data: no torch, no doit; the command builds each round and records what verify and bench said.

A candidate is a set of layers kept float (`quantize.exclude`, in ranking order, neighbours grouped into their
parent module: see grouped()) and an observer. The search:
  1. observers: no float layer, each observer the route offers (the recipe's own first). Any that passes ends it.
  2. walk: the top-k of the per-layer ranking (worst first), k = 1, 2, 4, 8 ... up to the ranking's length, with
     the recipe's observer (the ranking's) and, where another gave a better SQNR in step 1, with that one too, until
     one passes (MobileNetV2 on ExecuTorch: its classifier float restores top-1 agreement, minmax the SQNR; neither
     alone passes); if none does, the whole ranking with each other observer, and the walk goes on with one that
     passes (the best SQNR). The ranking charges each layer with the
     error it adds fed float inputs, so the consumer of a badly quantized tensor can rank above its producer (and a
     head layer with a modest error above both): the first passing top-k often holds layers it does not need.
  3. minimize: each layer of the passing set dropped in turn (one round); the layers whose drop still passes are
     dropped together (one candidate); if that fails, the best single drop is taken and the others are tried again.
     Assuming more float layers never hurt, the result is minimal: no single layer can be dropped.
  4. observers again: the minimal set with each other observer, so the winner is the fastest (then the best SQNR)
     of the passing candidates with the fewest float layers.
Every round only holds candidates not built before, and no more than the budget left.
"""

from dataclasses import dataclass, field

LATENCY_TIE = 0.03  # host medians within 3% of the fastest (or its p90) count as a tie: then the better SQNR wins


@dataclass(frozen=True)
class Candidate:
    exclude: tuple  # module paths kept float, worst first
    observer: str | None  # None: the recipe's own setting (the route's default where it sets none)
    floats: int = 0  # how many of the ranking's layers it keeps float


def grouped(names):
    """Layers that share a parent module, the parent in their place (`broken.0`, `broken.1` -> `broken`), at the
    first one's place; and nothing inside another entry. Eager mode keeps each excluded module float between a
    DeQuantStub and a QuantStub of its own, so two neighbours excluded one by one still pass the tensor between them
    through int8; their parent keeps it float (FX, PT2E and ONNX Runtime alike). One level only: grouped again and
    again, MobileNetV2's 16 worst layers, spread over its blocks, became `features`, the whole backbone float."""
    names = list(dict.fromkeys(names))
    parents = [name.rpartition(".")[0] for name in names]
    shared = {parent for parent in parents if parent and parents.count(parent) >= 2}
    names = list(dict.fromkeys(parent if parent in shared else name for name, parent in zip(names, parents)))
    return tuple(name for name in names if not any(name.startswith(other + ".") for other in names))


def candidate(layers, observer, ranking):
    """The candidate that keeps `layers` (of `ranking`) float: their modules grouped, and how many ranked layers that
    keeps float."""
    exclude = grouped(layers)
    covered = sum(any(name == entry or name.startswith(entry + ".") for entry in exclude) for name in ranking)
    return Candidate(exclude, observer, covered)


@dataclass
class Outcome:
    """What the build said about a candidate: verify's metrics and the goal's misses, bench's median and size."""

    missed: list = field(default_factory=list)  # one line per threshold missed
    metrics: dict | None = None
    median_ms: float | None = None
    p90_ms: float | None = None  # the slow end of its timings: a median below another's is no faster
    size_bytes: int | None = None
    error: str | None = None  # its chain failed: the task and the build's one line

    @property
    def passed(self):
        return self.error is None and self.metrics is not None and not self.missed

    @property
    def sqnr(self):
        value = (self.metrics or {}).get("sqnr_db")
        return float("-inf") if value is None else value


def steps(length):
    """The walk's float-layer counts: 1, 2, 4, 8 ... and the ranking's length."""
    found, k = [], 1
    while k < length:
        found.append(k)
        k *= 2
    return found + [length] if length else []


def plan(observers, ranking, budget, results):
    """Generator of rounds: each a list of candidates to build (never one already in `results`), at most `budget` in
    all. The caller builds a round and puts an Outcome per candidate into `results` before asking for the next.
    `observers`: the observers to try, the recipe's own first; `ranking()`: the layers worst first (called once,
    after the first round, only when no candidate of it passed)."""
    spent = 0

    def fresh(candidates):
        nonlocal spent
        new = [c for c in dict.fromkeys(candidates) if c not in results][:max(budget - spent, 0)]
        spent += len(new)
        return new

    def passes(candidate):
        return candidate in results and results[candidate].passed

    first = fresh([Candidate((), observer) for observer in observers])
    if first:
        yield first
    if any(passes(Candidate((), observer)) for observer in observers):
        return
    names = list(ranking())
    walker = observers[0]  # the observer the ranking was measured with
    measured = [observer for observer in observers if Candidate((), observer) in results]
    best = max(measured, key=lambda observer: results[Candidate((), observer)].sqnr, default=walker)
    walkers = [walker] + ([best] if best != walker and results[Candidate((), best)].sqnr >
                          results[Candidate((), walker)].sqnr else [])

    def make(layers, observer=None):
        return candidate(layers, observer or walker, names)

    found = None
    for k in steps(len(names)):
        trials = [make(names[:k], observer) for observer in walkers]
        batch = fresh(trials)
        if batch:
            yield batch
        passing = [trial for trial in trials if passes(trial)]
        if passing:
            walker, found = max(passing, key=lambda trial: results[trial].sqnr).observer, names[:k]
            break
        if spent >= budget:
            return
    if found is None and names:  # the whole ranking float, with each other observer
        trials = [make(names, observer) for observer in observers[1:]]
        batch = fresh(trials)
        if batch:
            yield batch
        passing = [trial for trial in trials if passes(trial)]
        if not passing:
            return
        walker, found = max(passing, key=lambda trial: results[trial].sqnr).observer, names
    if found is None:
        return

    current, droppable = list(found), list(found)
    while droppable and spent < budget:
        trials = {name: make([n for n in current if n != name]) for name in droppable}
        batch = fresh(trials.values())
        if batch:
            yield batch
        passing = [name for name, candidate in trials.items() if passes(candidate)]
        if not passing:
            break
        if len(passing) == 1:
            current.remove(passing[0])
            break
        together = make([n for n in current if n not in passing])
        batch = fresh([together])
        if batch:
            yield batch
        if passes(together):
            current = [n for n in current if n not in passing]
            break
        best = max(passing, key=lambda name: results[trials[name]].sqnr)
        current.remove(best)
        droppable = [name for name in passing if name != best]

    batch = fresh([candidate(current, observer, names) for observer in observers if observer != walker])
    if batch:
        yield batch


def winner(results):
    """The passing candidate with the fewest float layers; among those the fastest host median, then the best SQNR:
    medians within LATENCY_TIE of the fastest one, or below its p90, are a tie (a model of a few microseconds timed
    a few times has no faster observer). None when none passed."""
    passing = [c for c, outcome in results.items() if outcome.passed]
    if not passing:
        return None
    fewest = min(c.floats for c in passing)
    level = [c for c in passing if c.floats == fewest]
    timed = [c for c in level if results[c].median_ms is not None]
    if timed:
        fastest = results[min(timed, key=lambda c: results[c].median_ms)]
        limit = max(fastest.median_ms * (1 + LATENCY_TIE), fastest.p90_ms or 0)
        level = [c for c in level if results[c].median_ms is None or results[c].median_ms <= limit] or level
    return max(level, key=lambda c: (results[c].sqnr, -(results[c].median_ms or 0)))


def best_effort(results):
    """When none passed: the candidate that misses the fewest thresholds, then the best SQNR, then the fewest float
    layers. None when nothing was measured."""
    measured = [c for c, outcome in results.items() if outcome.error is None and outcome.metrics is not None]
    if not measured:
        return None
    return min(measured, key=lambda c: (len(results[c].missed), -results[c].sqnr, c.floats))

"""A recorded build replayed on N simulated workers under each measuring policy: what measuring alone costs beyond
two cores (issue 37).

A build records each node it runs (mobilebuild/engine/node_times.py: .mobilebuild/node_times.jsonl): when it started
and ended, the seconds it waited for measurements or for stages, and how long its measurement held the host. This
script takes a project's graph (the plan layer, no torch), each node's newest record, and replays it with doit's
way of scheduling (N processes, each taking the next task whose inputs are built, in the graph's order) under:

- **alone** (the policy today, worker/measure_alone.py): a benchmark waiting for its measurement closes the
  turnstile, so no stage starts anywhere until the stages running have ended and its measurement is over; the
  stages that got a worker meanwhile hold it, waiting;
- **stages first**: a benchmark waiting to measure keeps its worker but shuts nothing: it measures alone once no
  stage is running and none could start;
- **reserved core**: one core measures, one measurement at a time, while stages use the other N - 1 (from 2).

Each node's work is its recorded wall time less its waits; a benchmark's is its own part (reading the artifact)
and the part it held the host alone. It prints the makespan at each N against the critical path and against ideal
scaling (the larger of the critical path and the total work over N), and, with --recorded-workers, the recorded
build's own wall time (its first start to its last end) against the replay at that N.

    .venv/bin/python benchmarks/replay.py [PROJECT] [--workers 2,4,8,16,32,64] [--recorded-workers N]
"""

import argparse
import heapq
import os
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from _bench import REPO

sys.path.insert(0, str(REPO))

from mobilebuild import routes  # noqa: E402, F401 - the built-in routes, which recipes name
from mobilebuild.engine import node_times  # noqa: E402
from mobilebuild.plan import project, stages  # noqa: E402

POLICIES = ("alone", "stages first", "reserved core")


@dataclass(frozen=True)
class Job:
    name: str
    deps: tuple  # the jobs whose outputs it reads
    work: float  # seconds, waits left out; a benchmark's own part and its measurement together
    alone: float = 0.0  # of which a measurement held the host alone
    measures: bool = False


def jobs_of(root):
    """(the project's jobs in graph order, {task: its record line}, the tasks without a record: fetched from the
    cache, or never built here; they replay as taking no time)."""
    nodes = project.nodes(root)
    made_by = {node.output: node.task_name for node in nodes}
    recorded = node_times.read(Path(root) / node_times.RECORD)
    jobs, missing = {}, []
    for node in nodes:
        line = recorded.get(node.task_name)
        if line is None:
            missing.append(node.task_name)
            line = {}
        wall = line.get("ended", 0.0) - line.get("started", 0.0)
        work = max(0.0, wall - line.get("stages", 0.0) - line.get("measurements", 0.0))
        measures = stages.get(node.stage).measures
        alone = min(work, line.get("alone", 0.0)) if measures else 0.0
        deps = tuple(dict.fromkeys(made_by[path] for path in node.inputs.values() if path in made_by))
        jobs[node.task_name] = Job(node.task_name, deps, work, alone, measures)
    return jobs, {task: recorded[task] for task in jobs if task in recorded}, missing


def critical_path(jobs):
    finish = {}
    for name, job in jobs.items():  # graph order: a node comes after its inputs
        finish[name] = job.work + max((finish[dep] for dep in job.deps), default=0.0)
    return max(finish.values(), default=0.0)


def simulate(jobs, workers, policy):
    """The makespan of `jobs` on `workers` simulated processes under `policy` (one of POLICIES)."""
    if policy == "reserved core" and workers == 1:  # no core to spare
        policy = "alone"
    order = {name: index for index, name in enumerate(jobs)}
    waiting = {name: set(job.deps) for name, job in jobs.items()}
    dependents = {name: [] for name in jobs}
    for name, job in jobs.items():
        for dep in job.deps:
            dependents[dep].append(name)
    ready = sorted((name for name, deps in waiting.items() if not deps), key=order.get)
    lanes = workers - 1 if policy == "reserved core" else workers
    events, sequence = [], 0
    busy = stages_running = done = 0
    now, alone_running = 0.0, False
    wanting, blocked = deque(), deque()  # measurements waiting to run alone; stages holding a worker, turnstile shut

    def at(seconds, name, phase):
        nonlocal sequence
        heapq.heappush(events, (now + seconds, sequence, name, phase))
        sequence += 1

    def start_stage(name):
        nonlocal stages_running
        stages_running += 1
        at(jobs[name].work, name, "stage")

    while done < len(jobs):
        progressed = True
        while progressed:
            progressed = False
            if wanting and not alone_running and (
                    policy == "reserved core"
                    or policy == "alone" and stages_running == 0
                    or policy == "stages first" and stages_running == 0
                    and (busy >= lanes or not any(not jobs[name].measures for name in ready))):
                name = wanting.popleft()
                alone_running = True
                at(jobs[name].alone, name, "alone")
                progressed = True
            if policy == "alone" and blocked and not wanting and not alone_running:
                while blocked:
                    start_stage(blocked.popleft())
                progressed = True
            while ready and busy < lanes:
                name = ready.pop(0)
                busy += 1
                job = jobs[name]
                if job.measures:
                    at(job.work - job.alone, name, "own part")
                elif policy == "alone" and (wanting or alone_running):
                    blocked.append(name)
                else:
                    start_stage(name)
                progressed = True
        if not events:
            raise RuntimeError(f"the replay stalled under {policy!r} at {now:.1f} s: a bug of this script")
        now, _, name, phase = heapq.heappop(events)
        finished = phase != "own part"
        if phase == "stage":
            stages_running -= 1
            busy -= 1
        elif phase == "own part":
            wanting.append(name)
            if policy == "reserved core":  # it measures on the core set aside; waiting, a benchmark keeps its worker
                busy -= 1
        else:  # alone
            alone_running = False
            if policy != "reserved core":
                busy -= 1
        if finished:
            done += 1
            for dependent in dependents[name]:
                waiting[dependent].discard(name)
                if not waiting[dependent]:
                    ready.append(dependent)
            ready.sort(key=order.get)
    return now


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", nargs="?", default=".", help="a built project (default: here)")
    parser.add_argument("--workers", default="2,4,8,16,32,64")
    parser.add_argument("--recorded-workers", type=int, help="the -n the recorded build ran with: compare")
    args = parser.parse_args()
    os.chdir(args.project)  # the plan reads a project from where it lies, as doit does
    jobs, recorded, missing = jobs_of(".")
    if not recorded:
        sys.exit(f"{args.project}: no node times recorded ({node_times.RECORD}): build it first, with the shared "
                 "cache off (MOBILEBUILD_CACHE=off) for a cold build's times")
    total = sum(job.work for job in jobs.values())
    measured = sum(job.alone for job in jobs.values())
    path = critical_path(jobs)
    print(f"{args.project}: {len(jobs)} nodes, {len(recorded)} recorded ({len(missing)} without a record replay as "
          f"0 s), {total:.1f} s of work, of which {measured:.1f} s measuring alone; critical path {path:.1f} s")
    if args.recorded_workers:
        wall = max(line["ended"] for line in recorded.values()) - min(line["started"] for line in recorded.values())
        replayed = simulate(jobs, args.recorded_workers, "alone")
        print(f"recorded build at -n {args.recorded_workers}: {wall:.1f} s; replayed: {replayed:.1f} s "
              f"({(replayed - wall) / wall * 100:+.1f}%)")
    print()
    print(f"| workers | ideal (s) | {' | '.join(f'{policy} (s)' for policy in POLICIES)} | "
          f"{' | '.join(f'{policy} / ideal' for policy in POLICIES)} |")
    print("|---:|---:|" + "---:|" * (2 * len(POLICIES)))
    for workers in (int(count) for count in args.workers.split(",")):
        ideal = max(path, total / workers)
        spans = [simulate(jobs, workers, policy) for policy in POLICIES]
        print(f"| {workers} | {ideal:.1f} | {' | '.join(f'{span:.1f}' for span in spans)} | "
              f"{' | '.join(f'{span / ideal:.2f}x' for span in spans)} |")


if __name__ == "__main__":
    main()

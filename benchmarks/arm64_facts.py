"""docs/arm64_results.md: every CPU artifact of a build on the emulated ARM CPUs, written from that build's results
(artifacts/<recipe>/arm64-*.json), and, given a second cold build of the same recipes, how far its instruction
counts moved between the two.

    .venv/bin/python benchmarks/arm64_facts.py ARTIFACTS [OTHER_ARTIFACTS] [--note "how the builds ran"]

ARTIFACTS: a build's artifacts/ folder (after `mobilebuild arm64 setup` and `doit`); OTHER_ARTIFACTS: another cold
build's (another checkout, the shared cache off), compared count by count.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mobilebuild.plan import arm64  # noqa: E402 - the repository's own package, beside this script

OUT = REPO / "docs" / "arm64_results.md"
# Below this many instructions per inference, the interpreter's own work around a run (converting arrays, the
# runtime's Python binding) is much of a count, and it moves with what the process ran before
INTERPRETED = 1_000_000
MARK = "<!-- written by benchmarks/arm64_facts.py from a build of the examples: run it again, do not edit -->"


def results(artifacts):
    """{(recipe, target, cpu): result} of a build's artifacts folder."""
    found = {}
    for path in sorted(Path(artifacts).glob("*/arm64-*.json")):
        result = json.loads(path.read_text())
        target = path.stem.removeprefix("arm64-").removesuffix(f"-{result['cpu']}")
        found[path.parent.name, target, result["cpu"]] = result
    return found


def millions(value):
    return "—" if value is None else f"{value / 1e6:.3g} M"


def per_inference(result):
    return (result.get("instructions") or {}).get("per_inference")


def against_host(result):
    host = result["against_host"]
    return "identical" if host["identical"] else f"{host['sqnr_db']:.1f} dB"


def table(found):
    cpus = [cpu for cpu in arm64.CPUS if any(key[2] == cpu for key in found)]
    targets = list(dict.fromkeys(key[:2] for key in found))
    lines = ["| recipe | target | " + " | ".join(f"{cpu}: verdict, SQNR vs eager, vs x86, instructions"
                                                for cpu in cpus) + " |",
             "|---|---|" + "---|" * len(cpus)]
    for recipe, target in targets:
        cells = []
        for cpu in cpus:
            result = found.get((recipe, target, cpu))
            cells.append("—" if result is None else
                         f"{result['status']}, {result['metrics']['sqnr_db']:.1f} dB, {against_host(result)}, "
                         f"{millions(per_inference(result))}")
        lines.append(f"| {recipe} | {target} | " + " | ".join(cells) + " |")
    return lines, cpus


def moved(found, other):
    """[(relative change, key)] of every count both builds have, largest first."""
    changes = [(abs(per_inference(other[key]) / per_inference(result) - 1), key) for key, result in found.items()
               if key in other and per_inference(result) and per_inference(other[key])]
    return sorted(changes, reverse=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifacts")
    parser.add_argument("other", nargs="?")
    parser.add_argument("--note", default="", help="how the builds ran: the machine and its load")
    args = parser.parse_args()
    found = results(args.artifacts)
    if not found:
        sys.exit(f"no arm64 results under {args.artifacts}: run `mobilebuild arm64 setup`, then `doit`")
    lines, cpus = table(found)
    cpu = sum(result["seconds"].get("cpu", 0) + result["seconds"].get("startup_cpu", 0) for result in found.values())
    failed = [key for key, result in found.items() if result["status"] != "passed"]
    emulator = next(iter(found.values()))["emulator"]
    page = ["# The bundled examples on emulated ARM CPUs", "", MARK, "",
            f"Every CPU artifact of the bundled examples, run in its runtime's own aarch64 wheel under QEMU "
            f"{emulator['qemu']} user mode (Python {emulator['python']}) on {', '.join(cpus)}: the verdict at the "
            "recipe's thresholds, SQNR against the eager model, agreement with the same file on this x86 host, and "
            "instructions per inference ([arm64.md](arm64.md) says what each is).", "", *lines, "",
            f"- {len(found)} results, {len(found) - len(failed)} passed"
            + (f"; failed: {', '.join('/'.join(key) for key in failed)}" if failed else "") + ".",
            f"- Emulated CPU time, processes started, runtimes imported, models loaded and run: {cpu:.0f} s."]
    if args.other:
        changes = moved(found, results(args.other))
        page.append(f"- A second cold build (another checkout, the shared cache off) counted {len(changes)} of them "
                    f"again; {sum(change < 0.001 for change, _ in changes)} moved by less than 0.1%.")
        for what, part in (("at least", [c for c in changes if per_inference(found[c[1]]) >= INTERPRETED]),
                           ("below", [c for c in changes if per_inference(found[c[1]]) < INTERPRETED])):
            if part:
                page.append(f"  - {len(part)} counts {what} {INTERPRETED / 1e6:g} M instructions: the largest change "
                            f"was {part[0][0]:.3%} ({'/'.join(part[0][1])})")
    if args.note:
        page.append(f"- {args.note}")
    OUT.write_text("\n".join(page) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()

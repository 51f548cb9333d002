"""A regression gate on benchmark medians: save them as a baseline, later fail on targets that got slower."""

import json
import sys

from mobilebuild import store


def medians(manifests):
    """{"recipe/target": median ms} for every benchmark that ran, the eager baselines included."""
    found = {}
    for manifest in manifests:
        for target, result in sorted(manifest.get("benchmarks", {}).items()):
            if result.get("status") == "ran":
                found[f"{manifest['recipe']}/{target}"] = result["median_ms"]
    return found


def save(manifests, path):
    store.write_text(path, json.dumps({"median_ms": medians(manifests)}, indent=2, sort_keys=True) + "\n")
    print(f"saved {len(medians(manifests))} benchmark medians to {path}")


def compare(manifests, path, tolerance):
    """Print current vs baseline for every target; return the offenders: slower than the tolerance allows."""
    with open(path) as handle:
        before = json.load(handle)["median_ms"]
    now = medians(manifests)
    offenders = []
    print(f"{'target':40} {'baseline ms':>12} {'now ms':>10} {'ratio':>7}")
    for key in sorted(before.keys() | now.keys()):
        if key not in now or key not in before:
            print(f"{key:40} {before.get(key, '—')!s:>12} {now.get(key, '—')!s:>10}   "
                  f"{'not benchmarked now' if key not in now else 'new'}")
            continue
        ratio = now[key] / before[key]
        slower = ratio > 1 + tolerance
        print(f"{key:40} {before[key]:12.3f} {now[key]:10.3f} {ratio:6.2f}x{'  SLOWER' if slower else ''}")
        if slower:
            offenders.append(f"{key} {ratio:.2f}x ({before[key]:.3f} -> {now[key]:.3f} ms)")
    if offenders:
        print(f"{len(offenders)} target(s) slower than the baseline by more than {tolerance:.0%}: "
              + "; ".join(offenders), file=sys.stderr)
    return offenders

"""The report's ARM part: each CPU artifact on emulated ARM CPUs (worker/stages/arm64.py), as a table, the lines
that rank candidates by instructions per inference, and what those counts are and are not. Reads manifests only."""

from mobilebuild.plan import arm64

TITLE = ("On emulated ARM CPUs (QEMU user mode, each runtime's own aarch64 wheel): the verdict at the recipe's "
         "thresholds, SQNR against eager, agreement with this host's run of the same file, and instructions per "
         "inference")
WHAT_A_COUNT_IS = ("An instruction count is the emulated CPU's, the same on any host and under any load; it is not a "
                   "time: it knows nothing of memory stalls, caches, several cores or big.LITTLE scheduling, and an "
                   "SVE or dot-product instruction counts one like any other. Compare counts on one CPU model.")


def results(manifest, label):
    """{CPU model: result} of one target, in plan.arm64.CPUS' order."""
    found = manifest.get("arm64") if isinstance(manifest, dict) else None
    found = found.get(label) if isinstance(found, dict) else None
    if not isinstance(found, dict):
        return {}
    return {cpu: found[cpu] for cpu in arm64.CPUS if isinstance(found.get(cpu), dict)}


def failed(found):
    """Why a target that runs on emulated ARM CPUs is not a candidate to ship (None when it passes on all)."""
    lines = [line for result in found.values() if result.get("status") == "failed"
             for line in result.get("failures") or ["failed"]]
    return "; ".join(lines) or None


def per_inference(result):
    counted = result.get("instructions")
    value = counted.get("per_inference") if isinstance(counted, dict) else None
    return value if isinstance(value, (int, float)) else None


def millions(value):
    return "—" if value is None else f"{value / 1e6:.3g} M"


def _host(result):
    against = result.get("against_host")
    if not isinstance(against, dict):
        return "—"
    if against.get("identical"):
        return "identical"
    value = against.get("sqnr_db")
    return f"{value:.1f} dB" if isinstance(value, (int, float)) else "—"


def _sqnr(result):
    value = (result.get("metrics") or {}).get("sqnr_db")
    return f"{value:.1f}" if isinstance(value, (int, float)) else "—"


def cpus(rows):
    """The CPU models any of `rows` (report_data.Row, whose `arm64` is results()) ran on, in plan.arm64.CPUS'
    order."""
    seen = {cpu for row in rows for cpu in row.arm64}
    return [cpu for cpu in arm64.CPUS if cpu in seen]


def table(rows, make_table, column):
    """The rows' results on each CPU model (a Table made by `make_table(columns, cells, states)` of `column(name,
    group, numeric, cell)`s), or None where no row ran on one."""
    ran = [row for row in rows if row.arm64]
    if not ran:
        return None
    columns = [column("target", "", False, lambda row: row.label)]
    for cpu in cpus(ran):
        columns += [
            column("verdict", cpu, False, lambda row, cpu=cpu: _cell(row, cpu, _verdict)),
            column("SQNR (dB)", cpu, True, lambda row, cpu=cpu: _cell(row, cpu, _sqnr)),
            column("vs this host", cpu, True, lambda row, cpu=cpu: _cell(row, cpu, _host)),
            column("instructions", cpu, True, lambda row, cpu=cpu: _cell(row, cpu, _instructions)),
        ]
    states = ["failed" if failed(row.arm64) else "passed" for row in ran]
    return make_table(columns, [[c.cell(row) for c in columns] for row in ran], states)


def _cell(row, cpu, show):
    result = row.arm64.get(cpu)
    return show(result) if result else "—"


def _instructions(result):
    return millions(per_inference(result))


def _verdict(result):
    return "FAILED" if result.get("status") == "failed" else str(result.get("status", "—"))


def ranking(candidates):
    """'cortex-a53: a (63.3 M) < b (80.1 M); cortex-a76: ...': the candidates by instructions per inference on each
    CPU model where more than one was counted, or ''."""
    found = []
    for cpu in cpus(candidates):
        counted = sorted((value, row.label) for row in candidates
                         if (value := per_inference(row.arm64.get(cpu) or {})) is not None)
        if len(counted) > 1:
            found.append(f"{cpu}: " + " < ".join(f"{label} ({millions(value)})" for value, label in counted))
    return "; ".join(found)


def lines(candidates, tied):
    """The recommendation's lines on the candidates' instruction counts: the ranking on each CPU model, and what it
    says of `tied`, the candidates one host run cannot tell apart."""
    found = []
    everyone = ranking(candidates)
    if everyone:
        found.append(f"Fewest instructions per inference on emulated ARM CPUs (the same under any load; not a time): "
                     f"{everyone}.")
    among = ranking(tied) if len(tied) > 1 and everyone else ""
    if among:
        found.append(f"Of those this run cannot tell apart, the instruction counts say {among}.")
    return found


def notes(rows):
    """What each CPU model stands for, what the runs cost, and what a count is."""
    shown = cpus(rows)
    if not shown:
        return []
    found = [f"{cpu}: {arm64.CPUS[cpu].generation}; QEMU -cpu {arm64.CPUS[cpu].qemu}" for cpu in shown]
    cpu = sum((result.get("seconds") or {}).get(key) or 0 for row in rows for result in row.arm64.values()
              for key in ("cpu", "startup_cpu"))
    found.append(f"Emulated CPU time, processes started, runtimes imported, models loaded and run: {cpu:.0f} s in all "
                 "(QEMU on this host; the counts do not move with its speed or load).")
    found.append(WHAT_A_COUNT_IS)
    return found

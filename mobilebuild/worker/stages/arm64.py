"""arm64: run a CPU artifact on an emulated ARM CPU in its runtime's own aarch64 wheel, judge it against the fp32
eager model at the recipe's thresholds, compare it with the same artifact on this host, and count the instructions
one inference takes there.

The ARM kernels are other code than the host's: XNNPACK, QNNPACK, MLAS pick NEON, dot-product, i8mm or SVE paths by
the CPU's features, so a verdict on x86 says little about them. The inputs are verification's (the recipe's
evaluation data or its seeded random inputs), the first `samples` of them at the example's sizes: emulation is slow.
An instruction count is the emulated CPU's, the same on any host and under any load; it is not a time: it knows
nothing of memory stalls, caches, cores or big.LITTLE scheduling (docs/arm64.md).
"""

import dataclasses
import json
import statistics

import numpy
import torch

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import arm64
from mobilebuild.worker import emulated, metrics, runtimes
from mobilebuild.worker.stages import modeling, verify


def run(inputs, config, output):
    environment = arm64.current()
    if environment is None or arm64.emulator(environment, config.cpu, config.runtime) != config.emulator:
        raise MobileBuildError(f"the aarch64 environment changed since this build was planned: run the build again "
                               f"(or `{arm64.SETUP_COMMAND}`)", field="verify.arm64")
    groups, description = verify.evaluation_data(dataclasses.replace(config, fixed_shape="the example's sizes"))
    _, data, labels = groups[0]
    batch = config.inputs[0]["shape"][0]
    count = min(len(data[0]) - len(data[0]) % batch, config.samples * batch)
    if count == 0:
        raise MobileBuildError(f"no input of the example's batch size {batch} to run", field="verify.evaluation")
    data = tuple(x[:count] for x in data)
    labels = labels[:count] if labels is not None else None
    reference = modeling.restore_model(config.model, inputs["checkpoint"])
    expected, _ = verify.run_in_batches(reference, data, batch, config.outputs)
    on_host, _ = verify.run_in_batches(runtimes.load(inputs["artifact"], config), data, batch, config.outputs)
    runs = [[x.detach().contiguous().numpy() for x in chunk] for chunk in zip(*(x.split(batch) for x in data))]
    produced, reply = emulated.session(environment, config.cpu).run(
        config.runner, inputs["artifact"], runs, runtimes.arm64_options(inputs["artifact"], config),
        runtime=config.runtime)
    if len(produced[0]) != len(expected):
        raise MobileBuildError(f"on emulated {config.cpu} the artifact returns {len(produced[0])} tensor(s), on this "
                               f"host {len(expected)}", field="targets")
    found, against_host, missed = {}, {}, []
    for position, (name, values) in enumerate(expected):
        on_arm = torch.from_numpy(numpy.concatenate([run[position] for run in produced])).reshape(values.shape)
        host = on_host[position][1]
        found[name] = metrics.compare(values, on_arm.to(values.dtype), labels if position == 0 else None)
        missed += [f"{name}: {line}" if len(expected) > 1 else line
                   for line in metrics.failures(found[name], config.thresholds)]
        against_host[name] = {"sqnr_db": min(metrics.sqnr_db(host, on_arm.to(host.dtype)), metrics.SQNR_CEILING_DB),
                              "identical": bool(torch.equal(host, on_arm.to(host.dtype))),
                              "max_abs_diff": float((host.double() - on_arm.double()).abs().max())}
    worst = verify.worst_output(found)
    cpu = arm64.CPUS[config.cpu]
    result = {"status": "failed" if missed else "passed", "cpu": config.cpu, "generation": cpu.generation,
              "features": environment["cpus"][config.cpu]["features"], "emulator": config.emulator,
              "precision": config.precision, "runtime": config.runtime, "data": description,
              "samples": count, "thresholds": config.thresholds, "metrics": metrics.json_safe(found[worst]),
              "failures": [f"on emulated {config.cpu} ({cpu.generation}): {line}" for line in missed],
              "against_host": metrics.json_safe(against_host[worst]),
              "instructions": instructions(reply),
              # under emulation, on this host (its load slows them): the first artifact a process ran says its start
              "seconds": reply["seconds"],
              "artifact_sha256": store.sha256_file(inputs["artifact"])}
    if len(found) > 1:
        result["worst_output"] = worst
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True, allow_nan=False)
    _say(result)


def instructions(reply):
    """Instructions per inference (the median of the runs), each run's, and the model's load, or None where the
    environment counts none."""
    runs = reply.get("instructions")
    if not runs:
        return None
    middle = statistics.median(runs)
    return {"per_inference": int(middle), "runs": runs, "load": reply.get("load_instructions"),
            "spread": (max(runs) - min(runs)) / middle if middle else 0.0}


def _say(result):
    found, host = result["metrics"], result["against_host"]
    same = "bit-identical to this host's" if host["identical"] else f"{_short(host['sqnr_db'])} dB against this host's"
    counted = result["instructions"]
    cost = f"; {counted['per_inference'] / 1e6:.1f} M instructions per inference" if counted else ""
    print(f"   {result['cpu']}: {result['status']} on {result['samples']} {result['data']} inputs: SQNR "
          f"{_short(found['sqnr_db'])} dB against eager, {same}{cost}")


def _short(value):
    return "n/a" if value is None else f"{value:.4g}"

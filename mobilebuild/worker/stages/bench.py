"""bench: latency of one artifact (or of the eager fp32 baseline), measured in a process of its own, plus a run
of speed_benchmark_torch on an Android device where one is attached."""

import json
import multiprocessing
import os
import platform
import zlib

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import toolchain
from mobilebuild.worker import device, measure_alone, progress


def host():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "machine": platform.machine(), "cores": os.cpu_count(), "system": platform.system()}


def time_in_subprocess(spec, measure=None):
    """timing.measure (or `measure`, a module-level function of the same form) in a process of its own, forked from
    a server that imported torch once for this stage worker: a fresh interpreter per benchmark spent 2.4 s starting
    and ending. Its stderr (progress) is the build's."""
    from mobilebuild.worker import timing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["mobilebuild.worker.timing"])
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(target=timing.measure_into,
                              args=({**spec, "root": os.getcwd()}, sending, measure or timing.measure))
    process.start()
    sending.close()
    with receiving:
        try:
            result = receiving.recv()
        except EOFError:  # it died before sending (a crash in the runtime)
            result = None
    process.join()
    if result is None:
        raise MobileBuildError(f"benchmark process failed (exit {process.exitcode}) for {spec['path']}",
                               field="benchmark")
    if "error" in result:
        raise MobileBuildError(f"the artifact fails when timed: {result['error']}", field="targets")
    measure_alone.add_waited("measurements", result.get("waited_for_stages_s", 0.0))  # its process's wait
    measure_alone.add_waited("alone", result.get("alone_s", 0.0))
    return result


def run(inputs, config, output):
    artifact = inputs.get("artifact") or inputs["checkpoint"]
    data = artifact.read_bytes()
    result = {"runtime": config.runtime, **config.timing, "artifact_bytes": len(data),
              # what a download or an app store ships: zeros from pruning shrink this, not artifact_bytes
              "artifact_compressed_bytes": len(zlib.compress(data, 6)),
              "artifact_sha256": store.sha256_file(artifact),
              # the sizes it ran at: a model with dynamic dims is timed at their example sizes
              "input_shapes": {spec["name"]: spec["shape"] for spec in config.inputs},
              "host": host(), "toolchain": toolchain.versions()}
    if config.runs_on_host:
        # the progress label: not in the config, which keys the cache (identical models share their timings)
        label = progress.current_task() or (artifact.stem if "artifact" in inputs else f"{artifact.parent.name}-eager")
        result.update(status="ran", **time_in_subprocess({"config": config, "path": str(artifact), "label": label}))
        us_per_iter = result["median_ms"] * 1e3
        result["speed_benchmark_line"] = device.format_speed_benchmark_line(us_per_iter, 1e6 / us_per_iter)
        print(f"   {result['speed_benchmark_line']} (median of {config.timing['iters']}, "
              f"p10 {result['p10_ms']:.3f} ms, p90 {result['p90_ms']:.3f} ms)")
    else:
        result.update(status="skipped", reason=config.host_reason)
    if config.device:
        result["device"] = on_device(artifact, config)
        print(f"   device: {result['device']['status']}"
              + (f" ({result['device']['reason']})" if result["device"].get("reason") else ""))
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)


# speed_benchmark_torch's --input_type values (binaries/speed_benchmark_torch.cc: tensors of ones of these types)
SPEED_BENCHMARK_TYPES = {"float32": "float", "uint8": "uint8_t", "int64": "int64"}


def on_device(artifact, config):
    settings, dtypes = config.device, [spec["dtype"] for spec in config.inputs]
    other = next((dtype for dtype in dtypes if dtype not in SPEED_BENCHMARK_TYPES), None)
    if other and not settings["use_bundled_input"]:
        return {"status": "skipped", "reason": f"speed_benchmark_torch makes {', '.join(SPEED_BENCHMARK_TYPES)} "
                                               f"inputs only, not {other}: set benchmark.device.use_bundled_input"}
    # several inputs: --input_dims "1,3,224,224;1,8" --input_type "float;int64" (the binary splits both on ';')
    return device.benchmark_on_device(
        artifact, serial=settings["serial"], input_dims=";".join(",".join(map(str, spec["shape"]))
                                                               for spec in config.inputs),
        input_type=";".join(SPEED_BENCHMARK_TYPES.get(dtype, "float") for dtype in dtypes),
        warmup=config.timing["warmup"],
        iters=config.timing["iters"], threads=config.timing["threads"],
        use_bundled_input=settings["use_bundled_input"], binary=settings["binary"])

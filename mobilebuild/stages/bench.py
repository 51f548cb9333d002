"""bench: latency of one artifact (or of the eager fp32 baseline), measured in a process of its own, plus a run
of speed_benchmark_torch on an Android device where one is attached."""

import json
import os
import platform
import subprocess
import sys
import zlib

from mobilebuild import device, progress, store, toolchain
from mobilebuild.errors import MobileBuildError


def host():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "machine": platform.machine(), "cores": os.cpu_count(), "system": platform.system()}


def time_in_subprocess(spec):
    threads = str(spec["timing"]["threads"])
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    done = subprocess.run([sys.executable, "-m", "mobilebuild.timing"], input=json.dumps(spec), env=env,
                          stdout=subprocess.PIPE, stderr=None, text=True)  # stderr passes through: progress
    if done.returncode != 0:
        raise MobileBuildError(f"benchmark process failed (exit {done.returncode}) for {spec['path']}",
                               field="benchmark")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(inputs, config, output):
    artifact = inputs.get("artifact") or inputs["checkpoint"]
    data = artifact.read_bytes()
    result = {"runtime": config["runtime"], **config["timing"], "artifact_bytes": len(data),
              # what a download or an app store ships: zeros from pruning shrink this, not artifact_bytes
              "artifact_compressed_bytes": len(zlib.compress(data, 6)),
              "artifact_sha256": store.sha256_file(artifact),
              "host": host(), "toolchain": toolchain.versions()}
    if config["runs_on_host"]:
        # the progress label: not in the config, which keys the cache (identical models share their timings)
        label = progress.current_task() or (artifact.stem if "artifact" in inputs else f"{artifact.parent.name}-eager")
        result.update(status="ran", **time_in_subprocess({**config, "path": str(artifact), "label": label}))
        us_per_iter = result["median_ms"] * 1e3
        result["speed_benchmark_line"] = device.format_speed_benchmark_line(us_per_iter, 1e6 / us_per_iter)
        print(f"   {result['speed_benchmark_line']} (median of {config['timing']['iters']}, "
              f"p10 {result['p10_ms']:.3f} ms, p90 {result['p90_ms']:.3f} ms)")
    else:
        result.update(status="skipped", reason=config.get("host_reason"))
    if config.get("device"):
        result["device"] = on_device(artifact, config)
        print(f"   device: {result['device']['status']}"
              + (f" ({result['device']['reason']})" if result["device"].get("reason") else ""))
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)


def on_device(artifact, config):
    settings = config["device"]
    return device.benchmark_on_device(
        artifact, serial=settings["serial"], input_dims=config["input"]["shape"], warmup=config["timing"]["warmup"],
        iters=config["timing"]["iters"], threads=config["timing"]["threads"],
        use_bundled_input=settings["use_bundled_input"], binary=settings["binary"])

"""Hand-made manifests for the report's tests (test_report*.py, test_plots.py), and writing a report from them."""

import json

from mobilebuild.results import report

TOOLCHAIN = {"mobilebuild": "0.1.0", "python": "3.11.7", "torch": "2.12.1", "torchvision": "0.27.1"}
HOST = {"cores": 2, "cpu": "Intel Xeon", "machine": "x86_64"}
NO_ADB = {"status": "skipped", "reason": "adb not on PATH"}


def benchmark(runtime, median, p10, p90, size):
    return {"status": "ran", "runtime": runtime, "threads": 1, "warmup": 5, "iters": 200, "median_ms": median,
            "p10_ms": p10, "p90_ms": p90, "mean_ms": median, "stdev_ms": 0.2, "load_ms": 120.0, "peak_rss_mb": 300.0,
            "artifact_bytes": size, "host": HOST, "toolchain": TOOLCHAIN, "device": NO_ADB}


def verification(status, metrics, failures=(), precision="fp32", sqnr_threshold=40):
    return {"status": status, "reason": None, "precision": precision, "data": "random", "samples": 16,
            "metrics": {"accuracy_reference": None, "accuracy_artifact": None, **metrics},
            "thresholds": {"sqnr_db": sqnr_threshold, "cosine": 0.9999, "max_rel_error": 0.01,
                           "top1_agreement": 0.99},
            "failures": list(failures)}


def target(name, backend, precision, size, status):
    return {"target": name, "backend": backend, "runtime": "pytorch-mobile", "precision": precision,
            "path": f"mnv2/mnv2-{name}.ptl", "bytes": size, "runs_on_host": True, "status": status}


def full_manifest():
    """Eager 12.6 ms and 14.0 MB; xnnpack 6.0 ms and 14.7 MB (passed); qnnpack 4.2 ms and 3.5 MB (failed)."""
    return {
        "recipe": "mnv2",
        "recipe_file": "recipes/mnv2.yaml",
        "recipe_sha256": "0123456789ab" + "f" * 52,
        "toolchain": TOOLCHAIN,
        "artifacts": [],
        "targets": [target("xnnpack", "xnnpack", "fp32", 14_700_000, "passed"),
                    target("qnnpack", "qnnpack", "int8", 3_500_000, "failed")],
        "verification": {
            "xnnpack": verification("passed", {"sqnr_db": 104.34, "cosine": 1.0, "max_rel_error": 1e-6,
                                               "top1_agreement": 1.0}),
            "qnnpack": verification("failed", {"sqnr_db": 12.46, "cosine": 0.973148, "max_rel_error": 0.21,
                                               "top1_agreement": 0.5},
                                    ["sqnr_db 12.46 < 20", "top1_agreement 0.5 < 0.99"], "int8", 20),
        },
        "benchmarks": {"eager": benchmark("eager", 12.6, 12.1, 13.4, 14_000_000),
                       "xnnpack": benchmark("pytorch-mobile", 6.0, 5.8, 6.5, 14_700_000),
                       "qnnpack": benchmark("pytorch-mobile", 4.2, 4.0, 5.1, 3_500_000)},
    }


def compressed_manifest():
    """As the build writes it: a pruned fp32 target, a dynamic and a static per_channel int8 one."""
    manifest = full_manifest()
    pruned = target("pruned", "xnnpack", "fp32", 14_700_000, "passed")
    pruned["pruning"] = {"method": "l1_unstructured", "amount": 0.5, "seed": 0, "modules": None}
    pruned["quantization"] = None
    dynamic = target("dynamic", "qnnpack", "int8", 3_600_000, "passed")
    dynamic.update(pruning=None, quantization={"mode": "dynamic", "weights": None})
    static = target("static", "qnnpack", "int8", 3_500_000, "passed")
    static.update(pruning=None, quantization={"mode": "static", "weights": "per_channel"})
    manifest["targets"] = [pruned, dynamic, static]
    manifest["verification"] = {
        "pruned": {**verification("passed", {"sqnr_db": 104.34}),
                   "sparsity": {"overall": 0.49871, "modules": {"conv": 0.5, "fc": 0.4971}}},
        "dynamic": verification("passed", {"sqnr_db": 30.0}, precision="int8", sqnr_threshold=20),
        "static": verification("passed", {"sqnr_db": 25.0}, precision="int8", sqnr_threshold=20),
    }
    manifest["benchmarks"] = {
        "eager": {**benchmark("eager", 12.6, 12.1, 13.4, 14_000_000), "artifact_compressed_bytes": 13_020_000},
        "pruned": {**benchmark("pytorch-mobile", 6.0, 5.8, 6.5, 14_700_000), "artifact_compressed_bytes": 7_350_000},
        "dynamic": benchmark("pytorch-mobile", 9.0, 8.8, 9.5, 3_600_000),
        "static": {**benchmark("pytorch-mobile", 4.2, 4.0, 5.1, 3_500_000), "artifact_compressed_bytes": 2_870_000},
    }
    return manifest


def write(manifests, out_dir):
    paths = report.write_report(manifests, out_dir)
    return paths, (out_dir / "report.md").read_text(), (out_dir / "report.html").read_text()


HEADER = ("| target | status | runs on | median (ms) | p90 (ms) | speed-up | MB | vs eager | SQNR (dB) "
          "| top-1 agreement |")


def with_software_gpu_target(manifest, median, precision="fp16"):
    """The manifest with a passing target named vulkan on ncnn's Vulkan path (a route whose host timings are never
    ranked), timed at `median` ms."""
    gpu = target("vulkan", "vulkan", precision, 7_000_000, "passed")
    gpu["runtime"] = "ncnn"
    manifest["targets"].append(gpu)
    manifest["verification"]["vulkan"] = manifest["verification"]["xnnpack"]
    manifest["benchmarks"]["vulkan"] = benchmark("ncnn-vulkan", median, median * 0.97, median * 1.03, 7_000_000)
    return manifest


def manifest_file(artifacts, directory, document):
    (artifacts / directory).mkdir(parents=True)
    path = artifacts / directory / "manifest.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path

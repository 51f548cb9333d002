"""report.md, report.html and the plots, from hand-made manifests: values computed by hand, broken input survived."""

import copy
import json
import sys

import pytest

from mobilebuild.results import report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
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


def write(manifests, out_dir):
    paths = report.write_report(manifests, out_dir)
    return paths, (out_dir / "report.md").read_text(), (out_dir / "report.html").read_text()


HEADER = ("| target | status | runs on | median (ms) | p90 (ms) | speed-up | MB | vs eager | SQNR (dB) "
          "| top-1 agreement |")


def test_full_manifest_computes_speed_up_and_size_ratio_against_eager(tmp_path):
    paths, markdown, page = write([full_manifest()], tmp_path)

    assert paths == [tmp_path / "report.md", tmp_path / "report.html"]  # the figures are the plot stage's
    # speed-up = eager median / target median: 12.6 / 6.0 = 2.10, 12.6 / 4.2 = 3.00;
    # size ratio = target bytes / eager bytes: 14.7 / 14.0 = 1.05, 3.5 / 14.0 = 0.25.
    assert HEADER in markdown
    assert ("| eager fp32 | reference | PyTorch eager, fp32 | 12.60 | 13.40 | 1.00x | 14.00 | 1.00x | — | — |"
            in markdown)
    assert ("| xnnpack | passed | PyTorch Mobile, xnnpack, fp32 | 6.00 | 6.50 | 2.10x | 14.70 | 1.05x | 104.3 "
            "| 1.000 |" in markdown)
    assert ("| qnnpack | FAILED | PyTorch Mobile, qnnpack, int8 | 4.20 | 5.10 | 3.00x | 3.50 | 0.25x | 12.5 "
            "| 0.500 |" in markdown)
    assert "accuracy" not in markdown.split("| target |")[1].split("\n")[0]  # no labelled data: no column
    # what a person reads for one target rather than compares sits in a second table, only with what was measured
    assert "| target | cosine | max rel. error |" in markdown and "| qnnpack | 0.973148 | 2.10e-01 |" in markdown
    assert "compression" not in markdown and "sparsity" not in markdown
    assert "- Toolchain: mobilebuild 0.1.0, python 3.11.7, torch 2.12.1, torchvision 0.27.1" in markdown
    assert "- Host: cores 2, cpu Intel Xeon, machine x86_64" in markdown
    assert "- mnv2: 2 target(s): 1 passed, 1 FAILED" in markdown
    assert "Recipe recipes/mnv2.yaml, sha256 0123456789ab." in markdown
    assert "- qnnpack: sqnr_db 12.46 < 20\n- qnnpack: top1_agreement 0.5 < 0.99" in markdown
    assert "- device: skipped (adb not on PATH)" in markdown
    assert "](plots/mnv2.png)" in markdown

    # what to ship comes first: the faster qnnpack failed, and the reason is given
    assert ("**Ship xnnpack (PyTorch Mobile, xnnpack, fp32): the fastest of 1 artifact(s) verified on this host that "
            "pass the default thresholds; 6.00 ms median (2.10x eager fp32), 14.70 MB, SQNR 104.3 dB.**" in markdown)
    assert ("- Faster, but left out: qnnpack (4.20 ms): FAILED (SQNR dB 12.5 < 20, cosine 0.973 < 0.9999, "
            "max rel. error 0.21 > 0.01, top-1 agreement 0.5 < 0.99)." in markdown)

    # The HTML page says the same, with the failed row marked and the columns under their headings.
    assert '<td class="num">2.10x</td>' in page and '<td class="num">0.25x</td>' in page
    failed_row = next(line for line in page.splitlines() if line.startswith("<tr") and ">qnnpack<" in line)
    assert failed_row.startswith('<tr class="failed">') and '<td class="status">FAILED</td>' in failed_row
    assert ('<tr class="groups"><th colspan="3"></th><th colspan="3">latency on the host</th>'
            '<th colspan="2">size</th><th colspan="2">quality vs eager fp32</th></tr>') in page
    assert '<div class="ship">' in page and "<details>" in page
    assert '<img src="plots/mnv2.png"' in page
    assert "<li>qnnpack: sqnr_db 12.46 &lt; 20</li>" in page


def test_html_is_self_contained(tmp_path):
    _, _, page = write([full_manifest()], tmp_path)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page
    for external in ("<script", "<link", "http://", "https://", "@import", "url("):
        assert external not in page


def test_output_is_byte_identical_for_the_same_input(tmp_path):
    manifests = [full_manifest(), {**full_manifest(), "recipe": "second"}]
    first = {p.name: p.read_bytes() for p in report.write_report(manifests, tmp_path)}
    again = {p.name: p.read_bytes() for p in report.write_report(copy.deepcopy(manifests), tmp_path)}
    elsewhere = {p.name: p.read_bytes() for p in report.write_report(manifests, tmp_path / "elsewhere")}
    assert sorted(first) == ["report.html", "report.md"]
    assert first == again == elsewhere


def test_not_run_on_host_skipped_and_missing_benchmarks_show_their_reasons(tmp_path):
    manifest = full_manifest()
    manifest["targets"][0]["status"] = "not run on host"
    manifest["verification"]["xnnpack"] = {  # as the verify stage writes it for a target the host cannot run
        "status": "not run on host", "reason": "needs an ARM CPU", "precision": "fp32", "data": None, "samples": 0,
        "metrics": None, "thresholds": {"sqnr_db": 40}, "failures": []}
    manifest["benchmarks"]["xnnpack"] = {"status": "skipped", "reason": "artifact does not load on x86"}
    del manifest["benchmarks"]["qnnpack"]
    del manifest["verification"]["qnnpack"]
    manifest["targets"][1]["status"] = "not verified"
    _, markdown, page = write([manifest], tmp_path)

    # the status stays short, so that the column never wraps; the reason is under the table
    assert ("| xnnpack | not run on host | PyTorch Mobile, xnnpack, fp32 | — | — | — | 14.70 | 1.05x | — | — |"
            in markdown)
    assert "| qnnpack | not verified | PyTorch Mobile, qnnpack, int8 | — | — | — | 3.50 | 0.25x | — | — |" in markdown
    assert "- not run on host (xnnpack): needs an ARM CPU" in markdown
    assert "**Nothing to ship yet: no artifact verified on this host passes the default thresholds.**" in markdown
    assert ("- To measure on a device (built; this host cannot run them): xnnpack (PyTorch Mobile, xnnpack, fp32)."
            in markdown)
    assert "- benchmark xnnpack: skipped (artifact does not load on x86)" in markdown
    assert "- benchmark qnnpack: not run (none in the manifest)" in markdown
    assert "- mnv2: 2 target(s): 1 not run on host, 1 not verified" in markdown
    assert "verification (" not in markdown  # nothing was checked: no samples or thresholds to speak of
    assert "needs an ARM CPU" in page and "artifact does not load on x86" in page
    assert "](plots/mnv2.png)" in markdown  # eager still ran: there is something to plot


def test_device_results_that_differ_are_listed_per_benchmark(tmp_path):
    manifest = full_manifest()
    manifest["benchmarks"]["xnnpack"]["device"] = {"status": "ran", "serial": "emulator-5554", "mean_ms": 3.25,
                                                   "us_per_iter": 3250.0, "raw": ["..."]}
    manifest["benchmarks"]["qnnpack"]["device"] = {"status": "failed", "reason": "adb push: no space left"}
    _, markdown, _ = write([manifest], tmp_path)
    assert "- device (eager fp32): skipped (adb not on PATH)" in markdown
    assert "- device (xnnpack): ran on emulator-5554, mean 3.25 ms" in markdown  # the binary reports a mean
    assert "- device (qnnpack): failed (adb push: no space left)" in markdown
    assert "- device: " not in markdown


def test_device_lines_name_the_benchmarks_they_cover(tmp_path):
    manifest = full_manifest()
    del manifest["benchmarks"]["eager"]["device"]  # the eager baseline runs on the host only
    _, markdown, _ = write([manifest], tmp_path)
    assert "- device (xnnpack, qnnpack): skipped (adb not on PATH)" in markdown


def test_without_eager_there_is_no_speed_up_and_the_report_says_why(tmp_path):
    manifest = full_manifest()
    del manifest["benchmarks"]["eager"]
    _, markdown, _ = write([manifest], tmp_path)
    assert "| eager fp32 | reference | PyTorch eager, fp32 | — | — | — | — | — | — | — |" in markdown
    assert "| xnnpack | passed | PyTorch Mobile, xnnpack, fp32 | 6.00 | 6.50 | — | 14.70 | — | 104.3 |" in markdown
    assert "- benchmark eager fp32: not run (none in the manifest): no speed-up or size ratio" in markdown


def test_a_recipe_without_benchmarks_gets_no_plots(tmp_path):
    manifest = full_manifest()
    del manifest["benchmarks"]
    paths, markdown, page = write([manifest], tmp_path)
    assert paths == [tmp_path / "report.md", tmp_path / "report.html"]
    assert "plots/" not in markdown and "<img" not in page
    assert "No plots: no benchmark ran for this recipe." in markdown and "No plots" in page
    assert "- Host: no benchmark recorded one" in markdown


def test_accuracy_column_appears_with_labelled_data(tmp_path):
    manifest = full_manifest()
    manifest["verification"]["qnnpack"]["metrics"].update(accuracy_reference=0.9917, accuracy_artifact=0.95)
    manifest["verification"]["xnnpack"]["metrics"]["top1_agreement"] = None  # as a non-classifier has
    _, markdown, _ = write([manifest], tmp_path)
    assert "| top-1 agreement | accuracy |" in markdown
    assert "| 0.25x | 12.5 | 0.500 | 99.2% -> 95.0% |" in markdown
    assert "| 1.00x | — | — | 99.2% |" in markdown  # eager is the reference
    assert "| 104.3 | — | — |" in markdown


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


def test_a_pruned_target_shows_its_pruning_zipped_size_and_sparsity(tmp_path):
    _, markdown, page = write([compressed_manifest()], tmp_path)
    # compression "l1_unstructured 0.5"; zipped 7_350_000 B = 7.35 MB; sparsity 0.49871 = 49.9%.
    assert "| target | compression | zipped (MB) | sparsity |" in markdown
    assert "| pruned | l1_unstructured 0.5 | 7.35 | 49.9% |" in markdown
    assert ("| pruned | passed | PyTorch Mobile, xnnpack, fp32 | 6.00 | 6.50 | 2.10x | 14.70 | 1.05x | 104.3 |"
            in markdown)
    # eager: nothing done to its weights and no sparsity measured, but its checkpoint's zipped size is shown.
    assert "| eager fp32 | — | 13.02 | — |" in markdown
    pruned_row = next(line for line in page.split("<details>")[1].splitlines()
                      if line.startswith("<tr") and ">pruned<" in line)
    assert ("<td>l1_unstructured 0.5</td><td class=\"num\">7.35</td><td class=\"num\">49.9%</td>" in pruned_row)


def test_a_dynamic_quantized_target_shows_its_mode(tmp_path):
    _, markdown, _ = write([compressed_manifest()], tmp_path)
    # weights null: the mode alone; no compressed bytes in its benchmark, no sparsity in its verification.
    assert "| dynamic | dynamic | — | — |" in markdown
    assert ("| dynamic | passed | PyTorch Mobile, qnnpack, int8 | 9.00 | 9.50 | 1.40x | 3.60 | 0.26x | 30.0 |"
            in markdown)


def test_a_static_per_channel_target_shows_mode_and_weights(tmp_path):
    _, markdown, _ = write([compressed_manifest()], tmp_path)
    # zipped 2_870_000 B = 2.87 MB; 12.6 / 4.2 = 3.00x; 3.5 / 14.0 = 0.25x.
    assert "| static | static per_channel | 2.87 | — |" in markdown
    assert "| static | passed | PyTorch Mobile, qnnpack, int8 | 4.20 | 5.10 | 3.00x | 3.50 | 0.25x | 25.0 |" in markdown


def test_pruning_and_quantization_together_are_joined(tmp_path):
    manifest = compressed_manifest()
    manifest["targets"][2]["pruning"] = {"method": "ln_structured", "amount": 0.25, "n": 2, "dim": 0}
    _, markdown, _ = write([manifest], tmp_path)
    assert "| static | ln_structured 0.25, static per_channel | 2.87 |" in markdown


def test_eager_reference_accuracy_comes_from_an_unpruned_target(tmp_path):
    manifest = compressed_manifest()
    # The pruned target comes first; its reference is the pruned eager model (95.0%), not eager fp32 (99.0%).
    manifest["verification"]["pruned"]["metrics"].update(accuracy_reference=0.95, accuracy_artifact=0.94)
    manifest["verification"]["dynamic"]["metrics"].update(accuracy_reference=0.99, accuracy_artifact=0.985)
    manifest["verification"]["static"]["metrics"].update(accuracy_reference=0.99, accuracy_artifact=0.975)
    _, markdown, _ = write([manifest], tmp_path)
    assert "| 1.00x | — | — | 99.0% |" in markdown
    assert "| 104.3 | — | 95.0% -> 94.0% |" in markdown  # the pruned row keeps its own
    assert "| 30.0 | — | 99.0% -> 98.5% |" in markdown
    assert "| 25.0 | — | 99.0% -> 97.5% |" in markdown

    # Every target pruned: no verification measured eager fp32's accuracy, so it is not shown.
    for entry in manifest["targets"]:
        entry["pruning"] = {"method": "l1_unstructured", "amount": 0.5}
    _, markdown, _ = write([manifest], tmp_path / "all_pruned")
    assert "| 1.00x | — | — | — |" in markdown


def test_html_escapes_every_text_from_the_manifest(tmp_path):
    manifest = full_manifest()
    manifest["recipe"] = "x<b>"
    manifest["targets"][0].update(target="<script>alert(1)</script>", status="not run on host",
                                  reason='needs <NEON> & "fp16"')
    _, markdown, page = write([manifest], tmp_path)
    assert "<script" not in page and "<b>" not in page and "<NEON>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "not run on host (&lt;script&gt;alert(1)&lt;/script&gt;): needs &lt;NEON&gt; &amp; &quot;fp16&quot;" in page
    assert "<h2>x&lt;b&gt;</h2>" in page
    assert '<img src="plots/x_b_.png"' in page  # and the file name is made safe
    assert 'not run on host (<script>alert(1)</script>): needs <NEON> & "fp16"' in markdown


def test_markdown_keeps_pipes_inside_table_cells_and_a_multi_line_reason_on_one_line(tmp_path):
    manifest = full_manifest()
    manifest["targets"][0].update(target="x | y", status="not run on host", reason="a | b\nTraceback: line 2")
    _, markdown, _ = write([manifest], tmp_path)
    row = next(line for line in markdown.splitlines() if line.startswith("| x \\| y |"))
    assert row.replace("\\|", "").count("|") == HEADER.count("|")  # as many columns as the header
    assert "- not run on host (x | y): a | b Traceback: line 2" in markdown


@pytest.mark.parametrize("broken", [
    {},
    {"recipe": "bad", "targets": "not a list", "verification": [], "benchmarks": 3},
    {"recipe": "bad", "targets": [None, {"target": "t", "bytes": "big", "status": None}],
     "verification": {"t": {"metrics": {"sqnr_db": "high", "cosine": True}, "failures": None}},
     "benchmarks": {"eager": {"status": "ran", "median_ms": 0, "host": "?", "device": "?"},
                    "t": {"status": "ran", "median_ms": float("nan"), "p10_ms": "x"}}},
    {"recipe": "inf", "targets": [{"target": "t", "bytes": 10, "status": "passed"}],
     "verification": {"t": {"status": "passed", "metrics": {"sqnr_db": float("inf"), "max_rel_error": 0.0}}},
     "benchmarks": {"eager": {"status": "ran", "median_ms": 2.0, "p10_ms": 3.0, "p90_ms": 1.0, "artifact_bytes": 0},
                    "t": {"status": "ran", "median_ms": 1.0}}},
], ids=["empty", "wrong-types", "wrong-values", "inf-and-zero"])
def test_malformed_manifests_render_without_crashing(tmp_path, broken):
    _, markdown, page = write([broken], tmp_path)
    assert markdown.startswith("# mobilebuild report") and "</html>" in page
    assert "| eager fp32 |" in markdown


def test_an_infinite_sqnr_and_a_zero_size_baseline_are_shown_not_divided(tmp_path):
    manifest = {"recipe": "inf", "targets": [{"target": "t", "bytes": 10, "status": "passed"}],
                "verification": {"t": {"status": "passed", "metrics": {"sqnr_db": float("inf")}}},
                "benchmarks": {"eager": {"status": "ran", "median_ms": 2.0, "artifact_bytes": 0},
                               "t": {"status": "ran", "median_ms": 1.0}}}
    _, markdown, _ = write([manifest], tmp_path)
    assert "| t | passed | — | 1.00 | — | 2.00x | 0.000 | — | inf | — |" in markdown


def test_small_models_keep_three_decimals_of_size_and_latency(tmp_path):
    manifest = {"recipe": "tiny", "targets": [{"target": "t", "bytes": 9_400, "status": "passed"}],
                "benchmarks": {"eager": {"status": "ran", "median_ms": 0.093, "p90_ms": 0.1049,
                                         "artifact_bytes": 4_700},
                               "t": {"status": "ran", "median_ms": 0.031, "p90_ms": 0.0404}}}
    _, markdown, _ = write([manifest], tmp_path)
    assert "| eager fp32 | reference | PyTorch eager, fp32 | 0.093 | 0.105 | 1.00x | 0.005 | 1.00x |" in markdown
    assert "| t | passed | — | 0.031 | 0.040 | 3.00x | 0.009 | 2.00x |" in markdown


def test_an_older_manifest_without_targets_takes_them_from_its_artifacts(tmp_path):
    older = {"recipe": "digits", "toolchain": TOOLCHAIN, "artifacts": [
        {"stage": "script", "target": None, "path": "digits/scripted-fp32.pt", "bytes": 181249},
        {"stage": "optimize", "backend": "xnnpack", "runtime": "pytorch-mobile", "target": "xnnpack",
         "path": "digits/digits-xnnpack.ptl", "bytes": 164359}]}
    _, markdown, _ = write([older], tmp_path)
    assert "| xnnpack | not verified | PyTorch Mobile, xnnpack | — | — | — | 0.164 | — | — | — |" in markdown
    assert "scripted" not in markdown
    assert "written by an older mobilebuild" in markdown


def test_a_benchmark_toolchain_that_differs_from_the_build_is_listed_apart(tmp_path):
    manifest = full_manifest()
    manifest["benchmarks"]["qnnpack"]["toolchain"] = {**TOOLCHAIN, "torch": "2.13.0"}
    _, markdown, _ = write([manifest], tmp_path)
    assert "- Toolchain (mnv2): mobilebuild 0.1.0, python 3.11.7, torch 2.12.1, torchvision 0.27.1" in markdown
    assert "- Toolchain (mnv2 qnnpack benchmark): mobilebuild 0.1.0, python 3.11.7, torch 2.13.0" in markdown


def _manifest_file(artifacts, directory, document):
    (artifacts / directory).mkdir(parents=True)
    path = artifacts / directory / "manifest.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def test_load_manifests_sorts_by_recipe_and_skips_unreadable_ones(tmp_path, capsys):
    _manifest_file(tmp_path, "a_dir", {"recipe": "zeta"})
    _manifest_file(tmp_path, "b_dir", {"recipe": "alpha"})
    corrupt = _manifest_file(tmp_path, "c_dir", '{"recipe": "half-writ')
    a_list = _manifest_file(tmp_path, "d_dir", "[1, 2]")
    (tmp_path / "e_dir").mkdir()  # a recipe whose manifest is not built yet

    assert [m["recipe"] for m in report.load_manifests(tmp_path)] == ["alpha", "zeta"]
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith(f"warning: {corrupt}: skipped, not readable as JSON (")
    assert warnings[1] == f"warning: {a_list}: skipped, expected a JSON object, got list"


def test_main_writes_the_report_or_says_there_is_nothing_to_report(tmp_path, capsys):
    assert report.main(tmp_path) == 2
    assert "no manifests in" in capsys.readouterr().err

    _manifest_file(tmp_path, "mnv2", full_manifest())
    assert report.main(tmp_path) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "report.html") in out
    assert (tmp_path / "report.md").read_text().startswith("# mobilebuild report")
    assert not (tmp_path / "plots").exists()  # the build's plot stage draws them


def test_report_does_not_import_torch():
    import subprocess

    code = "import sys, mobilebuild.results.report; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_verdict_against_relaxed_thresholds_says_so(tmp_path):
    manifest = full_manifest()
    manifest["targets"][1]["status"] = "passed"
    manifest["verification"]["qnnpack"].update(
        status="passed", failures=[], relaxed={"sqnr_db": {"used": 10, "default": 15},
                                               "top1_agreement": {"used": 0.25, "default": 0.8}})
    _, markdown, html = write([manifest], tmp_path)
    assert "| qnnpack | passed (relaxed) |" in markdown and "| xnnpack | passed |" in markdown
    assert "RELAXED by the recipe: SQNR dB 10 (default 15), top-1 agreement 0.25 (default 0.8)" in markdown
    assert "passed (relaxed)" in html
    assert '<tr class="relaxed"><td>qnnpack</td>' in html  # not in a passing green
    # a verdict against relaxed thresholds is no reason to ship: the defaults are what the recommendation holds to
    assert ("- Faster, but left out: qnnpack (4.20 ms): passed only with relaxed thresholds (SQNR dB 12.5 < 15, "
            "cosine 0.973 < 0.9999, max rel. error 0.21 > 0.01, top-1 agreement 0.5 < 0.8)." in markdown)


def test_inputs_outputs_and_the_sizes_verified_are_in_the_report(tmp_path):
    manifest = full_manifest()
    dynamic = [{"axis": 1, "dim": "seq", "min": 4, "max": 64}]
    manifest["inputs"] = [
        {"name": "ids", "shape": [1, 32], "dtype": "int64", "range": [0, 64], "dynamic": dynamic},
        {"name": "mask", "shape": [1, 32], "dtype": "int64", "range": [0, 2], "dynamic": dynamic}]
    manifest["targets"][0]["outputs"] = [{"name": "scores", "shape": [1, 4], "dtype": "float32"}]
    manifest["verification"]["xnnpack"]["sizes"] = {
        size: {"shapes": {"ids": [1, length], "mask": [1, length]}, "samples": 16, "sqnr_db": 100.0}
        for size, length in (("max", 64), ("example", 32), ("min", 4))}
    manifest["verification"]["qnnpack"]["fixed_shape"] = "dim seq fixed at the example size: tracing records it"
    _, markdown, page = write([manifest], tmp_path)
    line = ("Inputs: ids [1, seq] int64 in [0, 64), mask [1, seq] int64 in [0, 2); seq from 4 to 64. "
            "Outputs: scores [1, 4] float32.")
    assert line in markdown and line in page
    assert "16 random samples at the min [1, 4], example [1, 32], max [1, 64] sizes;" in markdown
    assert "sizes (qnnpack): dim seq fixed at the example size: tracing records it" in markdown


def test_malformed_inputs_are_left_out_not_fatal(tmp_path):
    manifest = full_manifest()
    manifest["inputs"] = [None, {"name": "x", "shape": "1x3", "dynamic": [{"axis": 9}, "seq"]}, 7]
    _, markdown, _ = write([manifest], tmp_path)
    assert "Inputs: x [] —." in markdown


def test_the_worst_layers_of_int8_targets_are_listed_worst_first_beside_the_table(tmp_path):
    manifest = full_manifest()
    manifest["layers"] = {"qnnpack": {"method": "eager", "compared": 12, "samples": 16, "data": "random",
                                      "seconds": 1.234,
                                      "layers": [{"name": "features.2", "op": "ConvReLU2d", "sqnr_db": 0.84},
                                                 {"name": "head", "op": "Linear", "sqnr_db": 31.0}],
                                      "not_compared": [{"name": "attn", "op": "MultiheadAttention",
                                                        "reason": "int8 gives inf or NaN for 8 of its 64 values"}]},
                          "xnnpack": {"error": "the per-layer comparison failed: | no"}, "gone": None}
    _, markdown, page = write([manifest], tmp_path)

    assert HEADER in markdown  # the main table keeps its columns
    assert ("| target | # | layer | op | SQNR (dB) |\n|---|---:|---|---|---:|\n"
            "| qnnpack | 1 | features.2 | ConvReLU2d | 0.8 |\n| qnnpack | 2 | head | Linear | 31.0 |") in markdown
    assert ("- worst layers (qnnpack): eager numeric suite, 12 layers compared on 16 random samples, 1.2 s"
            in markdown)
    assert "- worst layers (xnnpack): the per-layer comparison failed: | no" in markdown
    assert "- no SQNR (qnnpack): attn (MultiheadAttention): int8 gives inf or NaN for 8 of its 64 values" in markdown
    assert "<summary>Worst layers of the int8 artifacts" in page and "<td>features.2</td>" in page
    for broken in ({"qnnpack": {"layers": "x"}}, {"qnnpack": {"layers": [None, {"sqnr_db": "low"}]}}, "x"):
        write([{**manifest, "layers": broken}], tmp_path)  # renders without failing
    _, untouched, _ = write([full_manifest()], tmp_path)
    assert "Worst layers" not in untouched

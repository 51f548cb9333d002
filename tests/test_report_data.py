"""report_data.py: what the report says about hand-made manifests (values computed by hand, read in the rendered
Markdown where a person reads them), what to ship and why, broken input survived."""

import pytest
from report_manifests import (
    HEADER,
    TOOLCHAIN,
    compressed_manifest,
    full_manifest,
    manifest_file,
    with_software_gpu_target,
    write,
)

from mobilebuild.results import report, report_data


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


def test_accuracy_column_appears_with_labelled_data(tmp_path):
    manifest = full_manifest()
    manifest["verification"]["qnnpack"]["metrics"].update(accuracy_reference=0.9917, accuracy_artifact=0.95)
    manifest["verification"]["xnnpack"]["metrics"]["top1_agreement"] = None  # as a non-classifier has
    _, markdown, _ = write([manifest], tmp_path)
    assert "| top-1 agreement | accuracy |" in markdown
    assert "| 0.25x | 12.5 | 0.500 | 99.2% -> 95.0% |" in markdown
    assert "| 1.00x | — | — | 99.2% |" in markdown  # eager is the reference
    assert "| 104.3 | — | — |" in markdown


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


def test_load_manifests_sorts_by_recipe_and_skips_unreadable_ones(tmp_path, capsys):
    manifest_file(tmp_path, "a_dir", {"recipe": "zeta"})
    manifest_file(tmp_path, "b_dir", {"recipe": "alpha"})
    corrupt = manifest_file(tmp_path, "c_dir", '{"recipe": "half-writ')
    a_list = manifest_file(tmp_path, "d_dir", "[1, 2]")
    (tmp_path / "e_dir").mkdir()  # a recipe whose manifest is not built yet

    assert [m["recipe"] for m in report_data.load_manifests(tmp_path)] == ["alpha", "zeta"]
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 2
    assert warnings[0].startswith(f"warning: {corrupt}: skipped, not readable as JSON (")
    assert warnings[1] == f"warning: {a_list}: skipped, expected a JSON object, got list"


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


def test_the_report_is_data_both_renderers_share():
    """build() decides the rows, their states and what to ship, as plain text and numbers: no markup."""
    section = report_data.build([full_manifest()]).sections[0]
    assert [(row.label, row.state, row.median_ms) for row in section.rows] == [
        ("eager fp32", "reference", 12.6), ("xnnpack", "passed", 6.0), ("qnnpack", "failed", 4.2)]
    assert section.recommendation[0] == (
        "Ship xnnpack (PyTorch Mobile, xnnpack, fp32): the fastest of 1 artifact(s) verified on this host that pass "
        "the default thresholds; 6.00 ms median (2.10x eager fp32), 14.70 MB, SQNR 104.3 dB, top-1 agreement 1.000.")
    assert section.table.cells[2][:3] == ["qnnpack", "FAILED", "PyTorch Mobile, qnnpack, int8"]
    assert section.plot == "mnv2.png" and section.no_plots is None


def test_runtime_families_and_layer_methods_are_named_by_one_function_each():
    manifest = full_manifest()
    manifest["targets"][0]["runtime"], manifest["targets"][1]["runtime"] = "executorch", "toyruntime"
    assert [report_data.family(row) for row in report_data.table_rows(manifest)] == [
        "PyTorch eager", "ExecuTorch", "toyruntime"]  # a runtime without a family keeps its own name
    assert [report_data.layer_method(name) for name in ("eager", "fx", "pt2e", "onnx", "novel", None)] == [
        "eager numeric suite", "FX numeric suite", "PT2E numeric debugger", "ONNX Runtime, node by node", "novel", "—"]


def test_a_pruned_targets_loss_against_the_unpruned_model_is_a_column(tmp_path):
    """Its verdict is against the pruned model ("passed", 90.3% -> 90.3%); what pruning cost was only in a note."""
    manifest = compressed_manifest()
    manifest["verification"]["pruned"]["metrics"].update(accuracy_reference=0.903, accuracy_artifact=0.903)
    manifest["verification"]["pruned"]["against_unpruned"] = {
        "accuracy_reference": 0.995, "accuracy_artifact": 0.903, "top1_agreement": 0.9, "sqnr_db": 12.0,
        "summary": "accuracy 0.995 -> 0.903 (-9.2 points)"}
    _, markdown, page = write([manifest], tmp_path)
    assert "| accuracy | vs unpruned fp32 |" in markdown
    assert "| 90.3% -> 90.3% | -9.2 pt accuracy |" in markdown
    assert "| 99.5% | — |" not in markdown and "<th>vs unpruned fp32</th>" in page
    assert "vs unpruned fp32" not in write([compressed_manifest()], tmp_path / "without")[1]  # nothing pruned says


def test_what_the_timings_are_is_said_beside_the_pick(tmp_path):
    """The pick rests on host medians: the report says whose CPU, that a device may rank them otherwise, and which
    candidates one run cannot tell apart (each median within the other's p10-p90)."""
    manifest = compressed_manifest()
    manifest["benchmarks"]["dynamic"].update(median_ms=4.5, p10_ms=4.1, p90_ms=5.0)  # within static's 4.0-5.1
    lines = report_data.build([manifest]).sections[0].recommendation
    assert lines[0].startswith("Ship static ")
    assert lines[1] == ("Speed here is the build host's CPU (Intel Xeon, 1 thread(s)), not a phone's: a device's CPU, "
                        "and its NPU or GPU delegates, may rank these artifacts otherwise; time them on the device "
                        "(benchmark.device) before choosing on speed.")
    assert lines[2] == ("Not told apart by this run: static and dynamic (4.50 ms), whose medians lie within the "
                        "other's p10-p90 spread of timed iterations; choose among them by size or quality, or time "
                        "them on the device.")
    assert not any("told apart" in line for line in report_data.build([compressed_manifest()]).sections[0]
                   .recommendation)  # 9.0 ms against 4.0-5.1: apart
    _, markdown, page = write([manifest], tmp_path)
    assert "the build host&#x27;s CPU" in page and "- Not told apart by this run: " in markdown


def test_not_built_and_failed_recipes_stand_out_in_the_summary(tmp_path):
    failed = full_manifest()  # its qnnpack failed
    passed = {**compressed_manifest(), "recipe": "fine"}
    paths = report.write_report([failed, passed], tmp_path, {"bad": ["checkpoint:bad: recipes/bad.yaml: ..."]})
    page = paths[1].read_text()
    assert '<li class="not-built">bad: NOT BUILT, 1 error(s): checkpoint:bad: recipes/bad.yaml: ...</li>' in page
    assert '<li class="failed">mnv2: 2 target(s): 1 passed, 1 FAILED</li>' in page
    assert '<li class="built">fine: 3 target(s): 3 passed</li>' in page
    assert "ul.summary li.not-built { color: #cf222e" in page


GENERATOR = "its runtime's generator, a step at a time from Python"  # lm_bench's harnesses
RUNNER = "ExecuTorch's LLM runner (TextLLMRunner)"


def lm_manifest():
    """A language model's: ExecuTorch's program timed by the LLM runner, the engine its apps embed (its generator's
    figures beside them as a cross-check); ONNX Runtime's plain artifact, which has no engine, by its generator."""
    def timed(median_ms, **more):
        return {"status": "ran", "generation": True, "harness": GENERATOR, "median_ms": median_ms,
                "decode_tokens_per_s": 1e3 / median_ms, "prompt_lengths": {"16": {"ttft_ms": 4 * median_ms}}, **more}

    verified = {"status": "passed", "generation": True, "metrics": {"sqnr_db": 30.0, "agreement": 1.0},
                "thresholds": {"sqnr_db": 8.0, "agreement": 0.25}}
    engine = {"harness": RUNNER, "median_ms": 0.3, "decode_tokens_per_s": 1e3 / 0.3,
              "prompt_lengths": {"16": {"ttft_ms": 0.6}}}
    return {"recipe": "lm",
            "targets": [{"target": "et", "backend": "xnnpack", "runtime": "executorch", "precision": "8da4w",
                         "bytes": 300000, "status": "passed"},
                        {"target": "onnx", "backend": "onnx", "runtime": "onnxruntime", "precision": "int4",
                         "bytes": 400000, "status": "passed"}],
            "verification": {"et": verified, "onnx": verified},
            "benchmarks": {"eager": timed(3.0), "et": {**timed(0.5), **engine, "generator": timed(0.5)},
                           "onnx": timed(0.4)}}


def test_a_language_model_is_ranked_on_what_each_app_runs_the_generator_as_a_cross_check():
    (section,) = report_data.build([lm_manifest()]).sections
    # ExecuTorch's LLM runner's 0.3 ms beats ONNX Runtime's generator's 0.4 (through the generator ExecuTorch's 0.5
    # would lose): each row is ranked on what its app runs, and the line says so
    assert section.recommendation[0].startswith(
        "Ship et (ExecuTorch, xnnpack, 8da4w): the fastest of 2 artifact(s) verified on this host that pass the "
        "default thresholds, each timed by what its app runs (the generation table's 'timed by'); 0.300 ms median "
        f"(10.00x eager fp32, timed by {GENERATOR})")
    table = dict(zip(section.generation.header, zip(*section.generation.cells)))
    assert table["timed by"] == (GENERATOR, RUNNER, GENERATOR)
    assert table["decode tokens/s"] == ("333", "3333", "2500")
    assert table["generator TTFT ms"] == ("—", "16: 2.00", "—") and table["generator decode tokens/s"] == (
        "—", "2000", "—")
    groups = dict(section.generation.groups())
    assert groups[report_data.RANKED] == 3 and groups[report_data.CROSS_CHECK] == 2
    assert f"timed by (et): {RUNNER}" in section.notes
    assert any(note.startswith("cross-check (et): also timed by its runtime's generator") for note in section.notes)


def test_without_an_engine_every_row_is_the_generators_and_no_cross_check_is_shown():
    manifest = lm_manifest()
    et = manifest["benchmarks"]["et"]
    et.update(et.pop("generator"))  # as lm_bench writes it where the engine refused the program
    (section,) = report_data.build([manifest]).sections
    shipped = section.recommendation[0]
    assert shipped.startswith("Ship onnx ")
    assert f"each timed by {GENERATOR}; 0.400 ms median (7.50x eager fp32)" in shipped
    assert report_data.CROSS_CHECK not in dict(section.generation.groups())
    assert not any(note.startswith(("timed by", "cross-check")) for note in section.notes)


def test_the_latency_note_says_how_each_timing_was_kept_apart_from_the_stages():
    assert report_data._isolation({"isolation": {"policy": "alone"}}) == ", with no other stage running"
    assert report_data._isolation({"isolation": {"policy": "reserved core", "core": 15}}) == (
        ", on core 15 set aside for measuring (stages ran on the others)")
    assert report_data._isolation({"isolation": {"policy": "cleared core", "core": 1, "cores": [1], "stages": 2}}) == (
        ", on core 1 cleared of the 2 stage(s) still running after the wait for them (they went on on the others)")
    assert report_data._isolation({}) == ""  # a result from before timings recorded it


def test_a_route_whose_host_timings_are_not_a_phones_is_shown_but_never_shipped():
    """ncnn's Vulkan path on a software driver: however fast, not the artifact to ship."""
    lines = report_data.recommend(report_data.table_rows(with_software_gpu_target(full_manifest(), 1.0, "fp32")))
    assert lines[0].startswith("Ship xnnpack ")
    left_out = next(line for line in lines if line.startswith("Faster, but left out"))
    assert "vulkan (1.00 ms): timed on the host's Vulkan driver" in left_out and "not a phone GPU's speed" in left_out


def test_a_note_several_targets_share_is_one_line_naming_them():
    manifest = with_software_gpu_target(full_manifest(), 300.0)
    device = {"vulkan_device": "llvmpipe (LLVM 15.0.6, 256 bits)"}
    manifest["verification"]["vulkan"] = {**manifest["verification"]["vulkan"], "artifact": device}
    twin = {**manifest["targets"][-1], "target": "vulkan-fp32", "precision": "fp32"}
    manifest["targets"].append(twin)
    manifest["verification"]["vulkan-fp32"] = manifest["verification"]["vulkan"]
    (section,) = report_data.build([manifest]).sections
    said = [note for note in section.notes if "Vulkan device llvmpipe" in note]
    assert len(said) == 1 and said[0].endswith("not a phone GPU's (vulkan, vulkan-fp32)"), said

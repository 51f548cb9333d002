"""The plot stage: one real figure per recipe from its manifest, labels that never overlap, failures in red."""

import itertools
import json

import numpy as np
from matplotlib import image
from report_manifests import benchmark, full_manifest, target, verification, with_software_gpu_target

from mobilebuild.plan.stages import PlotConfig
from mobilebuild.results import plots, report_data

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RED = (0xCF, 0x22, 0x2E)


def rows(manifest):
    return report_data.table_rows(manifest)


def _has_colour(path, rgb, tolerance=0.02):
    pixels = image.imread(path)[:, :, :3]
    return bool((np.abs(pixels - np.array(rgb) / 255).max(axis=2) < tolerance).any())


def run_stage(manifest, tmp_path):
    source, output = tmp_path / "manifest.json", tmp_path / "plot.png"
    source.write_text(json.dumps(manifest))
    plots.run({"manifest": source}, PlotConfig(recipe=manifest["recipe"]), output)
    return output


def test_the_stage_draws_a_real_figure_from_the_manifest(tmp_path):
    path = run_stage(full_manifest(), tmp_path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    pixels = image.imread(path)
    assert pixels.shape[1] == plots.FIGURE_WIDTH * plots.DPI  # as wide as the report's page
    assert len(np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)) > 50  # drawn, not a blank canvas


def test_the_same_manifest_gives_the_same_bytes(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    assert run_stage(full_manifest(), tmp_path / "a").read_bytes() == run_stage(full_manifest(),
                                                                                  tmp_path / "b").read_bytes()


def test_a_failed_target_is_drawn_in_red_and_a_passing_one_is_not(tmp_path):
    (tmp_path / "failed").mkdir()
    assert _has_colour(run_stage(full_manifest(), tmp_path / "failed"), RED)
    passing = full_manifest()
    passing["targets"][1]["status"] = "passed"
    (tmp_path / "passed").mkdir()
    assert not _has_colour(run_stage(passing, tmp_path / "passed"), RED)


def crowded():
    """Twelve targets within 1% of each other's latency, size and SQNR: where labels beside points would collide."""
    manifest = full_manifest()
    manifest["targets"], manifest["verification"] = [], {}
    for index in range(12):
        name = f"target-with-a-long-name-{index}"
        manifest["targets"].append(target(name, "xnnpack", "fp32", 14_000_000 + index * 1000, "passed"))
        manifest["verification"][name] = verification("passed", {"sqnr_db": 100 + index / 100})
        manifest["benchmarks"][name] = benchmark("pytorch-mobile", 6.0 + index / 100, 5.9, 6.2, 14_000_000)
    return manifest


def drawn_texts(drawing):
    """Every text the figure shows: titles, axis labels, the tick labels inside the axes' limits (matplotlib keeps
    some outside them, undrawn), annotations and the legend."""
    texts = [drawing._suptitle, *drawing.legends[0].get_texts()]
    for axes in drawing.axes:
        texts += [axes.title, axes.xaxis.label, axes.yaxis.label, *axes.texts]
        for axis in (axes.xaxis, axes.yaxis):
            low, high = sorted(axis.get_view_interval())
            texts += [label for location, label in zip(axis.get_ticklocs(), axis.get_ticklabels())
                      if low <= location <= high]
    return [text for text in texts if text is not None and text.get_visible() and text.get_text().strip()]


def test_no_two_texts_overlap_even_when_every_point_is_in_the_same_place():
    drawing = plots.figure("crowded", rows(crowded()))
    renderer = drawing.canvas.get_renderer()
    drawing.draw(renderer)
    boxes = [(text.get_text(), text.get_window_extent(renderer)) for text in drawn_texts(drawing)]
    assert len(boxes) > 40  # tick labels, the bars' names and values, the legend
    overlapping = [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]
    assert overlapping == []
    page = drawing.bbox
    outside = [text for text, box in boxes if box.x0 < page.x0 or box.x1 > page.x1 or box.y0 < page.y0]
    assert outside == []  # the legend's columns fit the figure
    legend = [text.get_text() for text in drawing.legends[0].get_texts()]
    assert legend == ["eager fp32"] + [f"target-with-a-long-name-{index}" for index in range(12)]


def test_quality_is_accuracy_with_labelled_data_and_sqnr_without():
    label, values = plots.quality(rows(full_manifest()))
    assert label == "SQNR vs eager fp32 (dB)" and values == {"xnnpack": 104.34, "qnnpack": 12.46}

    manifest = full_manifest()
    manifest["verification"]["xnnpack"]["metrics"].update(accuracy_reference=0.99, accuracy_artifact=0.98)
    label, values = plots.quality(rows(manifest))
    assert label == "accuracy (%)" and values == {"xnnpack": 98.0, "eager fp32": 99.0}


def test_a_recipe_without_a_host_benchmark_still_gets_its_file(tmp_path):
    manifest = full_manifest()
    del manifest["benchmarks"]
    assert run_stage(manifest, tmp_path).read_bytes().startswith(PNG_SIGNATURE)


def test_draw_all_draws_every_recipe_from_its_manifest(tmp_path):
    for name in ("alpha", "beta"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({**full_manifest(), "recipe": name}))
    assert plots.draw_all(tmp_path) == 2
    for name in ("alpha", "beta"):
        assert (tmp_path / "plots" / f"{name}.png").read_bytes().startswith(PNG_SIGNATURE)


def test_one_outlying_p90_does_not_stretch_the_latency_axis():
    """An eager p90 of 3.27 ms against medians near 0.1-0.3 ms: the axis ends near the medians, the p90 is written."""
    manifest = full_manifest()
    manifest["benchmarks"]["eager"].update(median_ms=0.3, p10_ms=0.28, p90_ms=3.27)
    manifest["benchmarks"]["xnnpack"].update(median_ms=0.1, p10_ms=0.09, p90_ms=0.12)
    manifest["benchmarks"]["qnnpack"].update(median_ms=0.2, p10_ms=0.19, p90_ms=0.22)
    drawing = plots.figure("outlier", rows(manifest))
    latency = drawing.axes[0]
    assert latency.get_xlim()[1] <= plots.OUTLIER_REACH * 0.3 * 1.15 + 1e-9
    assert "0.300 (p90 3.27 ms, beyond the axis)" in [text.get_text() for text in latency.texts]
    assert [text.get_text() for text in latency.texts][1:] == ["0.100", "0.200"]  # within reach: as before


def test_targets_with_equal_numbers_are_drawn_side_by_side():
    manifest = full_manifest()
    manifest["benchmarks"]["qnnpack"].update(median_ms=6.0, artifact_bytes=14_700_000)  # as xnnpack
    manifest["targets"][1]["bytes"] = 14_700_000
    drawing = plots.figure("equal", rows(manifest))
    drawing.canvas.draw()
    size_panel = drawing.axes[1]
    where = [tuple(points.get_offset_transform().transform(points.get_offsets())[0])
             for points in size_panel.collections]
    assert len(where) == 3 and len(set(where)) == 3  # eager, and the two targets in the same place, each visible
    (x_one, y_one), (x_two, y_two) = where[1:]
    assert y_one == y_two and abs(x_one - x_two) >= plots.SIDE_BY_SIDE  # display pixels at 100 dpi: >= 9 points


def test_close_markers_move_apart_in_latency_order():
    """Three targets a fraction of a marker apart (MobileNetV2's xnnpack, et-xnnpack and onnx near 14 MB): the shifts
    keep their order, so the slowest is not pushed onto the others."""
    shifts = plots._side_by_side([(23.47, 14.25), (8.42, 14.0), (27.57, 7.47), (7.73, 13.99), (7.56, 14.0)], 31.7)
    assert shifts == [0.0, plots.SIDE_BY_SIDE, 0.0, 0.0, -plots.SIDE_BY_SIDE]


def test_a_timing_that_is_never_ranked_is_not_drawn_and_the_axis_says_so():
    """ncnn's Vulkan path on a software driver (300 ms where the CPU targets take 5): its bar would squeeze them."""
    rows = report_data.table_rows(with_software_gpu_target(full_manifest(), 300.0))
    assert [row.label for row in plots.timed(rows)] == ["eager fp32", "xnnpack", "qnnpack"]
    drawn = plots.figure("mnv2", rows)
    latency = next(axes for axes in drawn.axes if axes.get_xlabel().startswith("median latency"))
    assert "not drawn: vulkan (its host timing is never ranked" in latency.get_xlabel()
    assert latency.get_xlim()[1] < 50

"""The benchmark regression gate on hand-made manifests."""

import json

from mobilebuild.results import baseline


def manifest(recipe, **medians):
    return {"recipe": recipe, "benchmarks": {
        **{target: {"status": "ran", "median_ms": ms} for target, ms in medians.items()},
        "nnapi": {"status": "skipped", "reason": "device only"}}}


def test_save_then_compare_unchanged(tmp_path, capsys):
    saved = tmp_path / "baseline.json"
    baseline.save([manifest("m", eager=10.0, xnnpack=4.0)], saved)
    assert json.loads(saved.read_text()) == {"median_ms": {"m/eager": 10.0, "m/xnnpack": 4.0}}
    assert baseline.compare([manifest("m", eager=10.5, xnnpack=4.0)], saved, tolerance=0.10) == []


def test_slower_than_the_tolerance_is_an_offender(tmp_path, capsys):
    saved = tmp_path / "baseline.json"
    baseline.save([manifest("m", eager=10.0, xnnpack=4.0, qnnpack=2.0)], saved)
    offenders = baseline.compare([manifest("m", eager=10.9, xnnpack=4.8, qnnpack=2.0)], saved, tolerance=0.10)
    assert offenders == ["m/xnnpack 1.20x (4.000 -> 4.800 ms)"]
    out, err = capsys.readouterr()
    assert "m/xnnpack" in out and "SLOWER" in out
    assert "1 target(s) slower than the baseline by more than 10%" in err


def test_targets_missing_on_either_side_are_listed_not_failed(tmp_path, capsys):
    saved = tmp_path / "baseline.json"
    baseline.save([manifest("m", eager=10.0, old=1.0)], saved)
    assert baseline.compare([manifest("m", eager=10.0, new=1.0)], saved, tolerance=0.10) == []
    out, _ = capsys.readouterr()
    assert "not benchmarked now" in out and "new" in out

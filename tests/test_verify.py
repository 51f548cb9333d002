"""Verification data (worker/stages/verify.py): never the calibration data, whatever the source; the held-out part
of the calibration source on request; one line when calibration and verification data differ in kind."""

from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import calibration, verify

INPUTS = [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]


def config(evaluation=None, source=None, samples=16, seed=0, calibrated=True):
    return SimpleNamespace(inputs=INPUTS, samples=samples, seed=seed, evaluation=evaluation, calibration=source,
                           calibrated=calibrated, fixed_shape=None)


def numbered_batches(count=20):
    """A recipe calibration function (tests/test_verify.py:numbered_batches): batch i is filled with i."""
    return (torch.full((1, 3, 8, 8), float(i)) for i in range(count))


def rows(batches):
    """The rows of the one input's tensor of each batch (a tuple of tensors, one per input)."""
    return {tuple(row.flatten().tolist()) for row in torch.cat([tensor for (tensor,) in batches])}


def evaluation_data(settings):
    """The one group of inputs verification uses for a recipe without dynamic dims, and its description."""
    groups, description = verify.evaluation_data(settings)
    ((size, inputs, labels),) = groups
    assert size == "example" and len(inputs) == 1
    return inputs, labels, description


@pytest.mark.parametrize("seed", [0, 3, 2**30 - 20])
def test_random_verification_inputs_are_never_calibration_batches(seed):
    source = {"source": "random", "batches": 64, "seed": 0}
    calibrated = rows(calibration.batches(source, INPUTS))
    for evaluation in (None, verify.HOLDOUT):
        inputs, labels, description = evaluation_data(config(evaluation, source, seed=seed))
        assert description == "random" and labels is None and len(inputs[0]) == 16
        assert not rows([inputs]) & calibrated


def test_a_functions_held_out_batches_are_those_after_calibrations():
    source = {"source": "function", "function": "test_verify:numbered_batches", "kwargs": {}, "batches": 8}
    inputs, _, description = evaluation_data(config(verify.HOLDOUT, source, samples=5))
    assert description == "held-out calibration"
    assert [int(row[0, 0, 0]) for row in inputs[0]] == [8, 9, 10, 11, 12]
    assert not rows([inputs]) & rows(calibration.batches(source, INPUTS))


def test_a_function_with_nothing_left_after_calibration_is_one_line():
    source = {"source": "function", "function": "test_verify:numbered_batches", "kwargs": {"count": 8},
              "batches": 8}
    with pytest.raises(MobileBuildError, match="yields nothing after calibration's 8 batches") as caught:
        verify.evaluation_data(config(verify.HOLDOUT, source))
    assert caught.value.field == "verify.evaluation"


def test_held_out_images_are_those_calibration_does_not_read(tmp_path):
    for index in range(6):
        Image.new("RGB", (8, 8), (index * 40, 0, 0)).save(tmp_path / f"{index}.png")
    source = {"source": "images", "path": str(tmp_path), "batches": 4}
    inputs, _, _ = evaluation_data(config(verify.HOLDOUT, source))
    assert [round(float(row[0, 0, 0]) * 255) for row in inputs[0]] == [160, 200]  # images 4 and 5
    assert not rows([inputs]) & rows(calibration.batches(source, INPUTS))
    with pytest.raises(MobileBuildError, match=r"calibration reads all 6 images .* add images, or lower "
                                               r"quantize.calibration.batches"):
        verify.evaluation_data(config(verify.HOLDOUT, {**source, "batches": 6}))


def test_holdout_without_a_calibration_source_is_one_line():
    with pytest.raises(MobileBuildError, match="this recipe has none: set quantize.calibration"):
        verify.evaluation_data(config(verify.HOLDOUT, None))


@pytest.mark.parametrize("source, description, calibrated, noted", [
    ({"source": "images"}, "random", True, True),
    ({"source": "function"}, "random", True, True),
    ({"source": "random"}, "random", True, False),
    ({"source": "images"}, "held-out calibration", True, False),
    ({"source": "images"}, "random", False, False),  # fp32, or dynamic int8: calibration did not shape it
])
def test_random_verification_of_an_artifact_calibrated_on_user_data_is_noted(source, description, calibrated,
                                                                              noted):
    note = verify.data_mismatch(config(source=source, calibrated=calibrated), description)
    assert bool(note) == noted
    if noted:
        assert note == (f"verified on random inputs, but calibrated on the recipe's {source['source']} data: set "
                        "verify.evaluation to calibration-holdout (or a function) to verify on data like the model's")


@pytest.mark.slow
def test_the_build_notes_random_verification_of_image_calibration_and_holds_out_on_request(project):
    import json

    from conftest import tiny_recipe

    (project.root / "calib").mkdir()
    for index in range(12):
        Image.new("RGB", (8, 8), (index * 20, 255 - index * 20, 90)).save(project.root / "calib" / f"{index}.png")
    images = {"source": "images", "path": "../calib", "batches": 8}  # relative to the recipe
    anything = {"sqnr_db": -100, "cosine": 0, "max_rel_error": 1000, "top1_agreement": 0}  # random data: -0.6 dB
    project.write_recipe(tiny_recipe(quantize={"calibration": images}, targets=[{"backend": "qnnpack"}],
                                     verify={"thresholds": {"int8": anything}}))

    noted = project.run()

    assert noted.returncode == 0, noted.stderr
    assert "   note: verified on random inputs, but calibrated on the recipe's images data" in noted.stdout
    assert "verification data (qnnpack): verified on random inputs" in project.artifact("report.md").read_text()

    project.write_recipe(tiny_recipe(quantize={"calibration": images}, targets=[{"backend": "qnnpack"}],
                                     verify={"evaluation": "calibration-holdout", "samples": 4}))
    held_out = project.run("verify")

    assert held_out.returncode == 0, held_out.stderr
    assert "note:" not in held_out.stdout
    result = json.loads(project.artifact("tiny/verify-qnnpack.json").read_text())
    assert (result["data"], result["samples"]) == ("held-out calibration", 4)  # images 8 to 11

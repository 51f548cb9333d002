"""The photographs MobileNetV2 is calibrated and verified on: real, normalised, and never the same image."""

import torch

from mobilebuild.examples import photos


def test_calibration_and_verification_read_different_photographs():
    calibration = torch.cat(list(photos.calibration_batches(batch_size=8, count=16)))
    held_out = photos.evaluation_data(samples=16)
    assert calibration.shape == held_out.shape == (16, 3, 224, 224)
    # ImageNet-normalised: about zero mean and unit spread, not [0, 1] pixels
    assert -1.5 < calibration.mean() < 1.5 and 0.3 < calibration.std() < 2.0
    # no crop of one photograph equals a crop of the other, and the crops of one are not all alike
    assert torch.cdist(calibration.flatten(1), held_out.flatten(1)).min() > 1.0
    assert torch.cdist(calibration.flatten(1), calibration.flatten(1)).fill_diagonal_(float("inf")).min() > 1.0


def test_the_same_seed_gives_the_same_crops():
    assert torch.equal(photos.evaluation_data(samples=4), photos.evaluation_data(samples=4))
    assert not torch.equal(photos.evaluation_data(samples=4, seed=1), photos.evaluation_data(samples=4, seed=2))

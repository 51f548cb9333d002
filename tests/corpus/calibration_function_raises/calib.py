"""Calibration batches from a dataset that is not there."""


def batches():
    raise FileNotFoundError("data/calibration.npz: no such file")
    yield  # a generator: the error surfaces on the first batch, inside the quantize stage

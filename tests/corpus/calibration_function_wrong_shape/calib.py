"""Calibration batches of the wrong image size: 16 x 16 where the model takes 8 x 8."""

import torch


def batches():
    while True:
        yield torch.randn(1, 3, 16, 16)

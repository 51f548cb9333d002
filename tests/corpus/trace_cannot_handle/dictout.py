"""forward returns a string next to the tensor: torch.jit.trace only records tensors; scripting keeps it."""

import torch
from torch import nn


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x), "logits"


def make():
    return DictOut()

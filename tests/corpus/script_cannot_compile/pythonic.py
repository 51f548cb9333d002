"""forward uses Python that torch.jit.script cannot compile (a generator expression over *args); tracing works."""

import torch
from torch import nn


class Pythonic(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, *inputs):
        return sum(self.conv(x) for x in inputs)


def make():
    return Pythonic()

import torch
from torch import nn


class ErfNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return torch.erfinv(self.linear(x).clamp(-0.5, 0.5))


def make():
    return ErfNet()

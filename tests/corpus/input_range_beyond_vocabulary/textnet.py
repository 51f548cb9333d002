import torch
from torch import nn


class TextNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(100, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(dim=1))


def make():
    return TextNet()

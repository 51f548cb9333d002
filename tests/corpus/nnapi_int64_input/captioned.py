"""An image and token ids: image features plus the mean of the ids' embeddings."""

import torch
from torch import nn


class Captioned(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.embedding = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, image, ids):
        return self.head(torch.flatten(self.pool(self.conv(image)), 1) + self.embedding(ids).mean(1))


def make():
    return Captioned()

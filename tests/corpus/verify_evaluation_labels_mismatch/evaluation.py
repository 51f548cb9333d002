"""Evaluation data with 16 inputs but 10 labels (the last batch of labels was dropped)."""

import torch


def data():
    return torch.randn(16, 3, 8, 8), torch.randint(0, 5, (10,))

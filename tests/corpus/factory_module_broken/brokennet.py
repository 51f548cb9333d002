"""A model module with a syntax error (a missing closing parenthesis)."""

from torch import nn


def make(:
    return nn.Conv2d(3, 4, 3)

"""Evaluation data whose loader fails."""


def data(split):
    raise KeyError(f"no split {split!r} in the dataset (have: train, val)")

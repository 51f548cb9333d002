"""A factory that returns the model's configuration instead of the model."""


def make():
    return {"layers": 3, "width": 4}

"""Loading an artifact in the runtime it ships for, as a callable from input tensors to output tensors.

Each runtime module has `load(path, config)`; `config` is the verify or bench stage's settings, which name the
module (`runtime_module`, from the target's route) and hold what it needs (engine, model source, timing). Some also
have `inspect(path, config)`: facts checkable on the host without running the model (what was delegated, operand
counts), recorded also for artifacts that run only on a device.
"""

import importlib


def _module(config):
    return importlib.import_module(config.runtime_module)


def load(path, config):
    return _module(config).load(path, config)


def inspect(path, config):
    """The runtime's host-checkable facts about the artifact, or None when it has none to give."""
    module = _module(config)
    return module.inspect(path, config) if hasattr(module, "inspect") else None


def arm64_options(path, config):
    """What the runtime's runner in the emulated aarch64 Python needs to know of the artifact that this host reads
    (worker/guest), {} where nothing."""
    module = _module(config)
    return module.arm64_options(path, config) if hasattr(module, "arm64_options") else {}


def app_runner(config):
    """The runner apps embed for the runtime's language models (its module's `app_runner`: worker/stages/lm_bench.py
    says what it has), or None where its family has none."""
    return getattr(_module(config), "app_runner", None)


def load_generator(path, config, eager=False):
    """A language model a step at a time (worker/lm.py): the artifact in its runtime, or with `eager` the eager
    model from its checkpoint."""
    module = importlib.import_module(f"{__name__}.eager") if eager else _module(config)
    return module.generator(path, config)

"""Loading an artifact in the runtime it ships for, as a callable from an input tensor to an output tensor.

Each runtime module has `load(path, config)`; `config` is the node's config (engine, model source, ...). Some also
have `inspect(path, config)`: facts checkable on the host without running the model (what was delegated, operand
counts), recorded also for artifacts that run only on a device.
"""

import importlib

RUNTIME_MODULES = {
    "pytorch-mobile": "mobilebuild.runtimes.lite",
    "eager": "mobilebuild.runtimes.eager",
    "executorch": "mobilebuild.runtimes.executorch",
    "onnxruntime": "mobilebuild.runtimes.onnxruntime",
    "nnapi": "mobilebuild.runtimes.nnapi",
}


def _module(runtime):
    return importlib.import_module(RUNTIME_MODULES[runtime])


def load(runtime, path, config):
    return _module(runtime).load(path, config)


def inspect(runtime, path, config):
    """The runtime's host-checkable facts about the artifact, or None when it has none to give."""
    module = _module(runtime)
    return module.inspect(path, config) if hasattr(module, "inspect") else None

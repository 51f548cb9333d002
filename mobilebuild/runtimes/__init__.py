"""Loading an artifact in the runtime it ships for, as a callable from an input tensor to an output tensor.

Each runtime module has `load(path, config)`; `config` is the node's config (engine, model source, ...).
"""

import importlib

RUNTIME_MODULES = {
    "pytorch-mobile": "mobilebuild.runtimes.lite",
    "eager": "mobilebuild.runtimes.eager",
}


def load(runtime, path, config):
    return importlib.import_module(RUNTIME_MODULES[runtime]).load(path, config)

"""The fp32 eager model from its checkpoint: the reference every artifact is compared with."""

from mobilebuild.worker.stages import modeling


def load(path, config):
    return modeling.restore_model(config.model, path)

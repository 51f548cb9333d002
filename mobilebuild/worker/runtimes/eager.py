"""The fp32 eager model from its checkpoint: the reference every artifact is compared with."""

from mobilebuild.worker.stages import modeling


def load(path, config):
    return modeling.restore_model(config.model, path)


def generator(path, config):
    """The eager causal LM from its checkpoint, a step at a time with transformers' DynamicCache."""
    from mobilebuild.worker import lm

    return lm.EagerGenerator(lm.causal_lm(config.model, path))

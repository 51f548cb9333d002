"""checkpoint: the model's weights materialised as a state_dict (from a checkpoint file, training, or a seed),
checked against the example input."""

import contextlib

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import modeling

STATS_BATCH = 8  # batch norm needs more than one value per channel in training mode


def reestimate_batchnorm(model, input_config, batches, seed):
    """Recompute batch-norm running statistics as a cumulative average over seeded random batches, so a
    randomly initialised model gives outputs of a sane scale (its defaults hide real numerical bugs)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    model.train()
    with torch.no_grad():
        for index in range(batches):
            model(modeling.example_input(input_config, seed=seed + 1 + index, batch=STATS_BATCH))
    for norm in norms:
        norm.momentum = 0.1
    return model.eval()


@contextlib.contextmanager
def rejected_input(input_config):
    """Whatever the model raises on its first forward is, for the user, a wrong input shape."""
    try:
        yield
    except Exception as exc:
        raise MobileBuildError(
            f"the model rejects an input of shape {input_config['shape']}: {modeling.first_line(exc)}",
            field="input.shape") from None


def check_input(model, input_config):
    with torch.no_grad(), rejected_input(input_config):
        model(modeling.example_input(input_config))


def run(inputs, config, output):
    model = modeling.build_model(config.model, config.seed)
    if "weights" in inputs:
        modeling.load_weights(model, inputs["weights"], field="model.checkpoint")
    if config.batchnorm_stats:
        with rejected_input(config.input):
            reestimate_batchnorm(model, config.input, config.batchnorm_stats, config.seed)
    else:
        check_input(model, config.input)
    modeling.save(model.state_dict(), output)

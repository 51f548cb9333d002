"""checkpoint: the model's weights materialised as a state_dict (from a checkpoint file, training, or a seed),
checked against the example input."""

import contextlib

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import modeling

STATS_BATCH = 8  # batch norm needs more than one value per channel in training mode


def reestimate_batchnorm(model, specs, batches, seed):
    """Recompute batch-norm running statistics as a cumulative average over seeded random batches, so a
    randomly initialised model gives outputs of a sane scale (its defaults hide real numerical bugs)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    model.train()
    with torch.no_grad():
        for index in range(batches):
            model(*modeling.example_inputs(specs, seed=seed + 1 + index, batch=STATS_BATCH))
    for norm in norms:
        norm.momentum = 0.1
    return model.eval()


@contextlib.contextmanager
def rejected_input(specs, size="example"):
    """Whatever the model raises on its first forward is, for the user, a wrong input shape or dtype."""
    try:
        yield
    except Exception as exc:
        shapes = ", ".join(f"{spec['name']} {modeling.shape_at(spec, size)} {spec['dtype']}" for spec in specs)
        at = "" if size == "example" else f" (the dims' {size} sizes)"
        where = "input" if len(specs) == 1 else "inputs"
        field, hint = f"{where}.shape" if len(specs) == 1 else where, ""
        ranged = [index for index, spec in enumerate(specs) if "range" in spec]
        if isinstance(exc, IndexError) and ranged:  # an embedding looked up beyond its size
            index = ranged[0]
            field = "input.range" if len(specs) == 1 else f"inputs[{index}].range"
            hint = (f"; {specs[index]['name']}'s values come from its range {specs[index]['range']}: keep it below "
                    "the embedding's size (the vocabulary)")
        raise MobileBuildError(f"the model rejects inputs {shapes}{at}: {modeling.first_line(exc)}{hint}",
                               field=field) from None


def check_input(model, specs):
    """The model takes its inputs at the example's sizes, and at each dynamic dim's smallest and largest."""
    for size in modeling.sizes(specs):
        with torch.no_grad(), rejected_input(specs, size):
            model(*modeling.example_inputs(specs, size=size))


def run(inputs, config, output):
    model = modeling.build_model(config.model, config.seed)
    if "weights" in inputs:
        modeling.load_weights(model, inputs["weights"], field="model.checkpoint")
    if config.batchnorm_stats:
        with rejected_input(config.inputs):
            reestimate_batchnorm(model, config.inputs, config.batchnorm_stats, config.seed)
    check_input(model, config.inputs)
    modeling.save(model.state_dict(), output)

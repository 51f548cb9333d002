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


# What a batched input of a fixed-rank first layer holds, by its rank: the layout a wrong-rank shape is missing
LAYOUTS = {3: "batch, channels, length", 4: "batch, channels, height, width",
           5: "batch, channels, depth, height, width"}


def _first_layer_rank(model, shape):
    """(layer name, its type, the rank it takes) when the first convolution a forward on `shape` calls gets an input
    of another rank than a batched one (a Conv2d takes [N, C, H, W]; torch reads a 3-d input as one unbatched image,
    and then complains about channels); None otherwise."""
    called = []

    def note(name):
        def hook(layer, args):
            if not called and args and isinstance(args[0], torch.Tensor):
                called.append((name, layer, args[0].dim()))
        return hook

    hooks = [layer.register_forward_pre_hook(note(name)) for name, layer in model.named_modules()
             if isinstance(layer, torch.nn.modules.conv._ConvNd)]
    try:
        with torch.no_grad(), contextlib.suppress(Exception):
            model(torch.zeros(shape))
    finally:
        for hook in hooks:
            hook.remove()
    if not called:
        return None
    name, layer, rank = called[0]
    takes = len(layer.kernel_size) + 2
    return (name, type(layer).__name__, takes) if rank == len(shape) != takes else None


@contextlib.contextmanager
def rejected_input(specs, size="example", model=None):
    """Whatever the model raises on its first forward is, for the user, a wrong input shape or dtype; with the model,
    a lone input of the wrong rank for its first convolution is named as such."""
    try:
        yield
    except Exception as exc:
        shape = modeling.shape_at(specs[0], size)
        wrong_rank = (_first_layer_rank(model, shape) if model is not None and len(specs) == 1
                      and modeling.DTYPES[specs[0]["dtype"]].is_floating_point else None)
        if wrong_rank:
            name, kind, rank = wrong_rank
            raise MobileBuildError(
                f"the recipe's shape {shape} has rank {len(shape)}, but the model's first layer, {name} ({kind}), "
                f"takes rank {rank} ([{LAYOUTS.get(rank, '...')}]): give input.shape {rank} sizes "
                f"(torch: {modeling.first_line(exc)})", field="input.shape") from None
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
        with torch.no_grad(), rejected_input(specs, size, model):
            model(*modeling.example_inputs(specs, size=size))


def run(inputs, config, output):
    model = modeling.build_model(config.model, config.seed, notes=True)
    if "weights" in inputs:
        modeling.load_weights(model, inputs["weights"], field="model.checkpoint")
    if config.batchnorm_stats:
        with rejected_input(config.inputs, model=model):
            reestimate_batchnorm(model, config.inputs, config.batchnorm_stats, config.seed)
    check_input(model, config.inputs)
    modeling.save(model.state_dict(), output)

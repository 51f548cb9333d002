"""prune: torch.nn.utils.prune on the checkpoint's weights, made permanent, so the artifact is a plain state_dict.

Unstructured sparsity leaves dense tensors full of zeros: it shrinks the compressed artifact, not the dense
kernels' time. Structured pruning (ln_structured) zeroes whole channels, which is what a later slimming can use.
"""

import torch
from torch import nn
from torch.nn.utils import prune

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import modeling

PRUNABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def chosen_modules(model, names):
    modules = dict(model.named_modules())
    if names is None:
        return {name: m for name, m in modules.items() if isinstance(m, PRUNABLE)}
    unknown = [name for name in names if not isinstance(getattr(modules.get(name), "weight", None), torch.Tensor)]
    if unknown:
        raise MobileBuildError(f"no module with a weight named {', '.join(map(repr, unknown))} in the model",
                               field="prune.modules")
    return {name: modules[name] for name in names}


def apply(model, settings):
    """Prune `model` in place as `settings` say; return the names of the modules pruned."""
    modules = chosen_modules(model, settings.get("modules"))
    torch.manual_seed(settings["seed"])  # random_unstructured draws from the global generator
    for name, module in modules.items():
        if settings["method"] == "ln_structured":
            dims = module.weight.dim()
            if not -dims <= settings["dim"] < dims:
                raise MobileBuildError(f"dim {settings['dim']} is out of range for {name}.weight ({dims} dimensions)",
                                       field="prune.dim")
        try:
            if settings["method"] == "ln_structured":
                prune.ln_structured(module, "weight", amount=settings["amount"], n=settings["n"],
                                    dim=settings["dim"])
            else:
                getattr(prune, settings["method"])(module, "weight", amount=settings["amount"])
        except (ValueError, TypeError, IndexError, RuntimeError) as exc:  # torch's checks of the recipe's settings
            raise MobileBuildError(f"cannot prune {name}.weight: {modeling.first_line(exc)}", field="prune") from None
        prune.remove(module, "weight")  # bake the mask into the weight: a plain state_dict again
    return sorted(modules)


def sparsity(state, names=None):
    """Fraction of exact zeros per weight (of the named modules, or every weight of 2 or more dims) and overall."""
    weights = {key.removesuffix(".weight"): tensor for key, tensor in state.items()
               if key.endswith(".weight") and tensor.dim() >= 2
               and (names is None or key.removesuffix(".weight") in names)}
    zeros = {name: (tensor == 0).sum().item() for name, tensor in weights.items()}
    total = sum(t.numel() for t in weights.values())
    return {"overall": sum(zeros.values()) / total if total else 0.0,
            "modules": {name: zeros[name] / weights[name].numel() for name in sorted(weights)}}


def run(inputs, config, output):
    model = modeling.restore_model(config.model, inputs["checkpoint"])
    apply(model, config.prune)
    modeling.save(model.state_dict(), output)

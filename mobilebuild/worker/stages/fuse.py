"""fuse: fold and fuse module sequences in eager mode (the performance recipe, step 1).

Batch norm that follows a convolution is folded here whatever the `fuse` setting: optimize_for_mobile's own
Conv-BN folding silently drops the bias of traced Conv(bias=False)-BN modules (pytorch/pytorch#76807), so no
batch norm after a convolution may reach it.
"""

import torch
from torch import nn

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import modeling

CONVS = {nn.Conv1d: nn.BatchNorm1d, nn.Conv2d: nn.BatchNorm2d, nn.Conv3d: nn.BatchNorm3d}


def _fusable(chain):
    """Is this sequence of module types one that torch.ao.quantization.fuse_modules accepts?"""
    head, *rest = map(type, chain)
    kinds = tuple("bn" if t is CONVS.get(head) else "relu" if t is nn.ReLU else "other" for t in rest)
    if head in CONVS:
        return kinds in {("bn",), ("bn", "relu"), ("relu",)}
    if head is nn.Linear:
        return kinds == ("relu",) or (len(rest) == 1 and rest[0] is nn.BatchNorm1d)
    return False


def _call_sequences(model):
    """Chains of module calls where each output feeds only the next module, from an FX trace of forward;
    for models FX cannot trace, consecutive children of nn.Sequential containers."""
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # data-dependent control flow and the like: fall back to the static structure
        return _sequential_runs(model)
    calls = [node for node in graph.nodes if node.op == "call_module"]
    called_once = {t for t in (n.target for n in calls) if [c.target for c in calls].count(t) == 1}
    chains = []
    for node in calls:
        chain = [node]
        while len(chain) < 3 and len(chain[-1].users) == 1:
            (user,) = chain[-1].users
            if user.op != "call_module" or user.target not in called_once:
                break
            chain.append(user)
        if node.target in called_once and len(chain) > 1:
            chains.append([n.target for n in chain])
    return chains


def _sequential_runs(model):
    runs = []
    for prefix, module in model.named_modules():
        if isinstance(module, nn.Sequential):
            names = [f"{prefix}.{name}" if prefix else name for name, _ in module.named_children()]
            runs.extend(names[i:i + 3] for i in range(len(names) - 1))
    return runs


def find_groups(model, conv_bn_only=False):
    """Non-overlapping module-name groups to fuse, longest match first."""
    modules = dict(model.named_modules())
    taken, groups = set(), []
    for chain in _call_sequences(model):
        for length in (3, 2):
            candidate = chain[:length]
            kinds = [modules[name] for name in candidate]
            if len(candidate) < length or not _fusable(kinds) or taken & set(candidate):
                continue
            if conv_bn_only:
                if not (type(kinds[0]) in CONVS and isinstance(kinds[1], nn.modules.batchnorm._BatchNorm)):
                    continue
                candidate = candidate[:2]
            groups.append(candidate)
            taken.update(candidate)
            break
    return groups


def _check_explicit(model, groups):
    modules = dict(model.named_modules())
    for index, group in enumerate(groups):
        unknown = [name for name in group if name not in modules]
        if unknown:
            raise MobileBuildError(f"no module named {', '.join(map(repr, unknown))} in the model",
                                   field=f"fuse[{index}]")
        if not _fusable([modules[name] for name in group]):
            kinds = ", ".join(type(modules[name]).__name__ for name in group)
            raise MobileBuildError(f"cannot fuse ({kinds}); fusable: Conv-BN, Conv-BN-ReLU, Conv-ReLU, Linear-ReLU, "
                                   "Linear-BN", field=f"fuse[{index}]")


def _own_fusion(model, qat):
    """Models that know their own fusion (torchvision's quantizable models, the NNAPI post's recipe) say so with
    fuse_model(); it is authoritative, and cheaper than tracing."""
    fuse_model = getattr(model, "fuse_model", None)
    if not callable(fuse_model):
        return False
    try:
        fuse_model(is_qat=True) if qat else fuse_model()
    except Exception:  # a fuse_model that takes other arguments, or fails: find the groups ourselves
        return False
    return True


def fuse(model, setting, qat=False):
    """Fuse `model` in place; return it and the groups that were fused (beyond the model's own fuse_model()).

    For quantization-aware training (`qat`) batch norm is kept inside the fused modules, to be folded when the
    trained model is converted; otherwise it is folded now."""
    model.train(qat)
    if setting == "auto" and not _own_fusion(model, qat):
        groups = find_groups(model)  # already holds every Conv-BN pair there is to fold
    else:
        groups = [list(group) for group in (setting or [])] if setting != "auto" else []
        _check_explicit(model, groups)
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            covered = {name for group in groups for name in group}
            groups += [g for g in find_groups(model, conv_bn_only=True) if not covered & set(g)]
    if groups:
        fuse_modules = torch.ao.quantization.fuse_modules_qat if qat else torch.ao.quantization.fuse_modules
        fuse_modules(model, groups, inplace=True)
    return model, groups


def load(path, config):
    """The fused model stored at `path`, for the stages after fuse: its weights, read weights-only, in the structure
    the recipe's model takes once fused with `config.fuse` (fusion depends on the structure alone, never on the
    weights). A stored module would be a pickle whose loading can run any code its writer put there."""
    return modeling.restore_model(config.model, path, structure=lambda model: fuse(model, config.fuse)[0],
                                  field=None)


def run(inputs, config, output):
    fused, _ = fuse(modeling.restore_model(config.model, inputs["checkpoint"]), config.fuse)
    modeling.save(fused.state_dict(), output)

"""fuse: fold and fuse module sequences in eager mode (the performance recipe, step 1).

Batch norm that follows a convolution is folded here whatever the `fuse` setting: optimize_for_mobile's own
Conv-BN folding silently drops the bias of traced Conv(bias=False)-BN modules (pytorch/pytorch#76807), so no
batch norm after a convolution may reach it. That includes timm's fused norm-activation layers (BatchNormAct2d: a
BatchNorm2d subclass that also applies its dropout and activation, which fuse_modules does not take): the batch norm
is folded into the convolution before it, and the layer replaced by its dropout and activation.
"""

import copy
import sys
import weakref

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from mobilebuild.errors import MobileBuildError, few
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


class _LeavesTracer(torch.fx.Tracer):
    """FX's tracer, which also keeps the modules of the types `leaves` whole (as it keeps torch.nn's)."""

    def __init__(self, leaves):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, module, qualified_name):
        return isinstance(module, self.leaves) or super().is_leaf_module(module, qualified_name)


def _call_sequences(model, leaves=()):
    """Chains of module calls where each output feeds only the next module, from an FX trace of forward (modules
    of the types `leaves` traced as calls, not through, as torch.nn's are); for models FX cannot trace,
    consecutive children of nn.Sequential containers."""
    try:
        # the graph alone: a GraphModule built around it could not hold a child named `meta` (capture_root)
        graph = _LeavesTracer(leaves).trace(model)
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


def _norm_act_types():
    """timm's fused norm-activation classes whose batch norm can be folded, where timm is loaded (a model holding
    them imported it): BatchNormAct2d computes batch norm, then its `drop`, then its `act`."""
    norm_act = sys.modules.get("timm.layers.norm_act")
    return (norm_act.BatchNormAct2d,) if norm_act is not None else ()


def _is_norm_act(module, types):
    """A norm-activation layer as timm's forward computes it (a subclass with a forward of its own may not), in eval
    mode with running statistics: what folding assumes."""
    return (isinstance(module, types) and any(type(module).forward is kind.forward for kind in types)
            and not module.training and module.running_mean is not None and module.running_var is not None)


def _set_module(model, name, module):
    parent, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attribute, module)


def fold_norm_act(model, qat=False):
    """Fold the batch norm of timm's norm-activation layers into the convolution (nn.Conv2d) whose output feeds
    only it, in place; each such layer is replaced by its activation (preceded by its dropout unless that is an
    identity, as its forward applies them), which `find_groups` may then fuse with the convolution (Conv-ReLU).
    Return the [convolution, layer] pairs folded. For quantization-aware training nothing is folded: batch norm
    stays until the trained model is converted."""
    types = _norm_act_types()
    if qat or not types or not any(isinstance(module, types) for module in model.modules()):
        return []
    modules = dict(model.named_modules())
    folded = []
    for conv, norm, *_ in (chain for chain in _call_sequences(model, leaves=types) if len(chain) > 1):
        if type(modules[conv]) is not nn.Conv2d or not _is_norm_act(modules[norm], types):
            continue  # a subclass of Conv2d may compute with its weight otherwise (timm's StdConv2d standardises it)
        layer = modules[norm]
        _set_module(model, conv, fuse_conv_bn_eval(modules[conv], layer))
        _set_module(model, norm, layer.act if isinstance(layer.drop, nn.Identity) else nn.Sequential(layer.drop,
                                                                                                     layer.act))
        folded.append([conv, norm])
    return folded


def batch_norms(model):
    """The paths of the model's batch-norm layers (timm's BatchNormAct2d among them)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.modules.batchnorm._BatchNorm)]


def still_channels(model):
    """{batch-norm path: its largest gain |weight| / sqrt(running_var + eps)} of the layers that normalise channels
    whose running variance is at most eps: channels that (almost) never varied on the data the statistics came from
    (dead after a ReLU, say). Dividing by about sqrt(eps), they multiply any change of their input, int8 rounding
    included, by hundreds (timm's mobileone_s0 trained briefly: up to 970, in its first stage's branches)."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_var is not None:
            still = module.running_var <= module.eps
            if still.any():
                weight = module.weight.detach()[still].abs() if module.weight is not None else 1
                found[name] = float((weight / (module.running_var[still] + module.eps).sqrt()).max())
    return found


def folded_into(model):
    """{batch-norm path: the convolution `fuse(model, "auto")` folds it into}, found on a copy. After folding the
    batch norm's own path holds an identity or its activation: what `quantize.exclude` keeps float is the
    convolution."""
    modules = dict(model.named_modules())
    merged = merged_into(fuse(copy.deepcopy(model), "auto")[0])
    return {name: into for name, into in merged.items()
            if isinstance(modules.get(name), nn.modules.batchnorm._BatchNorm)}


def folding_line(unfused, fused):
    """What fusion did with the batch norm of a model: how many layers were folded into the convolution before them,
    how many of them in timm's norm-activation layers, and which stayed (not after a convolution); None for a model
    without batch norm. `unfused`: the model's batch-norm paths before fusion (batch_norms), and of the norm-activation
    layers among them."""
    (before, norm_act), left = unfused, batch_norms(fused)
    if not before:
        return None
    line = f"batch norm folded into the convolution before it: {len(before) - len(left)} of {len(before)}"
    if norm_act:
        kept = len(set(norm_act) & set(left))
        line += f" ({len(norm_act) - kept} of {len(norm_act)} in timm's BatchNormAct2d)"
    if left:
        line += f"; kept, not after a convolution: {few(left)}"
    return line


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


# {a model fuse() returned: {path of a module it folded or fused into another: that other's path}}. Once folded, a
# batch norm's own path holds an identity (or its activation): quantize.exclude naming it means the convolution.
_MERGED = weakref.WeakKeyDictionary()


def merged_into(model):
    """{path of a module that fuse() folded or fused into another: the other's path}, for a model fuse() returned
    (fuse.load's too); empty for any other model."""
    return _MERGED.get(model, {})


def fuse(model, setting, qat=False):
    """Fuse `model` in place; return it and the groups that were fused (beyond the model's own fuse_model()), the
    [convolution, norm-activation layer] pairs folded by fold_norm_act last.

    For quantization-aware training (`qat`) batch norm is kept inside the fused modules, to be folded when the
    trained model is converted; otherwise it is folded now."""
    model.train(qat)
    folded = None
    if setting == "auto" and not _own_fusion(model, qat):
        folded = fold_norm_act(model, qat)  # first: the activations they leave may fuse with their convolutions
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
    if folded is None:  # after the model's own or the recipe's fusion, which may name the layers as they were
        folded = fold_norm_act(model, qat)
    _MERGED[model] = {name: group[0] for group in groups + folded for name in group[1:]}
    return model, groups + folded


def load(path, config):
    """The fused model stored at `path`, for the stages after fuse: its weights, read weights-only, in the structure
    the recipe's model takes once fused with `config.fuse` (fusion depends on the structure alone, never on the
    weights). A stored module would be a pickle whose loading can run any code its writer put there."""
    return modeling.restore_model(config.model, path, structure=lambda model: fuse(model, config.fuse)[0],
                                  field=None)


def run(inputs, config, output):
    model = modeling.restore_model(config.model, inputs["checkpoint"])
    norms = batch_norms(model)
    unfused = norms, [name for name in norms if isinstance(model.get_submodule(name), _norm_act_types())]
    fused, _ = fuse(model, config.fuse)
    line = folding_line(unfused, fused)
    if line:
        print(f"   {line}")
    modeling.save(fused.state_dict(), output)

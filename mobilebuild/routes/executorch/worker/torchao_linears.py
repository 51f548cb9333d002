"""ExecuTorch's own torchao transform of a language model's linear layers (extension.llm.export.quantize: 8da4w,
8da8w), as its LLM export runs it, with quantize.exclude's layers kept float: what lm_lower, export_llm and the
per-layer ranking (lm_layers.py) share."""

import torch

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import hub, quiet
from mobilebuild.worker.stages import exclusion, modeling


def quantize_linears(model, precision, group_size, keep_float=()):
    """ExecuTorch's own torchao source transform for LLM export (extension.llm.export.quantize): 8da4w (int8
    dynamic activations, int4 weights in groups of `group_size`) or 8da8w (int8 weights per channel), the linear
    layers at `keep_float` (paths, kept_float's) left in float: quantize_model_'s own config and filter, the
    filter told to pass them over (quantize_model_ takes no filter of its own)."""
    if precision not in ("8da4w", "8da8w"):
        return model
    with quiet.native_stderr(dropped=b"I tokenizers:"):  # its tokenizers' registration note
        from executorch.extension.llm.export.quantize import _make_linear_config, _make_linear_filter
    from torchao.quantization.quant_api import quantize_

    group = group_size if precision == "8da4w" else 0
    linear = _make_linear_filter(precision, group)
    try:
        with hub.quiet_transformers():
            quantize_(model, _make_linear_config(precision, group),
                      filter_fn=lambda module, path: path not in keep_float and linear(module, path))
    except RuntimeError as exc:  # a linear layer whose input size the group does not divide
        raise MobileBuildError(f"{precision} cannot quantize this model: {modeling.first_line(exc)}",
                               field="generate.group_size") from None
    return model


def linear_layers(model):
    return [path for path, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def kept_float(model, entries, precision):
    """The paths of the linear layers quantize.exclude's entries (module paths or class names of the transformers
    model, as exclusion.resolve reads them) keep float: those entries name or hold. An entry that holds none is one
    line: torchao's transform quantizes linear layers only."""
    if not entries:
        return ()
    found = []
    for path in exclusion.resolve(model, entries):
        held = [name for name in linear_layers(model) if name == path or name.startswith(path + ".")]
        if not held:
            raise MobileBuildError(f"{path} holds no linear layer, and {precision} quantizes linear layers only "
                                   f"(this model's: {few(linear_layers(model))})", field="quantize.exclude")
        found += held
    return tuple(dict.fromkeys(found))

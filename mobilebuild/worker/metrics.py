"""Scale-aware comparisons of an artifact's outputs with the eager reference, and the thresholds they must meet.

Tensors in, plain floats out. Nothing here depends on a tensor's absolute scale except `max_rel_error`, which
divides by the reference's range: a collapsed model (outputs ~1e-9) passes any absolute tolerance, but not these.
"""

import math

# Identical outputs have infinite SQNR; results are JSON, so they report this instead (float64 resolves ~320 dB).
SQNR_CEILING_DB = 300.0

# A metric either must reach a threshold (at least) or must stay under it (at most).
AT_LEAST = ("sqnr_db", "cosine", "top1_agreement", "agreement")  # agreement, perplexity_ratio: language models
AT_MOST = ("max_rel_error", "accuracy_drop", "perplexity_ratio")


def _flat(tensor):
    return tensor.detach().double().flatten()


def sqnr_db(reference, output):
    """10 log10(mean(ref^2) / mean((ref - out)^2)); inf when identical."""
    reference = _flat(reference)
    error = (reference - _flat(output)).pow(2).mean().item()
    signal = reference.pow(2).mean().item()
    if error == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / error)


def cosine(reference, output):
    reference, output = _flat(reference), _flat(output)
    norms = reference.norm().item() * output.norm().item()
    if norms == 0.0:
        return 1.0 if reference.norm().item() == output.norm().item() else 0.0
    return (reference @ output).item() / norms


def max_rel_error(reference, output):
    """The largest absolute error, relative to the range of the reference's values (to its magnitude when it is
    constant, and absolute when it is all zeros)."""
    reference, output = _flat(reference), _flat(output)
    scale = (reference.max() - reference.min()).item() or reference.abs().max().item() or 1.0
    return (reference - output).abs().max().item() / scale


# A reference this small (RMS), or varying this little between inputs (the RMS of its deviation from the mean over
# the inputs, relative to its RMS), says nothing about the artifact: int8 rounding is larger than the signal. Random
# weights give both: torchvision's MobileNetV3 with default batch-norm statistics answers about 1e-10 to anything,
# timm's lcnet_050 about 1e-7 (trained models are far above: resnet18 with random weights varies by 7%).
NEAR_ZERO_RMS = 1e-4
HARDLY_VARIES = 1e-2
DEGENERATE_ADVICE = "random weights? give a trained checkpoint, `batchnorm_stats`, or `model.train`"


def degenerate(reference):
    """Why an eager reference (samples along axis 0) cannot judge an artifact, or None: its values are near zero,
    or hardly depend on the input."""
    values = _flat(reference)
    rms = values.pow(2).mean().sqrt().item()
    if rms < NEAR_ZERO_RMS:
        return f"is near zero (RMS {rms:.2g})"
    if reference.dim() == 0 or len(reference) < 2:
        return None
    samples = reference.detach().double().flatten(1)
    spread = (samples - samples.mean(0)).pow(2).mean().sqrt().item() / rms
    if spread < HARDLY_VARIES:
        return f"hardly depends on the input (it varies by {spread:.2%} of its size between inputs)"
    return None


def is_classifier_output(tensor):
    return tensor.dim() == 2 and tensor.shape[1] > 1


def top1_agreement(reference, output):
    """How often the artifact picks the reference's class; None when the outputs are not class scores."""
    if not is_classifier_output(reference):
        return None
    return (reference.argmax(dim=1) == output.argmax(dim=1)).double().mean().item()


def accuracy(scores, labels):
    return (scores.argmax(dim=1) == labels).double().mean().item()


def compare(reference, output, labels=None):
    """Every metric of `output` against `reference`; accuracies when labels are given."""
    found = {
        "sqnr_db": min(sqnr_db(reference, output), SQNR_CEILING_DB),
        "cosine": cosine(reference, output),
        "max_rel_error": max_rel_error(reference, output),
        "top1_agreement": top1_agreement(reference, output),
        "accuracy_reference": None,
        "accuracy_artifact": None,
        "accuracy_drop": None,
    }
    if labels is not None and is_classifier_output(reference):
        found["accuracy_reference"] = accuracy(reference, labels)
        found["accuracy_artifact"] = accuracy(output, labels)
        found["accuracy_drop"] = found["accuracy_reference"] - found["accuracy_artifact"]
    return found


def json_safe(found):
    """Results are JSON files other tools read: a NaN or infinite metric (NaN outputs) is recorded as null; the
    verdict was reached before, from the real value."""
    return {k: v if v is None or math.isfinite(v) else None for k, v in found.items()}


def relaxed(thresholds, defaults):
    """{metric: {"used", "default"}} for each threshold looser than its default: a verdict against it is weaker than
    the word "passed" suggests, and the report says so."""
    looser = {}
    for name, used in sorted(thresholds.items()):
        default = (defaults or {}).get(name)
        if default is not None and ((name in AT_LEAST and used < default) or (name in AT_MOST and used > default)):
            looser[name] = {"used": used, "default": default}
    return looser


def failures(found, thresholds):
    """One readable line per threshold missed; metrics that do not apply (None) are not judged."""
    missed = []
    for name, limit in sorted(thresholds.items()):
        value = found.get(name)
        if value is None:
            continue  # does not apply (top-1 of a regression output, accuracy without labels)
        if name in AT_LEAST and not value >= limit:
            missed.append(f"{name} {value:.4g} < {limit:g}")
        elif name in AT_MOST and not value <= limit:
            missed.append(f"{name} {value:.4g} > {limit:g}")
    return missed

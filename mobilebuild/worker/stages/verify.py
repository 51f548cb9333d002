"""verify: run the artifact in its runtime and compare it with the fp32 eager model on the same inputs."""

import json
import math

import torch

from mobilebuild import store
from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import metrics, outputs, quiet, runtimes
from mobilebuild.worker.stages import calibration, fuse, modeling, prune

# Random verification inputs come from a stream of their own: generator seeds from 2**31 up, where the recipe's seeds
# (calibration's random batches) stay below 2**30 (the schema's limit); torch's CPU generator keeps 32 bits of a
# seed, so both stay below 2**32. They used to be the calibration batches themselves: an int8 artifact was judged on
# the data it had been calibrated on.
VERIFY_STREAM = 1 << 31
HOLDOUT = "calibration-holdout"


def evaluation_data(config):
    """([(size, inputs, labels or None)], description): the recipe's evaluation data, the part of the calibration
    source calibration did not use, or seeded random inputs that are never calibration's; `inputs` a tuple of
    tensors in forward's order, samples along axis 0. Random inputs come at each size the artifact is checked at:
    a model with dynamic dims at their smallest, the example's and their largest."""
    sizes = ("example",) if config.fixed_shape else modeling.sizes(config.inputs)
    extremes = [size for size in sizes if size != "example"]
    if config.evaluation == HOLDOUT:
        held_out = calibration.holdout(config.calibration, config.inputs, config.samples)
        if held_out is not None:
            return [("example", held_out, None), *_random(config, extremes)], "held-out calibration"
    if config.evaluation in (None, HOLDOUT):
        return _random(config, sizes), "random"
    spec, field = config.evaluation["function"], "verify.evaluation.function"
    data = modeling.call_user(modeling.resolve_callable(spec, field), spec, field,
                              **config.evaluation.get("kwargs", {}))
    inputs, labels = _with_labels(data, len(config.inputs))
    inputs = modeling.as_inputs(inputs, config.inputs, field, any_batch=True)
    if labels is not None and (not isinstance(labels, torch.Tensor) or list(labels.shape) != [len(inputs[0])]):
        got = f"a Tensor of shape {list(labels.shape)}" if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise MobileBuildError(f"expected one label per input ({len(inputs[0])}), got {got}", field=field)
    return [("example", inputs, labels), *_random(config, extremes)], "evaluation"


def _random(config, sizes):
    """Seeded random inputs at each of `sizes`, never calibration's. The recipe's own data comes at the sizes it
    has; random inputs at the dynamic dims' smallest and largest go with it ("min" and "max" of SIZES)."""
    groups = []
    for size in sizes:
        batches = [modeling.example_inputs(config.inputs, seed=VERIFY_STREAM + config.seed + i, size=size)
                   for i in range(config.samples)]
        groups.append((size, tuple(torch.cat(parts) for parts in zip(*batches)), None))
    return groups


def _with_labels(data, count):
    """(inputs, labels or None) of what an evaluation function returned: inputs (a tensor, a tuple in forward's
    order, or a dict by input name), or a pair (inputs, labels). For a one-input model a pair of tensors is inputs
    and labels; for several inputs, a pair is (inputs, labels) when its first item is a tuple, list or dict."""
    if isinstance(data, (tuple, list)) and len(data) == 2:
        first = data[0]
        if (count == 1 and isinstance(first, torch.Tensor)) or isinstance(first, (tuple, list, dict)):
            return data[0], data[1]
    return data, None


def run_in_batches(model, inputs, batch, names=None):
    """[(output name, its values over every usable input)], and how many inputs were usable: the artifact was built
    for the example's batch size (a traced graph may have it baked in). `names`: the recipe's output names."""
    usable = len(inputs[0]) - len(inputs[0]) % batch
    with torch.no_grad():
        chunks = [outputs.leaves(model(*chunk)) for chunk in zip(*(x[:usable].split(batch) for x in inputs))]
    return [(name, torch.cat([chunk[index][1] for chunk in chunks]))
            for index, name in enumerate(output_names(names, [name for name, _ in chunks[0]]))], usable


def output_names(names, found):
    """The names of a model's output tensors, whose paths are `found` (outputs.leaves): the recipe's `names`, one
    per tensor, or the paths when it names none."""
    if names is not None and len(names) != len(found):
        raise MobileBuildError(f"{len(names)} output names for {len(found)} output tensor(s) ({', '.join(found)})",
                               field="outputs")
    return names or found


def verify(artifact, references, config, inputs, labels):
    """For each eager model of `references`, {output name: its metrics} for every one of its outputs, compared
    position by position with the artifact's (which runs once); labels judge the first output that holds class
    scores. Also returns how many inputs were usable, and {output name: why the first reference's output cannot
    judge the artifact} (metrics.degenerate) for the outputs that cannot."""
    batch = config.inputs[0]["shape"][0]
    try:
        produced, usable = run_in_batches(artifact, inputs, batch, config.outputs)
    except (RuntimeError, NotImplementedError) as exc:
        raise MobileBuildError(f"the artifact fails on the host: {modeling.first_line(exc)}",
                               field="targets") from None
    compared, degenerate = [], None
    for reference in references:
        expected, _ = run_in_batches(reference, inputs, batch, config.outputs)
        if len(produced) != len(expected):
            raise MobileBuildError(f"the artifact returns {len(produced)} tensor(s), the eager model "
                                   f"{len(expected)} ({', '.join(name for name, _ in expected)})", field="targets")
        scores = next((name for name, values in expected if metrics.is_classifier_output(values)), None)
        compared.append({name: metrics.compare(values, output,
                                               labels[:usable] if labels is not None and name == scores else None)
                         for (name, values), (_, output) in zip(expected, produced)})
        if degenerate is None:
            degenerate = {name: why for name, values in expected if (why := metrics.degenerate(values)) is not None}
    return compared, usable, degenerate


def _sqnr(found, name):
    value = found[name]["sqnr_db"]
    return -math.inf if math.isnan(value) else value  # NaN outputs are the worst there is


def worst_output(found):
    """The output furthest from the eager model (lowest SQNR) of {output: metrics}: the one the summary and the
    report show."""
    return min(found, key=lambda name: _sqnr(found, name))


def _lowest_sqnr(found):
    return _sqnr(found, worst_output(found))


def _where(name, size, found, at_sizes):
    """What a failure line starts with: the output, when there are several; the size, for dynamic dims."""
    parts = ([f"at the {size} sizes"] if len(at_sizes) > 1 else []) + ([name] if len(found) > 1 else [])
    return f"{', '.join(parts)}: " if parts else ""


def run(inputs, config, output):
    with quiet.native_stderr(once=True):  # a runtime's C++ warnings come at every call: each is shown once
        _verify(inputs, config, output)


def _verify(inputs, config, output):
    result = {"artifact_sha256": store.sha256_file(inputs["artifact"]),
              "status": "not run on host", "reason": config.host_reason, "precision": config.precision,
              "data": None, "samples": 0, "metrics": None, "thresholds": config.thresholds, "failures": [],
              "relaxed": metrics.relaxed(config.thresholds, config.default_thresholds)}
    facts = runtimes.inspect(inputs["artifact"], config)
    if facts is not None:
        result["artifact"] = facts
    reference = modeling.restore_model(config.model, inputs["checkpoint"])
    with torch.no_grad():
        result["output_spec"] = outputs.describe(reference(*modeling.example_inputs(config.inputs)), config.outputs)
    if config.fixed_shape:
        result["fixed_shape"] = config.fixed_shape
        print(f"   note: {config.fixed_shape}")
    if config.runs_on_host:
        groups, description = evaluation_data(config)
        note = data_mismatch(config, description)
        if note:
            result["data_note"] = note
            print(f"   note: {note}")
        artifact = runtimes.load(inputs["artifact"], config)
        references = [reference]
        if "unpruned" in inputs:
            references.append(modeling.restore_model(config.model, inputs["unpruned"]))
        # size -> ({output: metrics}, [the same against the unpruned model], samples, {input: shape of one run})
        at_sizes, degenerate = {}, {}
        for size, data, labels in groups:
            (found, *unpruned), samples, degenerate_here = verify(artifact, references, config, data, labels)
            shapes = {spec["name"]: [spec["shape"][0], *x.shape[1:]] for spec, x in zip(config.inputs, data)}
            at_sizes[size] = (found, unpruned, samples, shapes)
            degenerate = {**degenerate_here, **degenerate}  # the first size's words (the example's) win
        missed = [f"{_where(name, size, found, at_sizes)}{line}" for size, (found, *_) in at_sizes.items()
                  for name, values in found.items() for line in metrics.failures(values, config.thresholds)]
        if degenerate:
            result["reference_note"] = reference_note(degenerate, several=len(at_sizes[groups[0][0]][0]) > 1)
            if missed:  # the thresholds judged noise: the failure says so, wherever it is shown
                missed.append(result["reference_note"])
        said = int8_notes(reference, config.calibrated) if missed and config.precision == "int8" else None
        if said:  # what in the model costs int8 its accuracy: the failure says, and what to do
            result["model_note"] = said
            missed.append(said)
        worst_size = min(at_sizes, key=lambda size: _lowest_sqnr(at_sizes[size][0]))
        found, unpruned, *_ = at_sizes[worst_size]
        worst = worst_output(found)
        # accuracy comes from the labelled data (the first group), whichever size was worst
        labelled = {key: value for key, value in at_sizes[groups[0][0]][0][worst].items()
                    if key.startswith("accuracy")}
        result.update(status="failed" if missed else "passed", data=description,
                      samples=sum(samples for _, _, samples, _ in at_sizes.values()),
                      metrics=metrics.json_safe({**found[worst], **labelled}), failures=missed)
        if len(at_sizes) > 1:  # dynamic dims: each size's worst SQNR, and the shapes it ran at
            result["sizes"] = {size: {"shapes": shapes, "samples": samples,
                                      **metrics.json_safe({"sqnr_db": _lowest_sqnr(found_there)})}
                               for size, (found_there, _, samples, shapes) in at_sizes.items()}
            result["worst_size"] = worst_size
        if len(found) > 1:  # a lone output keeps the result as it was: its metrics are the result's
            result.update(worst_output=worst,
                          outputs={name: metrics.json_safe(values) for name, values in found.items()})
        if unpruned:  # what pruning cost: the artifact against the model before pruning, not judged
            against = metrics.json_safe(unpruned[0][worst])
            result["against_unpruned"] = {**against, "summary": unpruned_summary(against)}
    if config.pruning:
        state = modeling.load_state_dict_file(inputs["checkpoint"], field="prune")
        result["sparsity"] = prune.sparsity(state, config.pruning.get("modules"))
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True, allow_nan=False)
    _say(result)


def reference_note(degenerate, several):
    """One sentence on eager outputs that cannot judge an artifact ({output name: why}, metrics.degenerate)."""
    said = "; ".join(f"the eager output{f' {name}' if several else ''} {why}" for name, why in degenerate.items())
    return f"{said}: {metrics.DEGENERATE_ADVICE}"


# transformers' ViT (2 layers x 64, trained briefly on digits), ONNX Runtime int8: 14.6 dB static, 14.3 dB static with
# its layer norms float (quantize.exclude: [LayerNorm]), 40.5 dB dynamic; qnnpack dynamic 42.7 dB
STATIC_TRANSFORMER = ("static int8 fixes the ranges of every activation of a Transformer (layer norm, attention) from "
                      "calibration: `quantize.mode: dynamic` quantizes the Linear weights and measures each input as "
                      "it runs, as ONNX Runtime advises for Transformers")


def int8_notes(reference, calibrated):
    """Why an int8 artifact of the eager model `reference` missed its thresholds, where the model says: batch norm
    that amplifies rounding, a Transformer quantized statically (`calibrated`). None when it says nothing."""
    still = fuse.still_channels(reference)
    notes = [still_channels_note(still, fuse.folded_into(reference))] if still else []
    if calibrated and any(isinstance(module, torch.nn.LayerNorm) for module in reference.modules()):
        notes.append(STATIC_TRANSFORMER)
    return "; ".join(notes) or None


def still_channels_note(still, folded=None):
    """One sentence on batch norm that amplifies int8 rounding ({path: gain}, fuse.still_channels); `folded`: {path:
    the convolution it is folded into} (fuse.folded_into): the module that computes it once fused, named so the user
    sees what `quantize.exclude` keeps float (exclusion.resolve maps a folded batch norm's own path to it too)."""
    folded = folded or {}
    ranked = sorted(still, key=still.get, reverse=True)
    computing = list(dict.fromkeys(folded.get(path, path) for path in ranked))
    return (f"batch norm in {few(ranked)} normalises channels that hardly varied on the data its statistics came "
            f"from (running variance at most eps: gains up to {max(still.values()):.0f}), which multiply int8 "
            "rounding: re-estimate the statistics on data where they vary (`model.batchnorm_stats`), train longer, "
            f"or keep float the modules that compute them (`quantize.exclude`: {few(computing)}"
            + ("; fused, batch norm is computed by the convolution it is folded into" if computing != ranked else "")
            + ")")


def data_mismatch(config, description):
    """One line when an artifact calibrated on the user's data is verified on random inputs: they say little about
    the inputs the model will see (a CNN calibrated on images in [0, 1] failed at 0.6 dB on normal random data, and
    passed at 37 dB on its own)."""
    source = (config.calibration or {}).get("source")
    if not config.calibrated or description != "random" or source in (None, "random"):
        return None
    return (f"verified on random inputs, but calibrated on the recipe's {source} data: set verify.evaluation to "
            f"{HOLDOUT} (or a function) to verify on data like the model's")


def _say(result):
    found = result["metrics"]
    if found is None:
        print(f"   {result['status']}: {result['reason']}")
        return
    parts = [f"{name} {_short(found[key])}{unit}" for name, key, unit in
             (("SQNR", "sqnr_db", " dB"), ("cosine", "cosine", ""), ("max rel. error", "max_rel_error", ""))]
    if found["top1_agreement"] is not None:
        parts.append(f"top-1 agreement {found['top1_agreement']:.3f}")
    if found["accuracy_reference"] is not None:
        parts.append(f"accuracy {found['accuracy_reference']:.3f} -> {found['accuracy_artifact']:.3f}")
    several = f" ({len(result['outputs'])} outputs, worst: {result['worst_output']})" if "outputs" in result else ""
    if "sizes" in result:
        several += " at the " + ", ".join(f"{size} ({_short(found['sqnr_db'])} dB)"
                                          for size, found in result["sizes"].items()) + " sizes"
    relaxed = f" (relaxed thresholds: {', '.join(result['relaxed'])})" if result["relaxed"] else ""
    print(f"   {result['status']}{relaxed} on {result['samples']} {result['data']} inputs{several}: "
          f"{', '.join(parts)}")
    for note in ("reference_note", "model_note"):
        if note in result:
            print(f"   note: {result[note]}")
    if "against_unpruned" in result:
        print(f"   against the unpruned model: {result['against_unpruned']['summary']}")


def unpruned_summary(found):
    """What pruning cost, in a few words: accuracy (with its loss in points), agreement and SQNR against the model
    before pruning."""
    parts = []
    if found.get("accuracy_reference") is not None:
        loss = (found["accuracy_reference"] - found["accuracy_artifact"]) * 100
        parts.append(f"accuracy {found['accuracy_reference']:.3f} -> {found['accuracy_artifact']:.3f} "
                     f"({-loss:+.1f} points)")
    if found.get("top1_agreement") is not None:
        parts.append(f"top-1 agreement {found['top1_agreement']:.3f}")
    parts.append(f"SQNR {_short(found.get('sqnr_db'))} dB")
    return ", ".join(parts)


def _short(value):
    return "n/a" if value is None else f"{value:.5g}"

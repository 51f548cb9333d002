"""The recipe's calibration batches (quantize.calibration): random, from an image folder, or from the user's
function. A helper of the stages that quantize (quantize, lower, onnx, litert), not a stage: it has no `run`."""

import itertools
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import quiet
from mobilebuild.worker.stages import modeling

CYCLE = ("example", "min", "max")  # the first batch, which ExecuTorch exports, at the example sizes


def batches(calibration, specs):
    """The batches `calibration` (the recipe's quantize.calibration) describes, for the inputs `specs`: each a tuple
    of tensors in forward's order, of the inputs' dtypes and shapes (dynamic dims within their ranges)."""
    source = calibration["source"]
    if source == "random":  # dynamic dims at their example, smallest and largest sizes in turn: ranges span them all
        return (modeling.example_inputs(specs, seed=calibration["seed"] + i, size=CYCLE[i % len(CYCLE)])
                for i in range(calibration["batches"]))
    if source == "images":
        return ((batch,) for batch in _image_batches(calibration, specs))
    at = field(calibration)
    return (modeling.as_inputs(batch, specs, at, any_batch=True)
            for batch in _function_batches(calibration, 0, calibration["batches"]))


def _function_batches(calibration, start, stop):
    """Batches `start` to `stop` (None: all that follow) of those the user's function yields."""
    spec, at = calibration["function"], "quantize.calibration.function"
    produced = modeling.call_user(modeling.resolve_callable(spec, at), spec, at, **calibration["kwargs"])
    try:
        stream = iter(produced)
    except TypeError:
        raise MobileBuildError(f"{spec} returned {type(produced).__name__}, expected an iterable of input batches",
                               field=at) from None
    return _user_batches(itertools.islice(stream, start, stop), spec, at)


def _user_batches(stream, spec, at):
    """The user's generator runs as calibration consumes it: what it raises then is theirs, not a bug here."""
    while True:
        try:
            batch = next(stream)
        except StopIteration:
            return
        except MobileBuildError:
            raise
        except Exception as exc:
            raise MobileBuildError(f"{spec} raised {type(exc).__name__}: {modeling.first_line(exc)}",
                                   field=at) from None
        yield batch


def _image_batches(calibration, specs):
    files = _image_files(calibration, specs)
    images = [_read_image(file, calibration, specs[0]) for file in files]  # all: each must be an image
    stream = itertools.cycle(images)
    for _ in range(calibration["batches"]):
        yield torch.stack([next(stream) for _ in range(specs[0]["shape"][0])])


def _image_files(calibration, specs):
    shape, dtype = specs[0]["shape"], specs[0]["dtype"]
    if len(specs) > 1 or len(shape) != 4 or shape[1] not in (1, 3) or not modeling.DTYPES[dtype].is_floating_point:
        raise MobileBuildError(f"image calibration needs one float input of shape [N, 1 or 3, H, W], got "
                               f"{modeling.describe_inputs(specs)}: give the others through a calibration function",
                               field="quantize.calibration.source")
    files = sorted(p for p in Path(calibration["path"]).rglob("*") if p.is_file())
    if not files:
        raise MobileBuildError(f"{calibration['path']} holds no images", field="quantize.calibration.path")
    return files


def _read_image(file, calibration, spec):
    """One image as the model's input expects it: resized, scaled to [0, 1], then normalised by the recipe's mean
    and std."""
    from PIL import Image, UnidentifiedImageError

    _, channels, height, width = spec["shape"]
    try:
        with Image.open(file) as image:
            image = image.convert("L" if channels == 1 else "RGB").resize((width, height))
            data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    except (UnidentifiedImageError, OSError) as exc:
        raise MobileBuildError(f"{file} is not a readable image: {modeling.first_line(exc)}",
                               field="quantize.calibration.path") from None
    mean = torch.tensor(calibration.get("mean", [0.0] * channels)).view(-1, 1, 1)
    std = torch.tensor(calibration.get("std", [1.0] * channels)).view(-1, 1, 1)
    return (data.view(height, width, channels).permute(2, 0, 1).float() / 255.0 - mean) / std


def holdout(calibration, specs, samples):
    """Up to `samples` inputs from the calibration source that calibration never sees (verify.evaluation:
    calibration-holdout), stacked per input (a tuple): the images after those calibration reads, or the batches the
    user's function yields after calibration's. None for random batches: verification draws from a stream of its own
    anyway."""
    where = "verify.evaluation"
    if calibration is None:
        raise MobileBuildError("calibration-holdout verifies on the calibration source, and this recipe has none: "
                               "set quantize.calibration", field=where)
    if calibration["source"] == "random":
        return None
    if calibration["source"] == "images":
        files = _image_files(calibration, specs)
        used = min(len(files), calibration["batches"] * specs[0]["shape"][0])
        if used == len(files):
            raise MobileBuildError(f"calibration reads all {len(files)} images of {calibration['path']} "
                                   f"({calibration['batches']} batches of {specs[0]['shape'][0]}); "
                                   "calibration-holdout needs images it does not read: add images, or lower "
                                   "quantize.calibration.batches", field=where)
        return (torch.stack([_read_image(file, calibration, specs[0]) for file in files[used:used + samples]]),)
    spec, at = calibration["function"], field(calibration)
    kept, rows = [], 0
    for batch in _function_batches(calibration, calibration["batches"], None):
        kept.append(modeling.as_inputs(batch, specs, at, any_batch=True))
        rows += len(kept[-1][0])
        if rows >= samples:
            break
    if not kept:
        raise MobileBuildError(f"{spec} yields nothing after calibration's {calibration['batches']} batches: "
                               "calibration-holdout needs more, or lower quantize.calibration.batches", field=where)
    return tuple(torch.cat(parts)[:samples] for parts in zip(*kept))


def at_example_sizes(settings, specs, needs):
    """The recipe's calibration batches (`settings`: its quantize.calibration) as tuples of contiguous tensors in
    forward's order, those at the inputs' example sizes only: a graph captured at those sizes takes no others.
    `needs`: who needs them, for the error where no batch has those sizes."""
    where = field(settings)
    samples = [tuple(x.contiguous() for x in modeling.as_inputs(batch, specs, where))
               for batch in batches(settings, specs)]
    if not samples:
        raise MobileBuildError("calibration produced no batches", field=where)
    example = [modeling.shape_at(spec) for spec in specs]
    at_example = [sample for sample in samples if [list(x.shape) for x in sample] == example]
    if not at_example:
        raise MobileBuildError(f"no calibration batch has the example sizes ({modeling.describe_inputs(specs)} at "
                               f"{example}), which {needs}", field=where)
    return at_example


def field(calibration):
    """The recipe setting a bad batch is the fault of: the user's function when the batches come from one."""
    return "quantize.calibration.function" if calibration.get("source") == "function" else "quantize.calibration"


def calibrate(model, batches, field):
    """Run the batches (tuples of input tensors) through a model with observers; `field` is the recipe setting they
    come from."""
    seen = 0
    with torch.no_grad():
        for batch in batches:
            try:
                with quiet.fx_reports_dropped():  # not the batches' own code: a calibration function may print
                    model(*batch)
            except Exception as exc:  # batches of the wrong shape or type, from the user's calibration function
                raise MobileBuildError(f"the model rejects a calibration batch {modeling.shape_of(batch)}: "
                                       f"{modeling.first_line(exc)}", field=field) from None
            seen += 1
    if not seen:
        raise MobileBuildError("calibration produced no batches", field=field)

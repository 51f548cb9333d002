"""The recipe's calibration batches (quantize.calibration): random, from an image folder, or from the user's
function. A helper of the stages that quantize (quantize, lower, export), not a stage: it has no `run`."""

import itertools
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import modeling


def batches(calibration, input_config):
    """The batches `calibration` (the recipe's quantize.calibration) describes, for `input_config`'s input."""
    source = calibration["source"]
    if source == "random":
        return (modeling.example_input(input_config, seed=calibration["seed"] + i)
                for i in range(calibration["batches"]))
    if source == "images":
        return _image_batches(calibration, input_config)
    spec, at = calibration["function"], "quantize.calibration.function"
    produced = modeling.call_user(modeling.resolve_callable(spec, at), spec, at, **calibration["kwargs"])
    try:
        stream = iter(produced)
    except TypeError:
        raise MobileBuildError(f"{spec} returned {type(produced).__name__}, expected an iterable of input batches",
                               field=at) from None
    return _user_batches(itertools.islice(stream, calibration["batches"]), spec, at)


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


def _image_batches(calibration, input_config):
    from PIL import Image, UnidentifiedImageError

    shape = input_config["shape"]
    if len(shape) != 4 or shape[1] not in (1, 3) or not modeling.DTYPES[input_config["dtype"]].is_floating_point:
        raise MobileBuildError(f"image calibration needs a float input of shape [N, 1 or 3, H, W], got "
                               f"{input_config['dtype']} {shape}", field="quantize.calibration.source")
    files = sorted(p for p in Path(calibration["path"]).rglob("*") if p.is_file())
    if not files:
        raise MobileBuildError(f"{calibration['path']} holds no images", field="quantize.calibration.path")
    mode = "L" if shape[1] == 1 else "RGB"
    mean = torch.tensor(calibration.get("mean", [0.0] * shape[1])).view(1, -1, 1, 1)
    std = torch.tensor(calibration.get("std", [1.0] * shape[1])).view(1, -1, 1, 1)
    images = []
    for file in files:
        try:
            with Image.open(file) as image:
                image = image.convert(mode).resize((shape[3], shape[2]))
                data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        except (UnidentifiedImageError, OSError) as exc:
            raise MobileBuildError(f"{file} is not a readable image: {modeling.first_line(exc)}",
                                   field="quantize.calibration.path") from None
        images.append(data.view(shape[2], shape[3], shape[1]).permute(2, 0, 1).float() / 255.0)
    stream = itertools.cycle(images)
    for _ in range(calibration["batches"]):
        batch = torch.stack([next(stream) for _ in range(shape[0])])
        yield (batch - mean) / std


def field(calibration):
    """The recipe setting a bad batch is the fault of: the user's function when the batches come from one."""
    return "quantize.calibration.function" if calibration.get("source") == "function" else "quantize.calibration"


def shape_of(batch):
    """A batch's shape for a message: a tensor's, a list of them for a tuple, the type's name for anything else."""
    if isinstance(batch, (tuple, list)):
        return [shape_of(item) for item in batch]
    return list(batch.shape) if isinstance(batch, torch.Tensor) else type(batch).__name__


def calibrate(model, batches, field):
    """Run the batches through a model with observers; `field` is the recipe setting they come from."""
    seen = 0
    with torch.no_grad():
        for batch in batches:
            try:
                model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
            except Exception as exc:  # batches of the wrong shape or type, from the user's calibration function
                raise MobileBuildError(f"the model rejects a calibration batch of shape {shape_of(batch)}: "
                                       f"{modeling.first_line(exc)}", field=field) from None
            seen += 1
    if not seen:
        raise MobileBuildError("calibration produced no batches", field=field)

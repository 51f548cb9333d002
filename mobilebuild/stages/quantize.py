"""quantize: static post-training quantization in eager mode with the target engine's qconfig (the
performance recipe, step 2), calibrated on random, image-folder or user-supplied batches."""

import itertools
import warnings
from pathlib import Path

import torch
from torch.ao import quantization as tq

from mobilebuild.errors import MobileBuildError
from mobilebuild.stages import modeling


def _image_batches(calibration, input_config):
    from PIL import Image, UnidentifiedImageError

    shape = input_config["shape"]
    if len(shape) != 4 or shape[1] not in (1, 3):
        raise MobileBuildError(f"image calibration needs an input shape [N, 1 or 3, H, W], got {shape}",
                               field="quantize.calibration.source")
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


def calibration_batches(calibration, input_config):
    source = calibration["source"]
    if source == "random":
        return (modeling.example_input(input_config, seed=calibration["seed"] + i)
                for i in range(calibration["batches"]))
    if source == "images":
        return _image_batches(calibration, input_config)
    produce = modeling.resolve_callable(calibration["function"], field="quantize.calibration.function")
    return itertools.islice(produce(**calibration["kwargs"]), calibration["batches"])


def prepared(model, engine, qconfig=None):
    """The model with stubs, the engine's qconfig (or `qconfig`) and observers: ready to calibrate."""
    if engine not in torch.backends.quantized.supported_engines:
        raise MobileBuildError(f"this torch build has no {engine!r} quantized engine "
                               f"(has: {', '.join(torch.backends.quantized.supported_engines)})", field="targets")
    torch.backends.quantized.engine = engine
    if not any(isinstance(m, tq.QuantStub) for m in model.modules()):
        model = tq.QuantWrapper(model)  # float interface, quantized core (the NNAPI post's "core" mode)
    model.eval()
    model.qconfig = qconfig or tq.get_default_qconfig(engine)
    return tq.prepare(model, inplace=True)


def quantize(model, engine, batches):
    model = prepared(model, engine)
    seen = 0
    with torch.no_grad():
        for batch in batches:
            model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
            seen += 1
    if not seen:
        raise MobileBuildError("calibration produced no batches", field="quantize.calibration")
    return tq.convert(model, inplace=True)


def load_quantized(fused_path, state_path, engine):
    """Quantized eager modules do not survive pickling, so the quantize stage stores a state_dict; the module
    structure is rebuilt from the fused model the same way, then the quantized weights are loaded into it."""
    # The observers' values are replaced by the stored ones: the cheapest observer gives the same structure, where
    # the engine's HistogramObserver would spend its parameter search on nothing.
    skeleton = tq.QConfig(activation=tq.MinMaxObserver.with_args(dtype=torch.quint8),
                          weight=tq.get_default_qconfig(engine).weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # converting uncalibrated observers warns
        model = tq.convert(prepared(modeling.load_module(fused_path), engine, skeleton), inplace=True)
    model.load_state_dict(torch.load(state_path, map_location="cpu", weights_only=False))
    return model.eval()


def run(inputs, config, output):
    model = modeling.load_module(inputs["model"])
    quantized = quantize(model, config["engine"], calibration_batches(config["calibration"], config["input"]))
    torch.save(quantized.state_dict(), output)

"""ncnn int8: what ncnn's own tools do, ncnn2table (a scale table calibrated on data) then ncnn2int8 (the model
rewritten with it), done here on ncnn's Python binding, because neither tool ships in a wheel (ncnn's or pnnx's) or
a Debian package.

- Calibration, as ncnn2table: pnnx's fp32 model runs the recipe's calibration batches on ncnn's CPU path, a sample at
  a time, and the input blob of each Convolution, ConvolutionDepthWise and InnerProduct layer goes through torch's
  observer that quantize.observer names, symmetric (ncnn's activation scales are one per tensor, symmetric): the
  layer's scale is 127 over the range the observer keeps. Weight scales are per output channel (per group for a
  depthwise one), 127 over the channel's largest magnitude; 31 for a 3x3 stride-1 convolution, as ncnn2table gives
  them (ncnn's int8 Winograd kernel takes 6-bit weights). quantize.weights per_tensor: one scale for all channels.
- Rewriting, as ncnn2int8: each such layer's weights quantized by ncnn's own quantize_to_int8 and stored under ncnn's
  int8 tag, its scales after its bias, int8_scale_term set (2; 1 for depthwise); a convolution whose output is the
  only input of the next quantized convolution requantizes to it (fuse_requantize: +100, the next one's scale after
  its own), so the two pass int8 between them.
- Each layer's bytes in the .bin are measured by ncnn's loader itself (`spans`): every other layer's weights pass
  through unchanged, whatever their layout.

Layers of quantize.exclude's modules stay float. pnnx names ncnn's layers its own way (conv_34, linear_36): a layer's
module is found by order, the model's convolutions and linear layers as forward calls them against the .param's
weighted layers as pnnx writes them, each pair's weight sizes equal (`layer_modules`)."""

import ctypes
import struct
import time

import ncnn
import numpy
import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.ncnn.worker import guest
from mobilebuild.worker import progress
from mobilebuild.worker.stages import quantize

# The torch modules whose weights pnnx writes as one ncnn layer each, and those layers' weight-size keys
MODULE_TYPES = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
                torch.nn.ConvTranspose3d, torch.nn.Linear)
WEIGHT_SIZE_KEY = {"Convolution": 6, "ConvolutionDepthWise": 6, "Convolution1D": 6, "Convolution3D": 6,
                   "ConvolutionDepthWise1D": 6, "ConvolutionDepthWise3D": 6, "Deconvolution": 6,
                   "DeconvolutionDepthWise": 6, "Deconvolution1D": 6, "Deconvolution3D": 6,
                   "DeconvolutionDepthWise1D": 6, "DeconvolutionDepthWise3D": 6, "InnerProduct": 2}
# The layers ncnn runs in int8 given scales, and the value of int8_scale_term (param key 8) each takes
QUANTIZED = {"Convolution": 2, "ConvolutionDepthWise": 1, "InnerProduct": 2}
REQUANTIZING = ("Convolution", "ConvolutionDepthWise")  # ncnn2int8's fuse_requantize pairs
FP32_TAG, INT8_TAG = 0, 0x000D4B38  # ncnn's .bin tags before a weight array
MAGIC = "7767517"
PROGRESS_EVERY_S = 30
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class Layer:
    """One .param line: type, name, bottoms, tops, its {key: value} params, and its bytes in the .bin."""

    def __init__(self, line):
        fields = line.split()
        self.line, self.type, self.name = line, fields[0], fields[1]
        bottoms, tops = int(fields[2]), int(fields[3])
        self.bottoms, self.tops = fields[4:4 + bottoms], fields[4 + bottoms:4 + bottoms + tops]
        self.params = dict(field.split("=", 1) for field in fields[4 + bottoms + tops:])
        self.data = b""

    def int(self, key, default=0):
        return int(self.params.get(str(key), default))


def is_int8(layer):
    """Whether ncnn runs the layer in int8: one of QUANTIZED given scales (param 8, int8_scale_term; other layer
    types use key 8 for other things, as Gemm its constantN)."""
    return layer.type in QUANTIZED and layer.int(8) != 0


def parse(param_text):
    lines = [line for line in param_text.splitlines() if line.strip()]
    if not lines or lines[0].strip() != MAGIC:
        raise MobileBuildError(f"not an ncnn .param (its first line is not {MAGIC})", field="targets")
    return [Layer(line) for line in lines[2:]]


class CountingReader(ncnn.DataReader):
    """Hands ncnn the .bin's bytes from `at` on, and counts what it takes (ncnn.DataReader's read)."""

    def __init__(self, data, at):
        super().__init__()
        self.data, self.at = data, at

    def scan(self, format, pointer):
        return 0

    def read(self, buffer, size):
        size = min(size, len(self.data) - self.at)
        ctypes.memmove(_capsule_pointer(buffer, None), self.data[self.at:self.at + size], size)
        self.at += size
        return size


def spans(layers, data):
    """Each layer's bytes of the .bin, as ncnn's loader reads them: each layer alone (its bottoms made Input blobs)
    loads from where the one before stopped. Sets Layer.data."""
    at = 0
    for layer in layers:
        inputs = [f"Input {name} 0 1 {name}" for name in dict.fromkeys(layer.bottoms)]
        net = ncnn.Net()
        net.opt.use_vulkan_compute = False
        blobs = len(inputs) + len(layer.tops)
        net.load_param_mem("\n".join([MAGIC, f"{len(inputs) + 1} {blobs}", *inputs, layer.line, ""]))
        reader = CountingReader(data, at)
        if net.load_model(reader) != 0:
            raise MobileBuildError(f"ncnn cannot read the weights of layer {layer.name} ({layer.type}) in pnnx's "
                                   ".bin", field="model")
        layer.data, at = data[at:reader.at], reader.at
    if at != len(data):
        raise MobileBuildError(f"ncnn's layers read {at} of the .bin's {len(data)} bytes", field="model")


def layer_modules(model, run, layers):
    """{ncnn layer name: module path} of the weighted layers, or {} where the model's convolutions and linear layers,
    in the order `run()` (a forward of the model) calls them, do not pair one to one with the weighted layers of the
    .param in its order, with equal weight sizes."""
    called = []
    hooks = [module.register_forward_hook(lambda module, args, result, path=path: called.append((path, module)))
             for path, module in model.named_modules() if isinstance(module, MODULE_TYPES)]
    try:
        with torch.no_grad():
            run()
    finally:
        for hook in hooks:
            hook.remove()
    weighted = [layer for layer in layers if layer.type in WEIGHT_SIZE_KEY and not layer.int(19)]  # weights held
    if len(called) != len(weighted) or any(layer.int(WEIGHT_SIZE_KEY[layer.type]) != module.weight.numel()
                                           for layer, (_, module) in zip(weighted, called, strict=True)):
        return {}
    return {layer.name: path for layer, (path, _) in zip(weighted, called, strict=True)}


def kept_float(paths, named):
    """The ncnn layers of the modules at `paths` (quantize.exclude's, resolved), given `named` (layer_modules)."""
    if paths and not named:
        raise MobileBuildError("pnnx's layers could not be matched to the model's modules (their order or weight "
                               "sizes differ), so quantize.exclude cannot name them: leave exclude out for ncnn",
                               field="quantize.exclude")
    return {layer for layer, path in named.items()
            if any(path == kept or path.startswith(kept + ".") for kept in paths)}


def observed_scales(files, layers, batches, observer):
    """{layer name: its input's ncnn scale} from the fp32 model's blobs on the calibration batches."""
    net = guest.net(files, "fp32")
    inputs = guest.numbered(net.input_names())
    blobs = {layer.bottoms[0] for layer in layers}
    observers = {blob: quantize.OBSERVERS[observer](dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
                 for blob in blobs}
    samples, shown = 0, time.monotonic()
    for batch in batches:
        arrays = [tensor.detach().cpu().numpy() for tensor in batch]
        for sample in range(len(arrays[0]) if arrays and numpy.ndim(arrays[0]) else 1):
            extractor = net.create_extractor()
            extractor.set_light_mode(False)  # keep every blob, not only the outputs'
            for name, array in zip(inputs, arrays, strict=True):
                extractor.input(name, guest.mat(array[sample:sample + 1]))
            for blob, watching in observers.items():
                status, mat = extractor.extract(blob)
                if status != 0:
                    raise MobileBuildError(f"ncnn could not compute blob {blob} of the fp32 model", field="model")
                watching(torch.from_numpy(numpy.array(mat.numpy())))
            samples += 1
        if time.monotonic() - shown > PROGRESS_EVERY_S:
            progress.note(f"calibrated on {samples} sample(s)")
            shown = time.monotonic()
    if not samples:
        raise MobileBuildError("calibration produced no batches", field="quantize.calibration")
    return {layer.name: _ncnn_scale(observers[layer.bottoms[0]]) for layer in layers}


def _ncnn_scale(observer):
    """127 over the range a symmetric torch observer keeps (its scale times half its integer range)."""
    scale = float(observer.calculate_qparams()[0])
    kept = scale * (observer.quant_max - observer.quant_min) / 2
    return 127.0 / kept if kept > 0 else 1.0


def _weight_rows(layer):
    """(the layer's fp32 weights as rows, one per scale; its bias bytes), read from its .bin bytes."""
    size = layer.int(2) if layer.type == "InnerProduct" else layer.int(6)
    outputs = layer.int(0)
    bias = layer.int(1) if layer.type == "InnerProduct" else layer.int(5)
    expected = 4 + 4 * size + (4 * outputs if bias else 0)
    tag = struct.unpack_from("<I", layer.data)[0] if len(layer.data) >= 4 else None
    if tag != FP32_TAG or len(layer.data) != expected:
        raise MobileBuildError(f"layer {layer.name} ({layer.type}): its weights are not pnnx's fp32 ones "
                               f"({len(layer.data)} bytes, tag {tag})", field="model")
    rows = layer.int(7, 1) if layer.type == "ConvolutionDepthWise" else outputs
    weights = numpy.frombuffer(layer.data, numpy.float32, size, 4).reshape(rows, -1)
    return weights, layer.data[4 + 4 * size:]


def _six_bit(layer):
    """ncnn2table's rule: its int8 Winograd kernel (3x3, stride 1, dilation 1 convolutions) takes 6-bit weights."""
    kernel = (layer.int(1), layer.int(11, layer.int(1)))
    stride = (layer.int(3, 1), layer.int(13, layer.int(3, 1)))
    dilation = (layer.int(2, 1), layer.int(12, layer.int(2, 1)))
    return layer.type == "Convolution" and kernel == (3, 3) and stride == (1, 1) and dilation == (1, 1)


def weight_scales(weights, layer, per_tensor=False):
    largest = numpy.abs(weights).max(axis=1)
    if per_tensor:
        largest = numpy.full_like(largest, largest.max())
    levels = 31.0 if _six_bit(layer) else 127.0
    return numpy.where(largest > 0, levels / numpy.where(largest > 0, largest, 1), 1.0).astype(numpy.float32)


def _int8_weights(weights, scales):
    """The weights quantized by ncnn's own quantize_to_int8 (each row by its scale), with ncnn's int8 tag, padded to
    four bytes as ncnn writes them."""
    options = ncnn.Option()
    options.use_packing_layout = False  # one value per element, as the .bin stores them
    options.num_threads = 1
    quantized = ncnn.quantize_to_int8(ncnn.Mat(numpy.ascontiguousarray(weights)), ncnn.Mat(scales), options)
    values = numpy.array(quantized.numpy()).astype(numpy.int8).tobytes()
    return struct.pack("<I", INT8_TAG) + values + b"\0" * (-len(values) % 4)


def quantized(files, batches, observer, kept=(), per_tensor=False):
    """ncnn's int8 model ({PARAM: .param bytes, BIN: .bin bytes}) of pnnx's fp32 one (`files`), layers named in
    `kept` left float."""
    param_text, data = files[guest.PARAM].decode(), files[guest.BIN]
    layers = parse(param_text)
    spans(layers, data)
    # a convolution whose weights are an input (param 19, dynamic_weight) has none to quantize: it stays float
    chosen = [layer for layer in layers if layer.type in QUANTIZED and layer.name not in kept and not layer.int(19)]
    if not chosen:
        weighted = sorted({layer.type for layer in layers if layer.data and layer.type not in QUANTIZED})
        has = f" (its weights are in {', '.join(weighted)} layers)" if weighted else ""
        raise MobileBuildError(f"the model has no Convolution, ConvolutionDepthWise or InnerProduct layer left to "
                               f"quantize{has}: the int8 built here is those layers', calibrated; keep this model on "
                               "ncnn's fp32 or fp16", field="quantize.exclude" if kept else "model")
    progress.note(f"calibrating {len(chosen)} layer(s)")
    scales = observed_scales(files, chosen, batches, observer)
    terms = {layer.name: QUANTIZED[layer.type] for layer in chosen}
    consumers = {layer.bottoms[0]: layer for layer in chosen if len(layer.bottoms) == 1}
    lines, written = [MAGIC, param_text.splitlines()[1]], bytearray()
    for layer in layers:
        if layer.name not in terms:
            lines.append(layer.line)
            written += layer.data
            continue
        weights, bias = _weight_rows(layer)
        rows = weight_scales(weights, layer, per_tensor)
        after = consumers.get(layer.tops[0]) if layer.type in REQUANTIZING else None
        requantize = after is not None and after.type in REQUANTIZING
        term = terms[layer.name] + (100 if requantize else 0)
        lines.append(f"{layer.line} 8={term}")
        written += _int8_weights(weights, rows) + bias + rows.tobytes()
        written += struct.pack("<f", scales[layer.name])
        if requantize:
            written += struct.pack("<f", scales[after.name])
    return {guest.PARAM: ("\n".join(lines) + "\n").encode(), guest.BIN: bytes(written)}

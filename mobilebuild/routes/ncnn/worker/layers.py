"""ncnn: where an int8 ncnn model's error comes from. pnnx converts the float model again, in fp32: the same layers
and blobs as the shipped model's, without its scales. Each int8 layer of the shipped model is fed the fp32 model's
input blob (ncnn's extractor takes any blob as an input and computes from there) and its output is compared with the
fp32 layer's: the error the layer adds itself. A layer that requantizes to the next one (int8_scale_term +100) hands
on int8 values, read back at the next layer's input scale. Both run on ncnn's CPU path, with fp16 off.

Layers are named by the model's modules (a fused one's, as ConvReLU2d) where pnnx's order pairs them
(int8.layer_modules), else by ncnn's own layer names."""

import struct

import numpy
import torch
from torch.ao.nn.intrinsic import _FusedModule

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.ncnn.worker import convert, guest, int8
from mobilebuild.worker import capture_root, progress
from mobilebuild.worker.layers.common import Errors
from mobilebuild.worker.stages import fuse

DETAIL = ("each int8 layer of the shipped model fed the input blob of pnnx's fp32 conversion of the float model, "
          "against that layer's fp32 output (ncnn's extractor, on its CPU path)")


def module_names(model, named):
    """{ncnn layer: (module path, class name)}: a module fused with others (the Conv2d in a ConvReLU2d) by the fused
    one, as the other layer methods and quantize.exclude name it."""
    modules = dict(model.named_modules())
    found = {}
    for layer, path in named.items():
        parent = path.rpartition(".")[0]
        if isinstance(modules.get(parent), _FusedModule):
            path = parent
        found[layer] = (path, type(modules[path]).__name__)
    return found


def _same_graph(float_layers, shipped_layers):
    """The shipped model is pnnx's fp32 conversion with int8 scales: the same layers and blobs."""
    shape = [(layer.type, layer.name, layer.bottoms, layer.tops) for layer in float_layers]
    if shape != [(layer.type, layer.name, layer.bottoms, layer.tops) for layer in shipped_layers]:
        raise MobileBuildError("pnnx's fp32 conversion of the float model does not have the shipped model's layers: "
                               "rebuild the ncnn target", field="targets")


def _requantized_scale(layer):
    """The scale a requantizing layer's int8 output was written at (the last float of its .bin bytes), or None."""
    return struct.unpack_from("<f", layer.data, len(layer.data) - 4)[0] if layer.int(8) > 100 else None


def compare(inputs, config, chunks):
    """The layers hook (see mobilebuild.worker.stages.layers)."""
    progress.note("converting the float model again (pnnx, fp32)")
    model = fuse.load(inputs["model"], config)
    captured = capture_root.nested(model, len(config.inputs))
    examples = convert.examples_of(config.inputs)
    floating = convert.converted(captured, examples, "fp32")
    shipped, _ = guest.read(inputs["artifact"])
    float_layers, layers = int8.parse(floating[guest.PARAM].decode()), int8.parse(shipped[guest.PARAM].decode())
    _same_graph(float_layers, layers)
    int8.spans(layers, shipped[guest.BIN])
    quantized = [layer for layer in layers if int8.is_int8(layer)]
    names = module_names(model, int8.layer_modules(model, lambda: captured(*examples), float_layers))
    float_net, int8_net = guest.net(floating, "fp32"), guest.net(shipped, "fp32")
    input_names = guest.numbered(float_net.input_names())
    errors = Errors()
    for chunk in chunks:
        arrays = [tensor.detach().cpu().numpy() for tensor in chunk]
        for sample in range(len(arrays[0])):
            reference = float_net.create_extractor()
            reference.set_light_mode(False)
            for name, array in zip(input_names, arrays, strict=True):
                reference.input(name, guest.mat(array[sample:sample + 1]))
            for layer in quantized:
                fed, expected = (_extracted(reference, blob) for blob in (layer.bottoms[0], layer.tops[0]))
                alone = int8_net.create_extractor()
                alone.input(layer.bottoms[0], fed.clone())
                output = numpy.array(_extracted(alone, layer.tops[0]).numpy())
                scale = _requantized_scale(layer)
                if scale:
                    output = output / scale
                name, op = names.get(layer.name, (layer.name, layer.type))
                errors.add(name, op, torch.from_numpy(numpy.array(expected.numpy())), torch.from_numpy(output))
    return errors, "ncnn", DETAIL


def _extracted(extractor, blob):
    status, found = extractor.extract(blob)
    if status != 0:
        raise MobileBuildError(f"ncnn could not compute blob {blob}", field="targets")
    return found

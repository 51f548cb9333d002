"""LiteRT's interpreter runs a .tflite on its CPU path (the XNNPACK delegate it applies by default), inputs cast to
the model's dtypes and int8 ones quantized with their scale and zero point, int8 outputs dequantized, as an app
feeding it would. The host's runtime module (routes/litert/worker/runtime.py) feeds its interpreter through the same
functions."""

import numpy
from ai_edge_litert.interpreter import Interpreter

INTEGER_IO = (numpy.int8, numpy.uint8, numpy.int16)


def to_model(array, detail):
    """An array as the model's input `detail` takes it: its dtype, int8 quantized with its scale and zero point."""
    scale, zero_point = detail["quantization"]
    if detail["dtype"] in INTEGER_IO and scale:
        info = numpy.iinfo(detail["dtype"])
        return numpy.clip(numpy.round(array / scale + zero_point), info.min, info.max).astype(detail["dtype"])
    return array.astype(detail["dtype"], copy=False)


def from_model(array, detail):
    scale, zero_point = detail["quantization"]
    if detail["dtype"] in INTEGER_IO and scale:
        return (array.astype(numpy.float32) - zero_point) * scale
    return numpy.array(array)


def load(path, threads):
    interpreter = Interpreter(model_path=path, num_threads=threads)
    interpreter.allocate_tensors()
    inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()

    def run(arrays):
        for detail, array in zip(inputs, arrays, strict=True):
            interpreter.set_tensor(detail["index"], to_model(array, detail))
        interpreter.invoke()
        return [from_model(interpreter.get_tensor(detail["index"]), detail) for detail in outputs]

    return run

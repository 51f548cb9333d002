"""layers: where an int8 artifact's error comes from. Each quantized layer is compared with its float counterpart
fed the float side's inputs (a shadow comparison), so a layer is charged with the error it adds itself, not with
what the layers before it left at its output (which would always blame the last layers). The result lists the N
layers with the lowest SQNR, worst first.

Each route compares with the tools its quantizer comes with, in a worker-side module of its own
(mobilebuild.worker.layers: eager.py, which hands a model quantized in FX graph mode to fx.py; pt2e.py; onnx.py, its
graph surgery in onnx_surgery.py; what they share in common.py). The planner names the route's module by its dotted
path in `config.method` (LayersConfig.method: "mobilebuild.routes.executorch.worker.layers"; a string, since the plan
layer imports no worker code); this stage imports it and calls its one entry function. That function is the hook a new
route implements:

    compare(inputs, config, chunks) -> (errors, method, detail)

  inputs   the stage's inputs by role, paths: "model" (the fused float model, fuse.load(path, config)), and
           "quantized" (the quantize stage's model) or "artifact" (the shipped artifact) where the planner gives them
  config   the LayersConfig
  chunks   verification's data: a list of batches at the example's sizes, each a tuple of tensors in the order of
           config.inputs
  errors   a mobilebuild.worker.layers.common.Errors, each layer's float and int8 outputs added to it (Errors.add),
           or a layer that cannot be compared noted with why (Errors.skip)
  method   the method's short name, as the result and the report record it: "eager", "fx", "pt2e", "onnx"
  detail   one line on how it compares (the result's method_detail)

It may raise: the result then says the comparison failed, and why; the build goes on. It runs with native stderr
filtered (quiet.native_stderr(once=True)), its module imported there too.

A layer is a module with no module running inside it (Linear, LayerNorm, MultiheadAttention), named by its class;
the operations a container runs itself (a TransformerEncoderLayer's residual adds) are named by their op, numbered
where it has several. A layer's SQNR is measured over the values the float model has finite (an attention mask's
-inf is left out); a layer that has no SQNR (int8 gives inf or NaN where float does not, an all-zero float output, a
part that cannot run alone) is listed under not_compared with why, never given a number.
The data is verification's (verify.evaluation_data: never calibration's), at the example's sizes.
"""

import dataclasses
import importlib
import json
import time
from types import SimpleNamespace

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import quiet
from mobilebuild.worker.stages import modeling, verify


def batches(config):
    """(batches of the example's size as tuples of tensors, what the data is): verification's data."""
    settings = SimpleNamespace(**dataclasses.asdict(config), fixed_shape="the example's sizes")
    groups, description = verify.evaluation_data(settings)
    _, data, _ = groups[0]
    size = config.inputs[0]["shape"][0]
    usable = min(len(data[0]), max(config.samples, size))  # an evaluation function's data too
    usable -= usable % size
    return list(zip(*(x[:usable].split(size) for x in data))), description


def run(inputs, config, output):
    started = time.perf_counter()
    result = {"artifact_sha256": store.sha256_file(inputs["artifact"]) if "artifact" in inputs else None,
              "precision": config.precision, "layers": [], "compared": 0, "method": None}
    try:
        chunks, description = batches(config)
        if not chunks:
            raise MobileBuildError("no verification input at the example's sizes", field="verify.samples")
        with quiet.native_stderr(once=True):
            comparing = importlib.import_module(config.method)
            errors, method, method_detail = comparing.compare(inputs, config, chunks)
        ranked, uncompared = errors.results()
        result.update(layers=ranked[:config.top], compared=len(errors.found), method=method,
                      method_detail=method_detail, data=description, samples=sum(len(chunk[0]) for chunk in chunks))
        if uncompared:  # no SQNR: said, not ranked
            result["not_compared"] = uncompared
    except Exception as exc:  # a diagnosis, not a verdict: what it cannot do is said, and the build goes on
        result["error"] = failure(exc)
    write(result, started, output)


def failure(exc):
    detail = exc.message if isinstance(exc, MobileBuildError) else f"{type(exc).__name__}: " \
                                                                    f"{modeling.first_line(exc)}"
    return f"the per-layer comparison failed: {detail}"


def write(result, started, output):
    """The result with its time, and its one line."""
    result["seconds"] = round(time.perf_counter() - started, 2)
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True, allow_nan=False)
    print(f"   {summary(result)}")


def summary(result):
    """One line: 'worst layers: features.3.conv (Conv2d) 8.1 dB, ...'."""
    if result.get("error"):
        return result["error"]
    shown = ", ".join(f"{row['name']} ({row['op']}) {row['sqnr_db']:.1f} dB" for row in result.get("layers", []))
    line = f"worst layers: {shown or 'none compared'} ({result.get('method')}, {result.get('seconds')} s)"
    uncompared = result.get("not_compared") or []
    if uncompared:
        line += "; no SQNR: " + "; ".join(f"{row['name']} ({row['op']}): {row['reason']}" for row in uncompared[:3])
        line += f"; {len(uncompared) - 3} more" if len(uncompared) > 3 else ""
    return line

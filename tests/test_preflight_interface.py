"""`mobilebuild check`'s interface findings: per target, each input dtype the route cannot take (or takes as it is,
unquantized, in int8), each dynamic dim it fixes, and an output structure its runtime does not return as the model
does. Fast: the statements from the recipe and the model's structure (the build's tasks stand aside); slow: checked
against what real builds of a tiny model make."""

import textwrap

import pytest
import yaml
from conftest import Project

from mobilebuild import preflight
from mobilebuild.plan import routes
from mobilebuild.preflight import interface

MODELS = textwrap.dedent('''
    import collections

    import torch
    from torch import nn

    Pair = collections.namedtuple("Pair", ["scores", "box"])


    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.scores = nn.Linear(8, 5)
            self.box = nn.Linear(8, 4)

        def features(self, x):
            return torch.flatten(nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1), 1)


    class DictOut(Body):
        def forward(self, x):
            f = self.features(x)
            return {"scores": self.scores(f), "box": self.box(f)}


    class NamedOut(Body):
        def forward(self, x):
            f = self.features(x)
            return Pair(self.scores(f), self.box(f))


    class TupleOut(Body):
        def forward(self, x):
            f = self.features(x)
            return self.scores(f), self.box(f)


    class Ids(nn.Module):
        """Token ids and a float feature, over a sequence of any length."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.head = nn.Linear(8, 3)

        def forward(self, ids, extra):
            return self.head(self.embed(ids).mean(1) + extra)


    def make(name):
        return globals()[name]()
''')

EVERY_HOST_ROUTE = [{"backend": "xnnpack"}, {"backend": "qnnpack"}, {"backend": "nnapi"},
                    {"backend": "xnnpack", "runtime": "executorch", "name": "et"},
                    {"backend": "xnnpack", "runtime": "executorch", "name": "et-int8", "precision": "int8"},
                    {"backend": "onnx"}, {"backend": "onnx", "name": "onnx-int8", "precision": "int8"}]
IMAGE = {"input": {"shape": [1, 3, 8, 8]}}
IDS = {"inputs": [{"name": "ids", "shape": [1, "seq"], "dtype": "int64", "range": [0, 16]},
                  {"name": "extra", "shape": [1, 8]}],
       "dims": {"seq": {"min": 2, "max": 12, "example": 6}}}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    project = Project(tmp_path_factory.mktemp("interface"))
    (project.root / "interface_models.py").write_text(MODELS)
    return project.root


def write(root, name, model, interface_spec, script="script", targets=EVERY_HOST_ROUTE):
    recipe = {"name": name, "model": {"factory": "interface_models:make", "kwargs": {"name": model}},
              **interface_spec, "quantize": {"calibration": {"source": "random", "batches": 2, "seed": 0}},
              "script": script, "verify": {"samples": 2, "layers": False}, "benchmark": {"warmup": 1, "iters": 2},
              "targets": targets}
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path.relative_to(root)


def interface_findings(report):
    """{target: {where: detail}} of the interface findings."""
    return {result["target"]: {item["where"]: item["detail"] for item in result["findings"]
                               if item["kind"] == "interface"} for result in report["targets"]}


# --- from the recipe and the model's structure (fast) -----------------------------------------------------------


def test_integer_inputs_and_a_dynamic_dim_per_target(root, no_build):
    report = preflight.run(write(root, "ids", "Ids", IDS, script="trace"), root)
    found = interface_findings(report)
    assert found["xnnpack"] == {"dims.seq": "seq is fixed at 6 (the recipe allows 2 to 12): tracing records the "
                                            "example's sizes (script: script keeps them)"}
    assert found["qnnpack"]["dims.seq"] == found["xnnpack"]["dims.seq"]
    assert found["qnnpack"]["inputs[0].dtype"] == ("ids (int64) enters the int8 model as it is: int8 quantization "
                                                   "quantizes float inputs only")
    assert found["nnapi"]["inputs[0].dtype"] == ("ids (int64) cannot be kept: torch.backends._nnapi converts float32, "
                                                 "int32 and quantized input tensors only")
    assert found["nnapi"]["dims.seq"].endswith("the NNAPI converter takes the example's sizes")
    assert found["et"] == {} and found["onnx"] == {} and found["onnx-int8"] == {"inputs[0].dtype": found["qnnpack"][
        "inputs[0].dtype"]}
    assert set(found["et-int8"]) == {"inputs[0].dtype", "dims.seq"}  # the int8 export recipe fixes it
    assert "inputs[1].dtype" not in found["qnnpack"]  # float: nothing to say


def test_output_structures_each_runtime_returns_otherwise(root, no_build):
    found = interface_findings(preflight.run(write(root, "dict_out", "DictOut", IMAGE), root))
    assert found["xnnpack"] == {}  # TorchScript returns the dict
    assert found["qnnpack"]["outputs"] == ("outputs are a dict (scores, box): eager int8 dequantizes each output in a "
                                           "wrapper torch.jit.script cannot compile; `script: trace` keeps the "
                                           "structure")
    assert "NNAPI cannot return them" in found["nnapi"]["outputs"]
    assert found["et"]["outputs"].endswith("ExecuTorch returns a flat list of 2 tensors, in this order: scores, box")
    assert found["onnx"]["outputs"].endswith("ONNX has 2 flat outputs, named scores, box (the recipe's `outputs` "
                                             "renames them)")

    found = interface_findings(preflight.run(write(root, "named_out", "NamedOut", IMAGE, "trace"), root))
    assert "traced TorchScript returns a named tuple as a plain tuple" in found["xnnpack"]["outputs"]
    assert found["nnapi"]["outputs"].endswith("NNAPI returns a plain tuple: the field names are lost")
    assert "cannot serialize a named tuple" in found["et"]["outputs"]

    found = interface_findings(preflight.run(write(root, "tuple_out", "TupleOut", IMAGE, "trace"), root))
    assert found == {target["name"] if "name" in target else target["backend"]: {} for target in EVERY_HOST_ROUTE}


def test_a_structure_is_described_by_its_leaves():
    tree = {"tuple": ["tensor", {"dict": [["a", "tensor"], ["b", {"list": ["tensor", "tensor"]}]]}]}
    assert interface.leaf_names(tree) == ["0", "1.a", "1.b.0", "1.b.1"]
    assert interface.kinds(tree) == {"tuple", "dict", "list"}
    assert interface.describe(tree) == "a tuple of 4 tensors (0, 1.a, 1.b.0, 1.b.1)"
    assert interface.describe({"namedtuple": "Pair", "fields": [["s", "tensor"], ["b", "tensor"]]}) == \
        "a named tuple Pair (s, b)"


def test_an_eager_int8_model_that_compiled_after_all_is_not_blamed():
    """The scripting finding is for the eager wrapper: a model quantized another way (FX graph mode), whose int8
    artifact was made, gets none."""
    route = routes.get("qnnpack", "pytorch-mobile")
    facts = {"outputs": {"dict": [["a", "tensor"], ["b", "tensor"]]}, "own_stubs": False}
    assert interface.output_findings("qnnpack", route, "int8", {}, "script", facts, made=False)
    assert interface.output_findings("qnnpack", route, "int8", {}, "script", facts, made=True) == []
    assert interface.output_findings("qnnpack", route, "int8", {"mode": "dynamic"}, "script", facts, made=False) == []
    assert interface.output_findings("qnnpack", route, "int8", {}, "script", {**facts, "own_stubs": True},
                                     made=False) == []


# --- against real builds (slow) ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_what_the_findings_say_is_what_the_builds_make(root):
    import onnxruntime
    import torch
    from torch.jit.mobile import _load_for_lite_interpreter

    from mobilebuild.routes.executorch.worker import runtime as et_runtime

    report = preflight.run(write(root, "dict_real", "DictOut", IMAGE), root)
    by_target = {result["target"]: result for result in report["targets"]}
    found = interface_findings(report)
    # the builds refuse where the findings say the structure cannot be returned
    assert by_target["nnapi"]["made"] == "failed" and "outputs" in found["nnapi"]
    # qnnpack's eager int8 wrapper does not script with a dict output; its traced fallback (script.saved) returns
    # the dict, and the findings agree
    assert by_target["qnnpack"]["made"] == "built" and found["qnnpack"] == {}
    # and return what they say where they are made
    example = torch.randn(1, 3, 8, 8)
    program = et_runtime.load(root / "artifacts/dict_real/dict_real-et.pte", None)
    assert isinstance(program(example), tuple) and len(program(example)) == 2  # flat: the keys are gone
    session = onnxruntime.InferenceSession(str(root / "artifacts/dict_real/dict_real-onnx.onnx"))
    assert [output.name for output in session.get_outputs()] == ["scores", "box"]
    scripted = _load_for_lite_interpreter(str(root / "artifacts/dict_real/dict_real-xnnpack.ptl"))
    assert set(scripted(example)) == {"scores", "box"} and found["xnnpack"] == {}
    int8 = _load_for_lite_interpreter(str(root / "artifacts/dict_real/dict_real-qnnpack.ptl"))
    assert set(int8(example)) == {"scores", "box"}

    report = preflight.run(write(root, "dict_traced", "DictOut", IMAGE, "trace", [{"backend": "qnnpack"}]), root)
    assert report["targets"][0]["made"] == "built" and interface_findings(report)["qnnpack"] == {}

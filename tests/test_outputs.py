"""Models whose forward returns more than one tensor (tuples, named tuples, dicts, nested) are verified output by
output, in every runtime that runs on the host; any model torchvision registers can be a recipe's model."""

import json
import textwrap
from collections import namedtuple

import pytest
import torch
from conftest import tiny_recipe

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import outputs
from mobilebuild.worker.stages import modeling

HEADS = textwrap.dedent('''
    import torch
    from torch import nn


    class TwoHeads(nn.Module):
        """Class scores and an embedding, as a retrieval model returns them."""

        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten())
            self.classes = nn.Linear(8 * 6 * 6, 5)
            self.embedding = nn.Linear(8 * 6 * 6, 16)

        def forward(self, x):
            features = self.body(x)
            return self.classes(features), self.embedding(features)


    class Segmenter(nn.Module):
        """A dict, as torchvision's segmentation models return it."""

        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.out = nn.Conv2d(8, 4, 1)
            self.aux = nn.Conv2d(8, 4, 1)

        def forward(self, x):
            features = self.backbone(x)
            return {"out": self.out(features), "aux": self.aux(features)}


    def two_heads():
        return TwoHeads()


    def segmenter():
        return Segmenter()
''')

Pair = namedtuple("Pair", ["logits", "embedding"])


def test_outputs_are_named_by_their_place_in_the_structure():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    assert [name for name, _ in outputs.leaves(a)] == ["output"]
    assert [name for name, _ in outputs.leaves((a, b))] == ["0", "1"]
    assert [name for name, _ in outputs.leaves(Pair(a, b))] == ["logits", "embedding"]
    nested = {"out": a, "extra": [b, {"depth": c}], "count": 3, "aux": None}
    assert [(name, value.item()) for name, value in outputs.leaves(nested)] == [
        ("out", 0.0), ("extra.0", 1.0), ("extra.1.depth", 2.0)]


@pytest.mark.parametrize("name", ["lraspp_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn", "r3d_18",
                                  "raft_small"])
def test_any_registered_torchvision_builder_is_a_model_without_downloads(name):
    """Segmentation, detection, video and optical flow live outside torchvision.models' namespace; detection and
    segmentation would fetch a pretrained backbone unless told not to."""
    assert isinstance(modeling.build_model({"torchvision": name}, seed=0), torch.nn.Module)


def test_a_quantizable_variant_and_an_unknown_builder():
    model = modeling.build_model({"torchvision": "shufflenet_v2_x0_5", "quantizable": True}, seed=0)
    assert hasattr(model, "fuse_model")
    with pytest.raises(MobileBuildError, match=r"torchvision.models has no model builder 'mobilenet_v9' \(closest: "
                                               r"mobilenet_v2"):
        modeling.build_model({"torchvision": "mobilenet_v9"}, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "script", "names"), [("two_heads", "trace", ["0", "1"]),
                                                          ("segmenter", "trace", ["out", "aux"]),
                                                          ("segmenter", "script", ["out", "aux"])])
def test_every_output_is_verified_in_every_host_runtime(project, factory, script, names):
    (project.root / "heads.py").write_text(HEADS)
    targets = [{"backend": "xnnpack"}, {"backend": "xnnpack", "runtime": "executorch", "name": "et"},
               {"backend": "onnx"}]
    if script == "trace":  # eager int8 dequantizes each output; TorchScript cannot compile that for any structure
        targets.append({"backend": "qnnpack"})
    # 8 calibration batches: with the tiny recipe's 2, int8 misses its thresholds on these heads (about 12 dB)
    project.write_recipe(tiny_recipe(model={"factory": f"heads:{factory}", "seed": 0, "batchnorm_stats": 2},
                                     quantize={"calibration": {"source": "random", "batches": 8, "seed": 0}},
                                     script=script, targets=targets))
    result = project.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(2 outputs, worst: " in result.stdout
    for target in [t.get("name", t["backend"]) for t in targets]:
        verification = json.loads(project.artifact(f"tiny/verify-{target}.json").read_text())
        assert verification["status"] == "passed", (target, verification)
        assert sorted(verification["outputs"]) == sorted(names)  # results are written with sorted keys
        assert verification["worst_output"] in names
        assert verification["metrics"] == verification["outputs"][verification["worst_output"]]
        floor = 15 if target == "qnnpack" else 40  # the recipe's int8 and fp32 thresholds
        assert all(found["sqnr_db"] > floor for found in verification["outputs"].values())
        assert [output["name"] for output in verification["output_spec"]] == names

"""A model whose top-level modules are named like GraphModule's attributes (`meta`, `graph`): captured inside a root of
ours by every route, its module paths the user's wherever a user reads them."""

import json
import textwrap

import pytest
import torch
from tiny_models import HOST_TARGETS
from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

from mobilebuild.worker import capture_root
from mobilebuild.worker.stages import exclusion, fuse

IMAGE_AND_META = textwrap.dedent('''
    import torch
    import torchvision
    from torch import nn


    class ImageAndMeta(nn.Module):
        """An image through torchvision's MobileNetV3-Small features, tabular data through `meta`."""

        def __init__(self):
            super().__init__()
            self.image = nn.Sequential(torchvision.models.mobilenet_v3_small().features[:4],
                                       nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.meta = nn.Sequential(nn.Sequential(nn.Linear(16, 32)), nn.ReLU())
            self.head = nn.Linear(24 + 32, 10)

        def forward(self, image, meta):
            return self.head(torch.cat([self.image(image), self.meta(meta)], dim=1))


    def make():
        return ImageAndMeta()
''')


class Tabular(nn.Module):
    def __init__(self):
        super().__init__()
        self.graph = nn.Linear(4, 8)
        self.meta = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.code = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.code(self.meta(self.graph(x))))


def test_reserved_names_are_graph_modules_own():
    assert {"meta", "graph", "code", "recompile"} <= capture_root.reserved()
    assert not {"forward", "training", "image", "head"} & capture_root.reserved()
    assert capture_root.clashing(Tabular()) == ["code", "graph", "meta"]


def test_a_model_without_clashing_names_is_captured_as_it_is():
    model = nn.Sequential(nn.Linear(4, 4))
    assert capture_root.nested(model, 1) is model
    assert capture_root.paths(model, ["0"]) == ["0"]


def test_fx_and_torch_export_capture_a_clashing_model_inside_the_root():
    model = Tabular().eval()
    example = (torch.randn(2, 4),)
    with pytest.raises(RuntimeError, match="nonexistent attribute"):  # what the user met: GraphModule keeps these
        torch.export.export(model, example).module()
    nested = capture_root.nested(model, 1)
    assert isinstance(nested, capture_root.Nested) and nested.training is False
    for strict in (False, True):
        captured = torch.export.export(nested, example, strict=strict).module()
        torch.testing.assert_close(captured(*example), model(*example))
    mapping = get_default_qconfig_mapping("qnnpack")
    for path in capture_root.paths(nested, ["meta"]):
        mapping.set_module_name(path, None)
    observed = prepare_fx(nested, mapping, example)
    observed(*example)
    quantized = convert_fx(observed)
    kinds = {path: type(module).__module__ for path, module in quantized.named_modules()}
    assert kinds[f"{capture_root.ROOT}.graph"].startswith("torch.ao.nn.quantized")
    assert not kinds[f"{capture_root.ROOT}.meta.0"].startswith("torch.ao.nn.quantized")  # kept float, by its path
    assert dict(model.named_children()).keys() == {"graph", "meta", "code", "act"}  # the model itself unchanged


def test_exclusion_resolves_the_users_paths_on_the_root():
    nested = capture_root.nested(Tabular(), 1)
    assert exclusion.resolve(nested, ["meta.0", "graph"]) == [f"{capture_root.ROOT}.graph",
                                                               f"{capture_root.ROOT}.meta.0"]


def test_fusion_traces_a_clashing_model():
    """`code` feeds `act` in forward alone (no container holds the two): only a trace finds the pair."""
    model, groups = fuse.fuse(Tabular().eval(), "auto")
    assert ["code", "act"] in groups


@pytest.mark.parametrize(("text", "user"), [
    ("unclashed.meta.0.0", "meta.0.0"),
    ("p_unclashed_meta_0_0_weight", "p_meta_0_0_weight"),
    ("/unclashed/meta/meta.0/Gemm", "/meta/meta.0/Gemm"),
    ("torch failed at module unclashed.meta (Sequential)", "torch failed at module meta (Sequential)"),
    ("an unclashedly named thing", "an unclashedly named thing"),
])
def test_user_text_names_modules_as_the_model_does(text, user):
    assert capture_root.user_text(text) == user


@pytest.mark.slow
def test_image_and_meta_builds_verifies_and_names_its_modules_on_every_host_route(project):
    """Every host route (PyTorch Mobile fp32 and int8, ExecuTorch, ONNX Runtime, LiteRT), with `meta.0` kept float in
    int8 and each per-layer table naming the user's modules."""
    (project.root / "image_and_meta.py").write_text(IMAGE_AND_META)
    targets = HOST_TARGETS
    project.write_recipe({
        "name": "imeta", "model": {"factory": "image_and_meta:make", "batchnorm_stats": 4},
        "inputs": [{"name": "image", "shape": [1, 3, 32, 32], "distribution": {"uniform": {"low": 0, "high": 1}}},
                   {"name": "meta", "shape": [1, 16], "memory_format": "contiguous"}],
        "quantize": {"exclude": ["meta.0"], "calibration": {"source": "random", "batches": 4}},
        # random weights: int8 is judged on following the model, not on its class scores
        "verify": {"thresholds": {"int8": {"sqnr_db": 8, "cosine": 0.9, "top1_agreement": 0}}},
        "benchmark": {"warmup": 1, "iters": 2}, "targets": targets})
    result = project.run("-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert capture_root.ROOT not in result.stdout + result.stderr
    for target in targets:
        name = target.get("name", target["backend"])
        assert json.loads(project.artifact(f"imeta/verify-{name}.json").read_text())["status"] == "passed", name
        layers = project.artifact(f"imeta/layers-{name}.json")
        if layers.exists():
            rows = json.loads(layers.read_text())["layers"]
            assert rows and not any(capture_root.ROOT in row["name"] for row in rows), name
            assert any(row["name"].startswith("image.") for row in rows), name

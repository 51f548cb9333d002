"""The metric code on cases computed by hand."""

import math

import pytest
import torch

from mobilebuild.worker import metrics

REF = torch.tensor([1.0, 2.0, 3.0, 4.0])
OUT = torch.tensor([1.0, 2.0, 3.0, 5.0])


def test_sqnr_by_hand():
    # signal mean(ref^2) = 30/4 = 7.5; noise mean(err^2) = 1/4; 10 log10(30) dB
    assert metrics.sqnr_db(REF, OUT) == pytest.approx(10 * math.log10(30.0))
    assert metrics.sqnr_db(REF, OUT) == pytest.approx(14.7712, abs=1e-4)
    assert metrics.sqnr_db(REF, REF) == math.inf


def test_sqnr_ignores_scale():
    assert metrics.sqnr_db(REF * 1e-9, OUT * 1e-9) == pytest.approx(metrics.sqnr_db(REF, OUT))


def test_cosine_by_hand():
    # ref.out = 1 + 4 + 9 + 20 = 34; |ref| = sqrt(30); |out| = sqrt(39)
    assert metrics.cosine(REF, OUT) == pytest.approx(34 / math.sqrt(30 * 39))
    assert metrics.cosine(REF, -REF) == pytest.approx(-1.0)


def test_max_relative_error_by_hand():
    # worst |err| = 1; reference range = 4 - 1 = 3
    assert metrics.max_rel_error(REF, OUT) == pytest.approx(1 / 3)
    assert metrics.max_rel_error(REF * 1e-9, OUT * 1e-9) == pytest.approx(1 / 3)


def test_top1_agreement_and_accuracy_by_hand():
    reference = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    output = torch.tensor([[0.8, 0.2], [0.7, 0.3], [0.6, 0.4], [0.1, 0.9]])
    labels = torch.tensor([0, 1, 1, 1])
    assert metrics.top1_agreement(reference, output) == pytest.approx(0.75)
    assert metrics.top1_agreement(REF, OUT) is None  # not class scores
    found = metrics.compare(reference, output, labels)
    assert found["accuracy_reference"] == pytest.approx(0.75)
    assert found["accuracy_artifact"] == pytest.approx(0.5)
    assert found["accuracy_drop"] == pytest.approx(0.25)


def test_failures_name_the_metric_value_and_limit():
    found = metrics.compare(REF, OUT)
    assert metrics.failures(found, {"sqnr_db": 20, "cosine": 0.99, "max_rel_error": 0.1, "top1_agreement": 1.0}) \
        == ["max_rel_error 0.3333 > 0.1", "sqnr_db 14.77 < 20"]
    assert metrics.failures(found, {"sqnr_db": 10}) == []


def test_thresholds_looser_than_the_defaults_are_relaxed_whichever_their_direction():
    defaults = {"sqnr_db": 15, "cosine": 0.98, "max_rel_error": 0.5, "top1_agreement": 0.8, "accuracy_drop": 0.02}
    used = {**defaults, "sqnr_db": 10, "max_rel_error": 0.6, "cosine": 0.99, "accuracy_drop": 0.01}
    assert metrics.relaxed(used, defaults) == {"sqnr_db": {"used": 10, "default": 15},
                                               "max_rel_error": {"used": 0.6, "default": 0.5}}
    assert metrics.relaxed(defaults, defaults) == {}
    assert metrics.relaxed(used, None) == {}


def _outputs(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.eval()(torch.randn(4, 3, 32, 32))


def test_a_random_weight_reference_is_named_degenerate_a_varying_one_is_not():
    import timm
    import torchvision

    torch.manual_seed(0)
    near_zero = metrics.degenerate(_outputs(torchvision.models.mobilenet_v3_small(num_classes=10)))
    assert near_zero.startswith("is near zero (RMS ")
    assert metrics.degenerate(_outputs(timm.create_model("lcnet_050", num_classes=10))).startswith("is near zero")
    resnet = timm.create_model("resnet10t", num_classes=10)
    assert metrics.degenerate(_outputs(resnet)) is None
    constant = _outputs(resnet)[:1].repeat(4, 1) + 1e-4 * torch.randn(4, 10)
    assert metrics.degenerate(constant).startswith("hardly depends on the input (it varies by 0.")
    assert metrics.degenerate(torch.ones(1, 10)) is None  # one sample: nothing to vary

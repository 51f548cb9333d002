"""Findings, and the architecture advice of the edge-deployment talk and the performance recipe that does not depend
on running a target's toolchain: which activations each target fuses into the convolution or linear layer before
them."""

from mobilebuild.errors import few

# build-fails: a task of the build up to the target's artifact fails (the build's own error); cannot-run: the artifact
# was made, and this host's runtime cannot load or run it. A fallback (operators outside the delegate, on the portable
# kernels) builds, loads and runs: a warning. interface: an input dtype, a dynamic dim or the output structure the
# target does not keep as the model has it (interface.py).
KINDS = ("build-fails", "cannot-run", "fallback", "interface", "advice")
BLOCKING = frozenset(KINDS[:2])
ALL_TARGETS = "*"
SHOWN_PLACES = 4  # layers named in one finding before "and N more"
DISPLAY = {"relu": "ReLU", "relu6": "ReLU6", "hardtanh": "Hardtanh", "hardswish": "Hardswish",
           "hardsigmoid": "Hardsigmoid", "silu": "SiLU", "gelu": "GELU", "sigmoid": "Sigmoid", "tanh": "Tanh",
           "leaky_relu": "LeakyReLU", "elu": "ELU", "mish": "Mish", "prelu": "PReLU", "softplus": "Softplus",
           "selu": "SELU", "celu": "CELU"}


# --- findings ------------------------------------------------------------------------------------------------


def finding(target, kind, detail, where):
    assert kind in KINDS, kind
    return {"target": target, "kind": kind, "detail": detail, "where": where}


# --- activations each target fuses ------------------------------------------------------------------------------

CLAMPS = frozenset({"relu", "relu6", "hardtanh"})
# key -> ({layer kind: activations fused into it}, who fuses). A layer kind left out: no claim either way.
FUSION = {
    "xnnpack/pytorch-mobile": ({"conv": CLAMPS, "linear": CLAMPS}, (
        "optimize_for_mobile folds only ReLU and ReLU6/Hardtanh clamps into XNNPACK's prepacked convolution and "
        "linear ops")),
    "vulkan/pytorch-mobile": ({"conv": CLAMPS}, (
        "optimize_for_mobile(backend='vulkan') folds only ReLU and ReLU6/Hardtanh clamps into its convolutions")),
    "metal/pytorch-mobile": ({"conv": CLAMPS}, (
        "optimize_for_mobile(backend='metal') folds only ReLU and ReLU6/Hardtanh clamps into its convolutions")),
    "qnnpack/pytorch-mobile": ({"conv": {"relu"}, "linear": {"relu"}},
                               "eager quantization fuses only Conv/Linear + ReLU (fuse_modules)"),
    "nnapi/pytorch-mobile": ({"conv": {"relu"}, "linear": set()}, (
        "the NNAPI converter fuses only ReLU, into quantized convolutions (conv2d_relu); ReLU6 and the rest are "
        "NNAPI operations of their own")),
    "executorch/xnnpack": ({"conv": CLAMPS, "linear": CLAMPS}, (
        "ExecuTorch's XNNPACK delegate fuses only ReLU and ReLU6/Hardtanh clamps into the op before them")),
    "executorch/vulkan": ({"conv": CLAMPS}, (
        "ExecuTorch's Vulkan delegate fuses only ReLU and ReLU6/Hardtanh clamps into convolutions (conv_with_clamp)")),
}


def activation_findings(target_id, fusion_key, activations):
    """One finding per activation kind that follows layers the target cannot fuse it into."""
    if fusion_key not in FUSION:
        return []
    fused_into, who = FUSION[fusion_key]
    unfused = {}
    for layer, kind, activation in activations:
        if kind in fused_into and activation not in fused_into[kind]:
            unfused.setdefault(activation, []).append(layer)
    return [finding(target_id, "advice",
                    f"{DISPLAY[activation]} does not fuse into the convolution/linear layer before it "
                    f"({len(layers)}x): {who}; it runs as a separate pass over the layer's output (the talk: use "
                    "efficient, fusable activations like ReLU)",
                    few(layers, SHOWN_PLACES))
            for activation, layers in unfused.items()]

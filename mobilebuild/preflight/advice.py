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

def activation_findings(target_id, fusion, activations):
    """One finding per activation kind that follows layers the target cannot fuse it into. `fusion`: what the
    target's route fuses (plan.routes.ActivationFusion), or None: it makes no claim."""
    if fusion is None:
        return []
    unfused = {}
    for layer, kind, activation in activations:
        if kind in fusion.into and activation not in fusion.into[kind]:
            unfused.setdefault(activation, []).append(layer)
    return [finding(target_id, "advice",
                    f"{DISPLAY[activation]} does not fuse into the convolution/linear layer before it "
                    f"({len(layers)}x): {fusion.by}; it runs as a separate pass over the layer's output (the talk: use "
                    "efficient, fusable activations like ReLU)",
                    few(layers, SHOWN_PLACES))
            for activation, layers in unfused.items()]

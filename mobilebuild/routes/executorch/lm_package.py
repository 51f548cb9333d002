"""A language model's ExecuTorch artifact: one program (.pte), or, where its LM head stays float, the program and
its weights apart, as ExecuTorch's external data (`model.pte` and `model.ptd`, what export_llm's
`foundation_weights_file` writes), zipped as one artifact (worker/archive.py).

Why apart: an LM head tied to the embedding is one weight in the model but two in a .pte. The embedding lookup
stays outside the XNNPACK delegate with the weight as a program constant, and the delegate takes its own copy for
the head; a .pte stores the program's constants and the delegate's data apart (a 135M-parameter SmolLM2 in fp32:
652 MB for 540 MB of weights). As external data both are one named tensor of the .ptd, stored once, and the runtime
runs them as fast (docs/llm.md). ExecuTorch's LLM runner and Android's LlmModule take the .ptd as their data path;
the host's `executorch.runtime` loader does not, so the build runs the pair through the pybindings' module.
Torch-free: the plan names the artifact's suffix by it."""

PROGRAM, WEIGHTS = "model.pte", "model.ptd"
SUFFIX = ".zip"


def weights_apart(precision, exclude):
    """Whether the target's LM head stays float (fp32, or `lm_head` kept float), so that its weights go apart."""
    return precision == "fp32" or "lm_head" in (exclude or ())

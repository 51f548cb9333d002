"""The typed values that several stages' settings share: where the model comes from, how it is fused, how an int8
model was quantized. They are TypedDicts, not classes, on purpose: a node's settings travel to its worker as JSON
and key its up-to-date check, so these stay the recipe's own JSON values (same keys, same bytes, same cache
entries), with a declared shape."""

from typing import Literal, TypedDict

# Libraries of models a recipe's model: may name (its key): the nodes that build a model with one are keyed on its
# version (ModelSource.library), as the node's interpreter has it.
MODEL_LIBRARIES = ("timm", "transformers")
MODEL_LIBRARY_EXTRA = "hub"  # the extra of mobilebuild that installs them


class ModelSource(TypedDict, total=False):
    """What the stages build the model from (plan.chain.model_source): exactly one of torchvision, factory, timm and
    transformers, with its options, as the recipe's `model:` gives them."""
    torchvision: str  # a torchvision builder name
    quantizable: bool  # take it from torchvision.models.quantization
    factory: str  # "package.module:function" of the user's own code
    timm: str  # a timm model name (pretrained=False)
    transformers: str  # a transformers class or pipeline task
    config: dict  # transformers: the model's configuration fields
    pretrained: str  # transformers: a local save_pretrained folder, relative to the recipe
    kwargs: dict  # keyword arguments of the builder, factory or class
    library: str  # the library of models that builds it (MODEL_LIBRARIES): its version keys the node
    inputs: list[str]  # the inputs' names, bound to forward's parameters by name (worker/named_inputs.py)


# The recipe's `fuse:`: "auto" (find the fusible sequences), False (fold batch norm only) or the module-name groups
Fusion = Literal["auto", False] | list[list[str]]


class Quantization(TypedDict, total=False):
    """How an int8 model was quantized, for the stages that rebuild it from the fused model and for the manifest
    (plan.chain.Chain.quantization). Routes that quantize in their final stage take exclude as a setting of its own."""
    mode: Literal["static", "dynamic", "qat"]
    weights: Literal["per_channel", "per_tensor"] | None  # None: the engine's default
    exclude: list[str]  # quantize.exclude, only where set (other recipes keep their keys)

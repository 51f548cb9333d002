"""genai_builder: onnxruntime-genai's model builder as its command line runs it, with the LM head found by identity
and Gemma 3's rotary parameters in the form it reads.

onnxruntime-genai 0.18.0's builder walks every module and takes each nn.Linear whose out_features is the vocabulary's
size for the LM head (builders/base.py, `Model.has_lm_head`). A model whose vocabulary is as large as a projection's
output (a byte-level vocabulary of 256 beside a hidden size of 256) then gets its projections written as LM heads
too: 3 to 7 dB against eager in fp32, measured. Here a loaded model's `lm_head` is the head and no other layer is;
a model without one is the builder's as it ships.

Its Gemma 3 reads rope_theta, rope_local_base_freq and one flat rope_parameters ({"rope_type": ...}), which
transformers 5 no longer writes: it keeps one per layer type ({"full_attention": ..., "sliding_attention": ...}),
and the builder stopped with KeyError: 'rope_type'. Here a Gemma 3 config gets those three from its per-type ones,
and its sliding layers' cos/sin caches leave out the global layers' linear scaling (Gemma 3 4B and larger), which
the builder gave them too.

    python -m mobilebuild.routes.onnx.worker.genai_builder <the builder's arguments>
"""

import runpy
import sys

BUILDER = "onnxruntime_genai.models.builder"
GEMMA3_TYPES = ("gemma3", "gemma3_text")  # Gemma 4's builder reads the per-type parameters itself
GLOBAL_ROPE = ("default", "linear")  # the RoPE of Gemma 3's global layers the builder takes (gemma3_rope)


def main(argv):
    import onnxruntime_genai.models  # noqa: F401  puts the builder's folder on sys.path, whose modules import so
    from builders import base, gemma  # the modules the builder's own imports load

    _head_by_identity(base.Model)
    _gemma3_rope_flattened(gemma.Gemma3Model)
    _gemma3_local_caches_unscaled(gemma.Gemma3Model)
    sys.argv = [BUILDER, *argv]
    runpy.run_module(BUILDER, run_name="__main__", alter_sys=True)


def _head_by_identity(model_class):
    """The model's own `lm_head` is the LM head and no other layer is (the builder's test where it has none)."""
    import torch

    builders_test = model_class.has_lm_head

    def has_lm_head(self, module):
        head = getattr(self.weights, "lm_head", None)
        return module is head if isinstance(head, torch.nn.Module) else builders_test(self, module)

    model_class.has_lm_head = has_lm_head


def _gemma3_rope_flattened(model_class):
    """After the builder's own reading of the config (text_config's fields brought up), a Gemma 3 config's rotary
    parameters as the builder's Gemma 3 reads them (gemma3_rope)."""
    builders_init = model_class.make_config_init

    def make_config_init(self, config):
        builders_init(self, config)
        if getattr(config, "model_type", None) in GEMMA3_TYPES:
            gemma3_rope(config)

    model_class.make_config_init = make_config_init


def gemma3_rope(config):
    """transformers 5's per-layer-type rotary parameters as the builder's Gemma 3 takes them: the global layers' for
    rope_parameters and rope_theta, the sliding layers' theta for rope_local_base_freq. The builder scales RoPE
    linearly at most here (Gemma 3 4B and larger: its global layers'); any other, or a scaled sliding layer's, is
    refused rather than built wrong. A config already flat is left as it is."""
    found = getattr(config, "rope_parameters", None)
    if not isinstance(found, dict) or "full_attention" not in found:
        return
    full, local = found["full_attention"], found.get("sliding_attention") or {}
    if full.get("rope_type", "default") not in GLOBAL_ROPE or local.get("rope_type", "default") != "default":
        raise NotImplementedError(f"Gemma 3 with {full.get('rope_type')} RoPE on its global layers and "
                                  f"{local.get('rope_type')} on its sliding ones: the builder here takes "
                                  f"{' or '.join(GLOBAL_ROPE)} on the global ones, default on the sliding ones")
    config.rope_parameters = dict(full)
    config.rope_theta = full["rope_theta"]
    config.rope_local_base_freq = local.get("rope_theta", config.rope_theta)


def _gemma3_local_caches_unscaled(model_class):
    """Gemma 3's sliding layers' cos/sin caches without the global layers' linear scaling, as transformers rotates
    them: the builder kept the global layers' factor for them (0.3 dB against eager where both layers slide,
    measured, with linear RoPE of factor 8 on the global layers). Its Gemma 3 makes the global caches, then names
    the local ones and makes them: a cache made once the local ones are named is theirs."""
    builders_caches = model_class.make_rotary_embedding_caches_from_scratch

    def make_rotary_embedding_caches_from_scratch(self):
        if type(self) is not model_class or getattr(self, "cos_cache_local_name", None) is None:
            return builders_caches(self)
        factor, self.rope_attrs["rescale_factors"] = self.rope_attrs["rescale_factors"], 1
        try:
            return builders_caches(self)
        finally:
            self.rope_attrs["rescale_factors"] = factor

    model_class.make_rotary_embedding_caches_from_scratch = make_rotary_embedding_caches_from_scratch


if __name__ == "__main__":
    main(sys.argv[1:])

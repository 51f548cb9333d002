"""lm_litertlm: a causal LM as a LiteRT-LM bundle (.litertlm), the file LiteRT-LM's engine loads on a phone: the
.tflite litert-torch's generative converter makes with the attention mask as an input of its signatures (as the
engine feeds it; otherwise as lm_litert makes it, quantized the same way), the recipe's tokenizer and the LLM
metadata (start and stop tokens, the context length), put together by litert-torch's own bundler
(`litertlm_builder.build_litertlm`, LiteRT-LM's builder underneath).

Reproducible: LiteRT-LM's builder stamps each bundle with a random uuid and the time; here the uuid is derived from
the model's and the tokenizer's bytes and the time is fixed at the epoch, so that the same inputs give the same
bytes (the rest of the file is already deterministic).
"""

import contextlib
import hashlib
import os
import tempfile
import uuid
from pathlib import Path

import torch

from mobilebuild.routes.litert.worker import litert, litertlm_runtime, lm_litert
from mobilebuild.worker import lm

EPOCH = "1970-01-01T00:00:00+00:00"


def run(inputs, config, output):
    model = lm.causal_lm(config.model, inputs["checkpoint"])
    lm_litert.check_mapped(model)
    tokenizer = Path(inputs["tokenizer"])
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as scratch:
        tflite = Path(scratch, "model.tflite")
        tflite.write_bytes(lm_litert.tflite_bytes(model, config, scratch, mask_as_input=True))
        bundled = bundle(tflite, tokenizer, model.config, config.max_context, scratch)
        data = bundled.read_bytes()
    generator = litertlm_runtime.generator(data, config)  # it runs on the host before it is written
    generator.forward(torch.zeros(1, min(config.prompt_lengths), dtype=torch.long), 0)
    with open(output, "wb") as handle:
        handle.write(data)


def bundle(tflite, tokenizer, model_config, max_context, scratch):
    """The .litertlm of `tflite` and `tokenizer` (a tokenizer.json or a SentencePiece model), its start and stop
    tokens the model configuration's."""
    with litert.converting():
        from litert_torch.generative.utilities import litertlm_builder

    out = Path(scratch, "bundle")
    out.mkdir()
    tokens = {"start_token_id": model_config.bos_token_id} if model_config.bos_token_id is not None else {}
    stop = model_config.eos_token_id
    if stop is not None:
        tokens["stop_token_ids"] = list(stop) if isinstance(stop, (list, tuple)) else [stop]
    which = "tokenizer_model_path" if tokenizer.suffix == ".model" else "hf_tokenizer_model_path"
    digest = hashlib.sha256(tflite.read_bytes() + tokenizer.read_bytes()).hexdigest()
    with _stamped(digest):
        litertlm_builder.build_litertlm(str(tflite), scratch, str(out), max_context, **{which: str(tokenizer)},
                                        **tokens)
    return out / f"{tflite.stem}.litertlm"


@contextlib.contextmanager
def _stamped(digest):
    """LiteRT-LM's builder's system metadata with a uuid from `digest` and the epoch as its creation time (its own
    populate_system_metadata draws a random uuid and reads the clock)."""
    from litert_lm_builder import litertlm_builder as builder

    own = builder.populate_system_metadata

    def reproducible(system_metadata):
        kept = [m for m in system_metadata if m.key not in ("uuid", "creation_timestamp")]
        return [*kept, builder.Metadata(key="uuid", value=str(uuid.UUID(digest[:32])), dtype=builder.DType.STRING),
                builder.Metadata(key="creation_timestamp", value=EPOCH, dtype=builder.DType.STRING)]

    builder.populate_system_metadata = reproducible
    try:
        yield
    finally:
        builder.populate_system_metadata = own

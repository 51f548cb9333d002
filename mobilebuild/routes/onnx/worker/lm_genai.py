"""lm_genai: a causal LM as onnxruntime-genai runs it: its model builder (`onnxruntime_genai.models.builder`, the
tool Microsoft publishes for this) makes the model folder from the checkpoint saved as a transformers folder, for
the CPU: model.onnx and its weights, genai_config.json, and the recipe's tokenizer.json with its configuration. The
folder is shipped as one zip (stored, sorted, no timestamps): an app unpacks it and opens it with
`onnxruntime_genai.Model(folder)`.

int8 and int4 are the builder's own quantization of the MatMul weights (int4 in blocks of generate.group_size).
genai_config.json's search.max_length is set to generate.max_context, the length the build verifies and times.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.onnx.worker import genai_builder, genai_runtime
from mobilebuild.worker import archive, failures, hub, lm, quiet

INT4_BLOCKS = (16, 32, 64, 128, 256)  # the builder's int4_block_size choices


def run(inputs, config, output):
    if config.precision == "int4" and config.group_size not in INT4_BLOCKS:
        raise MobileBuildError(f"onnxruntime-genai's builder takes int4 blocks of {', '.join(map(str, INT4_BLOCKS))}; "
                               f"got {config.group_size}", field="generate.group_size")
    model = lm.causal_lm(config.model, inputs["checkpoint"])
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as scratch:
        source, folder = Path(scratch, "transformers"), Path(scratch, "genai")
        with quiet.quiet():  # its "Writing model shards" progress bar
            model.save_pretrained(source)
        _save_tokenizer(inputs["tokenizer"], source)
        _build(source, folder, config, Path(scratch, "cache"))
        settings = json.loads((folder / "genai_config.json").read_text())
        settings["search"]["max_length"] = config.max_context
        (folder / "genai_config.json").write_text(json.dumps(settings, indent=4, sort_keys=True) + "\n")
        archive.write_folder(folder, output)
    genai_runtime.generator(output, config).forward(torch.zeros(1, 2, dtype=torch.long), 0)  # it loads and runs


def _save_tokenizer(path, folder):
    """The recipe's tokenizer.json as transformers saves a fast tokenizer (tokenizer.json and tokenizer_config.json),
    which the builder copies into the model folder for onnxruntime-genai's tokenizer."""
    from transformers import PreTrainedTokenizerFast

    with hub.quiet_transformers():
        PreTrainedTokenizerFast(tokenizer_file=str(path)).save_pretrained(folder)


def _build(source, folder, config, cache):
    """The builder's command line, as its README runs it (through genai_builder, which finds the LM head by
    identity), in a process of its own (its progress bars and prints kept out of the build's output); its failure
    is the library's: one line, its output in the node's log."""
    extra = [f"int4_block_size={config.group_size}"] if config.precision == "int4" else []
    if "sliding_attention" in (json.loads((source / "config.json").read_text()).get("layer_types") or []):
        # a windowed cache (the builder's default for sliding layers) makes the runtime refuse any max_length under
        # the window ("KV cache capacity (32) must be at least local_window_size (512)"): a whole-length cache for
        # every layer, as lm_onnx's
        extra.append("windowed_kv_cache=false")
    argv = [sys.executable, "-m", genai_builder.__name__, "-i", str(source), "-o", str(folder),
            "-p", config.precision, "-e", "cpu", "-c", str(cache), *(["--extra_options", *extra] if extra else [])]
    ran = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if ran.returncode != 0:
        last = next((line for line in reversed(ran.stderr.splitlines()) if line.strip()), "no output")
        raise failures.Failed({"raised_by": "onnxruntime-genai's model builder", "part": None,
                               "error": last.strip(), "traceback": f"$ {' '.join(argv)}\n{ran.stdout}\n{ran.stderr}"})


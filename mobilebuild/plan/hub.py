"""What a timm or transformers model says about its inputs, for the defaults a recipe leaves out: the token ids'
range from the vocabulary, an image's size.

The plan never imports torch (nor timm or transformers, which import it). A transformers configuration is JSON (the
recipe's `config`, a `pretrained` folder's config.json), read here. What only the library knows (a model type's
default vocabulary size, timm's pretrained input size) comes from a probe in a subprocess, `python -m
mobilebuild.worker.hub`, cached by content in .mobilebuild/model_facts.json: a recipe that gives its shapes and
ranges never runs it, and an unchanged one runs it once.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan.chain import HUB_SOURCES, SOURCE_KEYS, library_version

CACHE_FILE = ".mobilebuild/model_facts.json"
PROBE_TIMEOUT = 600
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # where the probe's interpreter finds mobilebuild

# transformers' input names whose values the model's configuration bounds (as worker/hub.py names them)
TOKEN_IDS = {"input_ids": "vocab_size", "decoder_input_ids": "vocab_size", "token_type_ids": "type_vocab_size"}
MASKS = ("attention_mask", "decoder_attention_mask")
# Masks default to all ones (nothing padded). Random 0/1 masks leave rows with nothing to attend to (a causal model's
# first token, whenever it is masked), whose outputs are undefined: eager and ONNX Runtime disagreed on them (tiny
# GPT-2, 41.6 dB, the other rows identical). The artifacts take any mask: the padding is the app's.
MASK_RANGE = (1, 2)
IMAGES = ("pixel_values",)


def library(model):
    """"timm", "transformers", or None for another source."""
    return next((key for key in HUB_SOURCES if key in model), None)


class Facts:
    """A hub model's facts ("vocab_size", "type_vocab_size", "image": [C, H, W]), each read when first asked for:
    from the configuration's JSON where it says it, else from the probe."""

    def __init__(self, model, root):
        self.model, self.root = model, Path(root)
        self.probed = None

    def get(self, key):
        written = self._written()
        if key in written:
            return written[key]
        if self.probed is None:
            self.probed = probe(self.model, self.root)
        if "error" in self.probed:
            raise MobileBuildError(self.probed["error"], field=self.probed.get("field") or "model")
        return self.probed.get(key)

    def _written(self):
        """The facts a transformers configuration states itself (vocab_size, type_vocab_size)."""
        if library(self.model) != "transformers":
            return {}
        config = {}
        if "pretrained" in self.model:
            try:
                config = json.loads((self.root / self.model["pretrained"] / "config.json").read_bytes())
            except (OSError, ValueError):
                config = {}
        config = {**config, **self.model.get("config", {})}
        return {key: config[key] for key in ("vocab_size", "type_vocab_size") if isinstance(config.get(key), int)}


def probe(model, root):
    """The worker's facts of the model (worker/hub.py `facts`), or {"error", "field"}; cached by the source, the
    library's version and a `pretrained` folder's config.json."""
    source = {key: model[key] for key in SOURCE_KEYS if key in model}
    digest = hashlib.sha256(json.dumps({"source": source, "library": library_version(library(model))},
                                       sort_keys=True).encode())
    if "pretrained" in model:
        try:
            digest.update((Path(root) / model["pretrained"] / "config.json").read_bytes())
        except OSError:
            pass
    key = digest.hexdigest()
    path = Path(root) / CACHE_FILE
    try:
        cached = json.loads(path.read_bytes())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    if key in cached:
        return cached[key]
    found = _run_probe(source, root)
    if not found.get("transient"):
        try:
            store.write_text(path, json.dumps({**cached, key: found}, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only checkout probes every time
    return found


def _run_probe(source, root):
    """The probe's answer; a probe that does not answer (killed, a crash) is a "transient" error, not cached."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, str(Path(root).resolve()),
                                                                     os.environ.get("PYTHONPATH")]))}
    try:
        result = subprocess.run([sys.executable, "-m", "mobilebuild.worker.hub", json.dumps({"source": source})],
                                cwd=root, capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return _transient(source, str(exc))
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return _transient(source, (result.stderr.strip().splitlines() or ["no answer"])[-1])


def _transient(source, why):
    return {"error": f"cannot read what the {library(source)} model says about its inputs: {why}", "field": "model",
            "transient": True}

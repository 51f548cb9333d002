"""Models from timm and Hugging Face transformers, the `timm:` and `transformers:` model sources: built from a name
or a configuration with random weights, or (transformers) from a local save_pretrained folder. Nothing is downloaded.

Also run by the plan as `python -m mobilebuild.worker.hub REQUEST` (plan/hub.py) for what a model says about its
inputs when a recipe leaves them out: the plan never imports torch, timm or transformers.
"""

import contextlib
import difflib
import inspect
import json
import logging
import os
import sys
import warnings

from mobilebuild.errors import MobileBuildError

# Before huggingface_hub reads them: a missing file is an error here, never a download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# transformers' names for token ids, their segments and their padding mask, and the facts their ranges come from
TOKEN_IDS = ("input_ids", "decoder_input_ids")
SEGMENT_IDS = ("token_type_ids",)
MASKS = ("attention_mask", "decoder_attention_mask")
IMAGES = ("pixel_values",)


def _first_line(exc, limit=300):
    """The library's own first line (modeling.first_line, which imports this module, shortens it further)."""
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "\u2026"


@contextlib.contextmanager
def quiet_transformers():
    """transformers with its advice off for the rest of the process (a bos_token_id outside a tiny vocabulary, newly
    initialised weights, a loss type at the first forward, its own deprecated attributes that tracing reads): not
    the build's business, and a flood in its output; and the warnings and torch's log lines (torchao's pytree
    registrations, imported by transformers) of building a model."""
    pytree = logging.getLogger("torch.utils._pytree")
    level = pytree.level
    pytree.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import transformers

            transformers.logging.set_verbosity_error()
            yield transformers
    finally:
        pytree.setLevel(level)
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")


def timm_model(name, kwargs):
    """timm.create_model(name, pretrained=False, **kwargs), or one line naming the closest names timm has."""
    import timm

    if not timm.is_model(name):
        closest = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f" (closest: {', '.join(closest)})" if closest else " (list them with timm.list_models())"
        raise MobileBuildError(f"timm has no model {name!r}{hint}", field="model.timm")
    if kwargs.get("pretrained"):
        raise MobileBuildError(PRETRAINED_REFUSED, field="model.kwargs.pretrained")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return timm.create_model(name, **{**kwargs, "pretrained": False})
        except Exception as exc:  # a kwarg the model does not take, a size it cannot make
            raise MobileBuildError(f"timm.create_model({name!r}, **kwargs) raised {type(exc).__name__}: "
                                   f"{_first_line(exc)}", field="model.timm") from None


PRETRAINED_REFUSED = ("nothing is downloaded at build time: leave pretrained out (random weights), or give the weights "
                      "as model.checkpoint")


def transformers_config(source):
    """The source's configuration: `config` (with its model_type) through AutoConfig.for_model, or the `pretrained`
    folder's config.json with `config`'s fields over it. Caches are off (use_cache=False) unless `config` turns them
    on: a single-pass model returns no cache object, which TorchScript, NNAPI and ExecuTorch cannot take."""
    with quiet_transformers() as transformers:
        fields = dict(source.get("config", {}))
        if "pretrained" in source:
            if not os.path.isfile(os.path.join(source["pretrained"], "config.json")):
                raise MobileBuildError(f"{source['pretrained']}/config.json is missing (in {os.getcwd()})",
                                       field="model.pretrained")
            try:
                config = transformers.AutoConfig.from_pretrained(source["pretrained"], local_files_only=True,
                                                                 **fields)
            except Exception as exc:  # an unreadable or unknown config.json
                raise MobileBuildError(f"cannot read {source['pretrained']}/config.json: {type(exc).__name__}: "
                                       f"{_first_line(exc)}", field="model.pretrained") from None
        else:
            model_type = fields.pop("model_type", None)
            known = transformers.CONFIG_MAPPING.keys()
            if model_type not in known:
                closest = difflib.get_close_matches(str(model_type), list(known), n=3)
                hint = f" (closest: {', '.join(closest)})" if closest else ""
                raise MobileBuildError(f"transformers has no model_type {model_type!r}{hint}",
                                       field="model.config.model_type")
            try:
                config = transformers.AutoConfig.for_model(model_type, **fields)
            except Exception as exc:
                raise MobileBuildError(f"AutoConfig.for_model({model_type!r}, ...) raised {type(exc).__name__}: "
                                       f"{_first_line(exc)}", field="model.config") from None
    if "use_cache" not in source.get("config", {}):
        for holder in _configs(config):
            if hasattr(holder, "use_cache"):
                holder.use_cache = False
    return config


def single_pass(model):
    """Turn off the cache of a transformers model built elsewhere (a factory's, timm's): its single pass then returns
    no cache object, as a `transformers:` source's does (transformers_config). True where one was on and forward
    takes use_cache (an encoder's configuration may have it on, to no effect)."""
    config = getattr(model, "config", None)
    holders = [holder for holder in (_configs(config) if config is not None else ())
               if getattr(holder, "use_cache", False) is True]
    for holder in holders:
        holder.use_cache = False
    return bool(holders) and "use_cache" in inspect.signature(model.forward).parameters


def _configs(config):
    """A configuration and the text or decoder configuration inside it (an encoder-decoder's, a multimodal one's)."""
    found = [config]
    try:
        text = config.get_text_config(decoder=True)
    except (AttributeError, TypeError, ValueError):
        text = None
    if text is not None and text is not config:
        found.append(text)
    return found


def transformers_class(name):
    """A transformers model class by name (AutoModel..., BertModel), or a pipeline task's (text-classification)."""
    with quiet_transformers() as transformers:
        try:
            found = getattr(transformers, name)
        except Exception:  # the lazy module raises AttributeError, or a missing backend's error
            found = None
        if found is None:
            from transformers.pipelines import SUPPORTED_TASKS, TASK_ALIASES

            task = SUPPORTED_TASKS.get(TASK_ALIASES.get(name, name))
            classes = (task or {}).get("pt") or ()
            found = classes[0] if classes else None
            if found is None:
                autos = [item for item in dir(transformers) if item.startswith("AutoModel")]
                closest = difflib.get_close_matches(name, autos + sorted(SUPPORTED_TASKS), n=3)
                hint = f" (closest: {', '.join(closest)})" if closest else ""
                raise MobileBuildError(f"transformers has no model class or task {name!r}{hint}",
                                       field="model.transformers")
    if not (hasattr(found, "from_config") or hasattr(found, "_from_config")):
        raise MobileBuildError(f"transformers.{name} is not a model class (it has no from_config)",
                               field="model.transformers")
    return found


def transformers_model(source, weights=True):
    """The model: from its configuration with random weights, or from the `pretrained` folder's safetensors
    (`weights`; else the folder's configuration alone: the caller loads weights of its own)."""
    cls = transformers_class(source["transformers"])
    config = transformers_config(source)
    kwargs = dict(source.get("kwargs", {}))
    with quiet_transformers():
        try:
            if "pretrained" in source and weights:
                model = cls.from_pretrained(source["pretrained"], config=config, local_files_only=True,
                                            use_safetensors=True, **kwargs)
            else:
                build = getattr(cls, "from_config", None) or cls._from_config
                model = build(config, **kwargs)
        except MobileBuildError:
            raise
        except Exception as exc:
            raise MobileBuildError(f"transformers.{source['transformers']} cannot build the model: "
                                   f"{type(exc).__name__}: {_first_line(exc)}", field="model.transformers") from None
        if any(getattr(holder, "use_cache", False) for holder in _configs(config)):
            # the cache it returns flattens into tensors for torch.export (ExecuTorch, the dynamo ONNX exporter) and
            # for verification (worker.outputs.leaves), by transformers' own registration
            from transformers.integrations.executorch import register_dynamic_cache_export_support

            register_dynamic_cache_export_support()
    return model


def plain_outputs(output):
    """A transformers output class (a dict subclass, fields that are None left out) as a plain dict of its fields:
    every route takes a dict, and each output is named after its field (logits, last_hidden_state)."""
    if isinstance(output, dict):
        return {key: value for key, value in output.items() if value is not None}
    return output


# --- what a model says about its inputs (the plan's probe) --------------------------------------------------------

def facts(source):
    """{"image": [C, H, W]} where the model says its image size, {"vocab_size", "type_vocab_size"} where its
    configuration has them. timm: the pretrained configuration's input_size (in_chans and img_size of kwargs over
    it), read from the model built on the meta device; transformers: its configuration alone."""
    if "timm" in source:
        import torch

        kwargs = dict(source.get("kwargs", {}))
        with torch.device("meta"):
            model = timm_model(source["timm"], kwargs)
        size = list((getattr(model, "pretrained_cfg", None) or {}).get("input_size") or ())
        if len(size) != 3:
            return {}
        if "in_chans" in kwargs:
            size[0] = kwargs["in_chans"]
        if "img_size" in kwargs:
            image = kwargs["img_size"]
            size[1:] = list(image) if isinstance(image, (list, tuple)) else [image, image]
        return {"image": size}
    config = transformers_config(source)
    text = _configs(config)[-1]
    found = {key: getattr(holder, key) for holder in (text, config) for key in ("vocab_size", "type_vocab_size")
             if isinstance(getattr(holder, key, None), int)}
    vision = getattr(config, "vision_config", None) or config
    image = getattr(vision, "image_size", None)
    if image is not None:
        image = list(image) if isinstance(image, (list, tuple)) else [image, image]
        found["image"] = [getattr(vision, "num_channels", 3), *image]
    return found


def main(request):
    """Print the facts of `request["source"]` as one JSON line, or {"error", "field"}: a model that cannot be made."""
    logging.disable(logging.WARNING)  # torch's and torchao's import-time notes
    try:
        found = facts(request["source"])
    except MobileBuildError as exc:
        found = {"error": exc.message, "field": exc.field}
    except ImportError as exc:
        found = {"error": f"cannot import {exc.name or 'the library'}: {exc}; install it beside torch",
                 "field": "model"}
    print(json.dumps(found))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

"""Recipe files: YAML in, validated against recipe.schema.json, defaults applied, paths resolved.

Everything here is plain data; nothing imports torch.
"""

import copy
import difflib
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mobilebuild import store
from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import arm64, hub, routes
from mobilebuild.plan.chain import escaping, files_below, library_version
from mobilebuild.plan.settings import MODEL_LIBRARY_EXTRA, Fusion

SCHEMA_PATH = Path(__file__).parents[1] / "recipe.schema.json"  # at the package's top: editors point at it
CACHE_FILE = ".mobilebuild/recipes.json"
RECIPE_DIR = "recipes"
RECIPE_SUFFIXES = (".yaml", ".yml")
EXTRA_RECIPES_VARIABLE = "MOBILEBUILD_EXTRA_RECIPES"  # more recipe files to plan, outside recipes/
# `mobilebuild tune` writes the recipe of its candidates here (ignored scratch), named as the user's plus TUNE_SUFFIX
# (recipe names take letters, digits, '_' and '.'); `doit clean` removes them and what they built
TUNE_DIR = ".mobilebuild/tune"
TUNE_SUFFIX = ".tune"
# Bumped when parsing accepts less than before, so recipes validated by an older rule are checked again.
PARSE_RULES = b"2: duplicate keys refused"


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The safe loader, refusing a key given twice in one mapping: YAML's own last-one-wins would silently drop the
    first (two `targets:` lists, one of them ignored)."""


def _mapping_without_duplicates(loader, node):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` keys may be overridden: that is its purpose
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: construct_yaml_map reports it
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    yield from loader.construct_yaml_map(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


@dataclass(frozen=True)
class Target:
    id: str
    backend: str
    runtime: str
    optimize: dict
    index: int  # position in `targets`, for error messages
    prune: object = False  # this target's pruning: the recipe's unless it has its own
    quantize: dict = field(default_factory=dict)  # the recipe's quantize, with this target's settings merged in
    precision: str | None = None
    toolchain: str | None = None  # another interpreter, as the recipe names it (see toolchain.py)
    settings: dict = field(default_factory=dict)  # the routes' own sections (`nnapi:`, `executorch:`, `onnx:`)


@dataclass(frozen=True)
class Recipe:
    name: str
    file: str  # relative to the repository root, POSIX
    sha256: str
    model: dict  # the recipe's `model:` (model_source keeps what the stages read: settings.ModelSource)
    inputs: list  # each input's spec (see input_specs): name, shape at the example size, dtype, dynamic dims
    fuse: Fusion
    prune: object
    quantize: dict
    script: str
    verify: dict
    benchmark: dict
    targets: tuple = field(default_factory=tuple)
    outputs: list | None = None  # names for the output tensors, in flattening order
    limits: dict = field(default_factory=dict)  # seconds a stage may run, by kind: stage_seconds, layers_seconds
    generate: dict | None = None  # a decoder-only language model's generation settings (plan/generation.py)


def schema():
    """recipe.schema.json, with the backends, runtimes and target sections of the registered routes."""
    return _schema(tuple(route.key for route in routes.all_routes()))


def default_thresholds(precision):
    """The verification thresholds a recipe gets for `precision` when it sets none: the schema's defaults."""
    levels = schema()["properties"]["verify"]["properties"]["thresholds"]["properties"]
    return {name: spec["default"] for name, spec in levels[precision]["properties"].items()}


@functools.lru_cache(maxsize=None)
def _schema(route_keys):
    return registry_schema(json.loads(SCHEMA_PATH.read_bytes()))


def registry_schema(grammar):
    """The recipe grammar with what the registry gives it: the backends, runtimes and precisions of the registered
    routes, each route family's own target section, the emulated ARM CPU models. recipe.schema.json is this for the
    built-in families (`mobilebuild schema --write` writes it; a test fails when it drifts), so that an editor
    knows every target; a project's own routes join at load time."""
    found = copy.deepcopy(grammar)
    target = found["properties"]["targets"]["items"]["properties"]
    target["backend"]["enum"] = list(routes.backends())
    target["runtime"]["enum"] = list(routes.runtimes())
    target["precision"]["enum"] = list(routes.precisions())
    for route in routes.all_routes():
        if route.section:
            target[route.section.name] = route.section.schema or {"type": "object", "default": {}}
    cpus = found["properties"]["verify"]["properties"]["arm64"]["oneOf"][1]["properties"]["cpus"]
    cpus["items"]["enum"], cpus["default"] = list(arm64.CPUS), list(arm64.DEFAULT_CPUS)
    return found


def schema_text():
    """recipe.schema.json as the registry makes it."""
    return json.dumps(registry_schema(json.loads(SCHEMA_PATH.read_bytes())), indent=2, ensure_ascii=False) + "\n"


@functools.lru_cache(maxsize=None)
def _schema_digest(route_keys):
    return hashlib.sha256(json.dumps(_schema(route_keys), sort_keys=True).encode()).digest()


def _validator():
    return _compiled_validator(tuple(route.key for route in routes.all_routes()))


@functools.lru_cache(maxsize=None)
def _compiled_validator(route_keys):
    import jsonschema  # imported on first use: it is the slowest import of task loading

    return jsonschema.Draft202012Validator(_schema(route_keys))


def field_path(parts):
    """['targets', 1, 'backend'] -> 'targets[1].backend'."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _did_you_mean(given, known, show, which):
    """'; did you mean 'optimize'?' for a misspelling of one of `known` (difflib's closest match), else ''."""
    if not isinstance(given, str):
        return ""
    close = difflib.get_close_matches(given, [str(name) for name in known], n=1)
    return f"; did you mean {show(close[0])}{which}?" if close else ""


def _describe(error):
    """One line saying what was expected, in the user's terms rather than JSON Schema's."""
    kind, expected = error.validator, error.validator_value
    if kind == "enum":
        return (f"expected one of {', '.join(map(json.dumps, expected))}, got {json.dumps(error.instance)}"
                + _did_you_mean(error.instance, expected, json.dumps, ""))
    if kind == "const":
        return f"expected {json.dumps(expected)}, got {json.dumps(error.instance)}"
    if kind == "type":
        return f"expected {expected}, got {type(error.instance).__name__} {json.dumps(error.instance, default=str)}"
    if kind == "required":
        missing = [key for key in expected if key not in error.instance]
        return f"missing required key {', '.join(map(repr, missing))}"
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed))
        guesses = "".join(_did_you_mean(key, allowed, repr, f" for {key!r}" if len(unknown) > 1 else "")
                          for key in unknown)
        return f"unknown key {', '.join(map(repr, unknown))} (allowed: {', '.join(allowed)}){guesses}"
    if kind == "pattern":
        return f"expected a value matching {expected}, got {json.dumps(error.instance)}"
    if kind == "oneOf" and error.schema is schema()["properties"]["model"]:
        return "expected exactly one model source: 'torchvision', 'factory', 'timm' or 'transformers'"
    if kind == "dependentRequired":
        given = [key for key in expected if key in error.instance]
        return (f"{' and '.join(map(repr, given))}: {'settings' if len(given) > 1 else 'a setting'} of a transformers "
                "model (model.transformers), not of this source")
    if kind == "not" and error.schema is schema()["properties"]["model"]:
        return "'checkpoint' and 'train' are exclusive: the weights come from one of them"
    if kind == "oneOf" and error.schema is schema()["$defs"]["tensor"]["properties"]["distribution"]:
        return "expected {normal: {mean: M, std: S}} or {uniform: {low: L, high: H}}"
    if kind == "oneOf" and error.schema is schema()["$defs"]["tensor"]["properties"]["shape"]["items"]:
        return f"expected a size (an integer of at least 1) or a dim name from dims, got {json.dumps(error.instance)}"
    if kind == "not" and error.schema is schema():
        return ONE_OF_INPUTS
    if kind == "oneOf" and error.schema is schema()["properties"]["fuse"]:
        return "expected 'auto', false, or a list of module-name lists like [[conv, bn, relu]]"
    return error.message


ONE_OF_INPUTS = "expected exactly one of 'input' (the one-input shorthand) or 'inputs' (a list of named inputs)"


def _line_column(mark):
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _character_at(text, mark):
    lines = (text.decode("utf-8", "replace") if isinstance(text, bytes) else text).splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    return line[mark.column] if mark.column < len(line) else ""


def _yaml_problem(exc, text):
    """(where, what) for a YAML error: its line and column, and for an unclosed bracket or quote, where it opened."""
    if isinstance(exc, yaml.reader.ReaderError):  # bytes that are not UTF-8 text, or a control character
        before = (text if isinstance(text, bytes) else text.encode())[:exc.position]  # position: a byte offset
        line_start = before.rfind(b"\n") + 1
        line = before.count(b"\n") + 1
        where = f"line {line}, column {len(before) - line_start + 1}"
        if "UTF" in exc.reason:
            return where, f"not UTF-8 text ({exc.reason}); save the recipe as UTF-8"
        return where, f"unacceptable character #x{exc.character:04x}: {exc.reason}"
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark and _character_at(text, mark) == "\t":
        problem = "found a tab; YAML indents with spaces only"
    context, opened = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and opened and mark and opened.line != mark.line:
        problem += f" ({context} at {_line_column(opened)})"
    return (_line_column(mark) if mark else "YAML"), problem


def _apply_defaults(node_schema, instance):
    """Fill in the schema's declared defaults, so the schema stays the one source of truth for them."""
    if node_schema.get("$ref", "").startswith("#/$defs/"):  # a shared definition (a target's own `quantize`
        # refers to the recipe's, and must not get defaults: it is merged over the recipe's own)
        node_schema = schema()["$defs"][node_schema["$ref"].removeprefix("#/$defs/")]
    for part in node_schema.get("allOf", ()):
        _apply_defaults(part, instance)
    if not isinstance(instance, dict):
        if isinstance(instance, list) and "items" in node_schema:
            for item in instance:
                _apply_defaults(node_schema["items"], item)
        return
    for key, sub in node_schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _apply_defaults(sub, instance[key])


def parse(text, file):
    """YAML text -> validated dict with defaults. Raises RecipeErrors listing every problem."""
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        where, problem = _yaml_problem(exc, text)
        raise RecipeErrors([MobileBuildError(f"invalid YAML: {problem}", file=file, field=where)]) from None
    if not isinstance(data, dict):
        raise RecipeErrors([MobileBuildError("expected a mapping with name, model, input (or inputs) and targets",
                                             file=file)])
    errors = sorted(_validator().iter_errors(data), key=lambda e: (list(map(str, e.absolute_path)), e.validator))
    if errors:
        # JSON Schema reports each missing required key on its own, and _describe names them all in each: one line
        lines = [MobileBuildError(_describe(e), file=file, field=field_path(e.absolute_path) or "(top level)")
                 for e in errors]
        model = data.get("model")
        if "input" not in data and "inputs" not in data and "generate" not in data and not (
                isinstance(model, dict) and "timm" in model):
            # said with the schema's problems, as before timm models could leave their input out (checked after it)
            lines.insert(0, MobileBuildError(ONE_OF_INPUTS, file=file, field="(top level)"))
        raise RecipeErrors({str(line): line for line in lines}.values())
    _apply_defaults(schema(), data)
    return data


class ParseCache:
    """Validated recipes by content: an up-to-date run neither parses YAML nor imports jsonschema again.

    Keyed by the hash of the schema and the recipe's bytes, so any change to either validates afresh; entries not
    used by the latest load are dropped.
    """

    def __init__(self, root):
        self.path = Path(root) / CACHE_FILE
        try:
            self.entries = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            self.entries = {}
        self.used = {}

    def parse(self, raw, file):
        routes_now = tuple(route.key for route in routes.all_routes())
        key = hashlib.sha256(_schema_digest(routes_now) + b"\0" + PARSE_RULES + b"\0" + raw).hexdigest()
        data = self.entries.get(key)
        if data is None:
            data = parse(raw, file)
        self.used[key] = data
        return copy.deepcopy(data)  # callers resolve paths in place

    def save(self):
        if self.used.keys() != self.entries.keys():
            try:
                store.write_text(self.path, json.dumps(self.used))
            except OSError:
                pass  # a read-only checkout still builds; it only validates every time


def _repo_path(value, recipe_file, root, where, must_exist=True, kind="file"):
    """Resolve a recipe-relative path; it must stay inside the repository (symlinks included) and be a `kind`
    ("file" or "folder")."""
    candidate = Path(value)
    if candidate.is_absolute():
        raise MobileBuildError(f"expected a path relative to the recipe, got absolute path {value!r}",
                               file=recipe_file, field=where)
    resolved = ((root / recipe_file).parent / candidate).resolve()
    try:
        relative = resolved.relative_to(root.resolve())
    except ValueError:
        raise MobileBuildError(f"path {value!r} leaves the repository", file=recipe_file, field=where) from None
    if must_exist and not resolved.exists():
        raise MobileBuildError(f"{value!r} does not exist", file=recipe_file, field=where)
    if must_exist and resolved.is_dir() != (kind == "folder"):
        found, expected = ("a folder", "a file") if resolved.is_dir() else ("a file", "a folder")
        raise MobileBuildError(f"{value!r} is {found}, expected {expected}", file=recipe_file, field=where)
    return relative.as_posix()


def _resolve_quantize(quantize, file, root, where, problems, shape):
    """The paths a quantize section itself names (a QAT checkpoint, a calibration folder), resolved in place; and
    image normalisation with one value per input channel (else it fails half-way through calibration)."""
    calibration = quantize.get("calibration", {})
    channels = shape[1] if len(shape) > 1 else None
    for key in ("mean", "std"):
        if key in calibration and channels is not None and len(calibration[key]) != channels:
            problems.append(MobileBuildError(
                f"expected {channels} values (one per input channel, input.shape[1]), got {len(calibration[key])}",
                file=file, field=f"{where}.calibration.{key}"))
    for holder, key, where_exactly, kind in (
            (quantize, "checkpoint", f"{where}.checkpoint", "file"),
            (quantize.get("calibration", {}), "path", f"{where}.calibration.path", "folder")):
        if key in holder:
            try:
                holder[key] = _repo_path(holder[key], file, root, where_exactly, kind=kind)
            except MobileBuildError as exc:
                problems.append(exc)


INTEGER_DTYPES = ("int64", "int32", "uint8")
FLOAT_DTYPES = ("float32", "float16")


SHAPE_EXAMPLE_FLOOR = 2  # torch.export specialises a dimension whose example size is 0 or 1


def input_specs(data, file, problems):
    """The recipe's inputs as the stages take them: `inputs`, or `input` as a list of one named "input". Each spec
    has its shape at the example sizes, and for each dynamic dimension {axis, dim, min, max} under "dynamic", so a
    spec alone says everything about its tensor. Problems the schema cannot see are appended to `problems`."""
    listed = data.get("inputs")
    where = (lambda index: f"inputs[{index}]") if listed else (lambda index: "input")
    listed = listed or [{"name": "input", **data["input"]}]
    dims, used, seen = data.get("dims", {}), set(), {}
    for name, dim in dims.items():
        dim.setdefault("example", max(dim["min"], min(SHAPE_EXAMPLE_FLOOR, dim["max"])))
        if not dim["min"] < dim["max"]:
            problems.append(MobileBuildError(f"expected min < max, got min {dim['min']} and max {dim['max']} (a size "
                                             "that never changes is a number in the shape)", file=file,
                                             field=f"dims.{name}"))
        elif not dim["min"] <= dim["example"] <= dim["max"]:
            problems.append(MobileBuildError(f"example {dim['example']} lies outside [{dim['min']}, {dim['max']}]",
                                             file=file, field=f"dims.{name}.example"))
    specs = []
    for index, entry in enumerate(listed):
        spec = {"name": entry.get("name", "input"), **entry}
        if spec["name"] in seen:
            problems.append(MobileBuildError(
                f"duplicate input name {spec['name']!r} (also inputs[{seen[spec['name']]}])", file=file,
                field=f"{where(index)}.name"))
        seen[spec["name"]] = index
        problems.extend(input_problems(spec, file, where(index)))
        if spec["memory_format"] == "channels_last" and len(spec["shape"]) != 4:
            problems.append(MobileBuildError(
                f"channels_last is a layout of 4-D inputs (N, C, H, W); this one has {len(spec['shape'])} "
                "dimension(s): leave it contiguous", file=file, field=f"{where(index)}.memory_format"))
        dynamic, shape = [], []
        for axis, size in enumerate(spec["shape"]):
            if isinstance(size, int):
                shape.append(size)
                continue
            if size not in dims:
                problems.append(MobileBuildError(
                    f"{size!r} is not a dim declared under dims ({', '.join(dims) or 'none declared'}): declare it "
                    f"as dims: {{{size}: {{min: M, max: N}}}}", file=file, field=f"{where(index)}.shape[{axis}]"))
                shape.append(1)
                continue
            used.add(size)
            shape.append(dims[size]["example"])
            dynamic.append({"axis": axis, "dim": size, "min": dims[size]["min"], "max": dims[size]["max"]})
        spec["shape"] = shape
        if dynamic:
            spec["dynamic"] = dynamic
        specs.append(spec)
    for name in dims:
        if name not in used:
            problems.append(MobileBuildError("no input shape names this dim: use it in a shape, or remove it",
                                             file=file, field=f"dims.{name}"))
    return specs


def input_problems(spec, file, where):
    """What the schema cannot say about an input: an integer one needs the range of its values (token ids must stay
    below the vocabulary), a float one draws from a distribution, and neither takes the other's."""
    def problem(field, message):
        return MobileBuildError(message, file=file, field=f"{where}.{field}")

    dtype, found = spec["dtype"], []
    if "range" in spec:
        low, high = spec["range"]
        if dtype not in INTEGER_DTYPES:
            found.append(problem("range", f"only integer inputs take a range of values; a {dtype} input takes a "
                                          "distribution (or nothing: normal(0, 1))"))
        elif low >= high:
            found.append(problem("range", f"expected [low, high) with low < high, got [{low}, {high}]"))
        elif dtype == "uint8" and not 0 <= low < high <= 256:
            found.append(problem("range", f"uint8 values lie in [0, 256), got [{low}, {high})"))
    elif dtype in ("int64", "int32"):
        found.append(problem("range", f"an {dtype} input needs the range its values are drawn from, [low, high) with "
                                      "high excluded (token ids: [0, vocabulary size))"))
    distribution = spec.get("distribution")
    if distribution is not None and dtype not in FLOAT_DTYPES:
        found.append(problem("distribution", f"only float inputs take a distribution; a {dtype} input takes a range"))
    uniform = (distribution or {}).get("uniform")
    if uniform and not uniform.get("low", 0.0) < uniform.get("high", 1.0):
        found.append(problem("distribution.uniform", f"expected low < high, got low {uniform.get('low', 0.0)} and "
                                                     f"high {uniform.get('high', 1.0)}"))
    return found


def _hub_problems(model, file, root):
    """A timm or transformers source's checks: nothing downloaded (kwargs.pretrained refused), a configuration
    with its model_type, or a `pretrained` folder inside the repository with config.json and safetensors weights
    (resolved in place). Its files are inputs of the build (chain.model_files)."""
    def problem(field, message):
        return MobileBuildError(message, file=file, field=field)

    source = hub.library(model)
    if source is None:
        return []
    if library_version(source) is None:  # before its probe, which imports it
        return [problem(f"model.{source}", f"{source} is not installed here: pip install "
                                           f"'mobilebuild[{MODEL_LIBRARY_EXTRA}]'")]
    if model.get("kwargs", {}).get("pretrained"):
        return [problem("model.kwargs.pretrained", "nothing is downloaded at build time: leave pretrained out (random "
                                                   "weights), or give the weights as model.checkpoint" +
                        (" or a save_pretrained folder as model.pretrained" if source == "transformers" else ""))]
    if source == "timm":
        return []
    if "pretrained" not in model:
        if not isinstance(model.get("config", {}).get("model_type"), str):
            return [problem("model.config.model_type", "a transformers model is built from its configuration: give "
                                                       "its model_type (bert, gpt2, vit...) and fields, or a "
                                                       "save_pretrained folder as model.pretrained")]
        return []
    try:
        model["pretrained"] = _repo_path(model["pretrained"], file, root, "model.pretrained", kind="folder")
    except MobileBuildError as exc:
        return [exc]
    files, links = files_below(model["pretrained"], root)
    names = {name.rsplit("/", 1)[-1] for name in files}
    outside = escaping(links, root)
    if outside:
        return [problem("model.pretrained", f"{outside[0]} leaves the repository (a symlink); a model "
                                            "folder's files must stay inside it")]
    if "config.json" not in names:
        return [problem("model.pretrained", f"{model['pretrained']} holds no config.json: give a folder written by "
                                            "save_pretrained")]
    if not any(name.endswith(".safetensors") for name in names):
        return [problem("model.pretrained", f"{model['pretrained']} holds no .safetensors weights (pickled "
                                            "pytorch_model.bin files are not loaded: they can carry code): save them "
                                            "with save_pretrained(folder, safe_serialization=True)")]
    return []


def _input_defaults(data, file, root):
    """The inputs' shapes and value ranges a recipe leaves out, from the model where it says them (plan/hub.py): a
    timm model's image size (its one input may be left out), a transformers model's pixel_values size, the range of
    its input_ids and token_type_ids ([0, its vocabulary's size)) and attention_mask (all ones). Filled in place; the
    problems where the model does not say them (a missing shape)."""
    model, found = data["model"], []
    source = hub.library(model)
    if "input" not in data and "inputs" not in data:
        if source != "timm":
            return [MobileBuildError(ONE_OF_INPUTS, file=file, field="(top level)")]
        data["input"] = {}
        _apply_defaults(schema()["properties"]["input"], data["input"])
    listed = data.get("inputs") or [data["input"]]
    facts = hub.Facts(model, root)
    for index, entry in enumerate(listed):
        where = f"inputs[{index}]" if "inputs" in data else "input"
        name = entry.get("name", "input")
        try:
            if "shape" not in entry:
                image = facts.get("image") if source == "timm" or (source and name in hub.IMAGES) else None
                if image is None:
                    found.append(MobileBuildError("missing required key 'shape'", file=file, field=where))
                    continue
                entry["shape"] = [1, *image]
            if source != "transformers" or "range" in entry or entry["dtype"] not in ("int64", "int32"):
                continue
            if name in hub.MASKS:
                entry["range"] = list(hub.MASK_RANGE)
            elif name in hub.TOKEN_IDS and facts.get(hub.TOKEN_IDS[name]):
                entry["range"] = [0, facts.get(hub.TOKEN_IDS[name])]
        except MobileBuildError as exc:
            return [MobileBuildError(exc.message, file=file, field=exc.field)]
    return found


FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*")  # package.module:function
TOKENIZER_FILES = (".json", ".model")  # tokenizers' tokenizer.json, a SentencePiece model


def _resolve_generate(generate, file, root, problems):
    """A language model's files, resolved in place: its tokenizer, and held-out text given as a file (which only a
    tokenizer can read)."""
    if generate is None:
        return
    try:
        if "tokenizer" in generate:
            generate["tokenizer"] = _repo_path(generate["tokenizer"], file, root, "generate.tokenizer")
            if not generate["tokenizer"].endswith(TOKENIZER_FILES):
                raise MobileBuildError(f"expected a tokenizers tokenizer.json or a SentencePiece .model, got "
                                       f"{generate['tokenizer']!r}", file=file, field="generate.tokenizer")
        text = generate.get("text")
        if text is not None and not FUNCTION.fullmatch(text):
            generate["text"] = _repo_path(text, file, root, "generate.text")
            if "tokenizer" not in generate:
                raise MobileBuildError("a text file needs a tokenizer to encode it: name the model's in "
                                       "generate.tokenizer (or make generate.text a package.module:function returning "
                                       "token ids)", file=file, field="generate.text")
    except MobileBuildError as exc:
        problems.append(exc)


def _generation_input(data, file):
    """A language model's one input, input_ids [1, 1], where the recipe leaves it out (its range
    then comes from the vocabulary: _input_defaults); the problems of `generate:` the schema cannot see."""
    generate = data.get("generate")
    if generate is None:
        return []
    longest, context = max(generate["prompt_lengths"]), generate["max_context"]
    if longest + generate["new_tokens"] > context:
        return [MobileBuildError(f"the longest prompt ({longest}) and new_tokens ({generate['new_tokens']}) exceed "
                                 f"max_context ({context}), the KV cache's length: raise max_context or shorten them",
                                 file=file, field="generate.max_context")]
    if generate["group_size"] & (generate["group_size"] - 1):
        return [MobileBuildError(f"expected a power of two, got {generate['group_size']}", file=file,
                                 field="generate.group_size")]
    if "input" not in data and "inputs" not in data:
        if "transformers" not in data["model"]:
            return [MobileBuildError("give the token ids' input (inputs: [{name: input_ids, shape: [1, N], dtype: "
                                     "int64, range: [0, vocabulary size]}]): only a transformers source says its "
                                     "vocabulary", file=file, field="inputs")]
        # one token: the checkpoint's check of the model; prompt lengths are the LM stages' own settings, and
        # changing them must not retrain
        data["inputs"] = [{"name": "input_ids", "shape": [1, 1], "dtype": "int64"}]
        _apply_defaults(schema()["properties"]["inputs"], data["inputs"])
    return []


def _prune_with_defaults(prune):
    if prune is False:
        return False
    prune = dict(prune)
    _apply_defaults(schema()["properties"]["prune"]["oneOf"][1], prune)
    return prune


def _route_sections():
    return {route.settings for route in routes.all_routes() if route.settings}


def _target_id(target):
    if "name" in target:
        return target["name"]
    runtime = target.get("runtime")
    return target["backend"] if runtime is None else f"{target['backend']}-{runtime}"


def load(path, root, cache=None):
    """Read, validate and resolve one recipe file. `path` may be absolute or relative to `root`."""
    root = Path(root)
    path = Path(path)
    full = path if path.is_absolute() else root / path
    try:
        file = full.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        file = str(path)
    try:
        raw = full.read_bytes()
    except OSError as exc:
        raise RecipeErrors([MobileBuildError(f"cannot read recipe: {exc.strerror}", file=file)]) from None
    data = cache.parse(raw, file) if cache else parse(raw, file)

    problems = []
    model = data["model"]
    if "checkpoint" in model:
        try:
            model["checkpoint"] = _repo_path(model["checkpoint"], file, root, "model.checkpoint")
        except MobileBuildError as exc:
            problems.append(exc)
    _resolve_generate(data.get("generate"), file, root, problems)
    stopping = _hub_problems(model, file, root) or _generation_input(data, file)
    stopping = stopping or _input_defaults(data, file, root)
    if stopping:  # without a source it can read, or a shape for each input, there is nothing more to check
        raise RecipeErrors(problems + stopping)
    inputs = input_specs(data, file, problems)
    image_shape = inputs[0]["shape"] if len(inputs) == 1 else []
    _resolve_quantize(data["quantize"], file, root, "quantize", problems, image_shape)
    recipe_prune = _prune_with_defaults(data["prune"])

    targets, seen = [], {}
    for index, entry in enumerate(data["targets"]):
        target_id = _target_id(entry)
        if target_id in seen:
            problems.append(MobileBuildError(
                f"duplicate target id {target_id!r} (also targets[{seen[target_id]}]); give one a distinct 'name'",
                file=file, field=f"targets[{index}]"))
        seen[target_id] = index
        quantize = data["quantize"]
        if "quantize" in entry:
            _resolve_quantize(entry["quantize"], file, root, f"targets[{index}].quantize", problems, image_shape)
            quantize = {**data["quantize"], **entry["quantize"]}
            _apply_defaults(schema()["properties"]["quantize"], quantize)
        targets.append(Target(id=target_id, backend=entry["backend"], runtime=entry.get("runtime"),
                              optimize=entry["optimize"], index=index, quantize=quantize,
                              prune=_prune_with_defaults(entry["prune"]) if "prune" in entry else recipe_prune,
                              precision=entry.get("precision"), toolchain=entry.get("toolchain"),
                              settings={key: entry[key] for key in _route_sections() if key in entry}))
    if problems:
        raise RecipeErrors(problems)

    return Recipe(
        name=data["name"], file=file, sha256=hashlib.sha256(raw).hexdigest(), model=model,
        inputs=inputs, fuse=data["fuse"], prune=recipe_prune, quantize=data["quantize"], script=data["script"],
        verify=data["verify"], benchmark=data["benchmark"], targets=tuple(targets),
        outputs=data.get("outputs"), limits=data["limits"], generate=data.get("generate"),
    )


def recipe_files(directory):
    """Every recipe file below `directory`, at any depth, in a stable order."""
    return sorted(p for p in Path(directory).rglob("*") if p.suffix in RECIPE_SUFFIXES and p.is_file())


def discover(root):
    """Every recipe file below `root/recipes`, then those $MOBILEBUILD_EXTRA_RECIPES names (set by `mobilebuild tune`
    for the recipe of its candidates, which lives outside recipes/)."""
    return recipe_files(Path(root) / RECIPE_DIR) + extra_recipes(root)


def extra_recipes(root):
    """The recipe files named by $MOBILEBUILD_EXTRA_RECIPES (os.pathsep-separated, relative to `root`) that exist."""
    named = os.environ.get(EXTRA_RECIPES_VARIABLE, "").split(os.pathsep)
    return [Path(root) / name for name in named if name and (Path(root) / name).is_file()]


def load_all(root, paths=None):
    """Load every recipe (or the given ones); raise RecipeErrors with all problems, including duplicate names."""
    recipes, problems = load_each(root, paths)
    if problems:
        raise RecipeErrors(problems)
    return recipes


def load_each(root, paths=None):
    """(the valid recipes, the problems of the others): one broken recipe never holds up the rest."""
    root = Path(root)
    recipes, problems, names = [], [], {}
    cache = ParseCache(root)
    for path in (paths if paths is not None else discover(root)):
        try:
            recipe = load(path, root, cache)
        except RecipeErrors as exc:
            problems.extend(exc.errors)
            continue
        if recipe.name in names:
            problems.append(MobileBuildError(f"duplicate recipe name {recipe.name!r} (also in {names[recipe.name]})",
                                             file=recipe.file, field="name"))
            continue
        names[recipe.name] = recipe.file
        recipes.append(recipe)
    cache.save()
    return recipes, problems

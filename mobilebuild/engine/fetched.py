"""What a file fetched from the shared artifact cache must be before the build reads it back.

An entry's hashes are its writer's word: anyone who can write to the cache can write a matching hash. The stages
read intermediates weights-only, so a file carrying code is refused when it is loaded; checking the fetched copy
first turns that failure into a miss (the node is rebuilt) instead of a failed stage. Only the standard library
reads the file here (the engine (doit) layer never imports torch), and nothing in it is executed: pickles are walked
opcode by opcode (pickletools), never loaded.
"""

import pickletools
import zipfile

# The globals a state_dict's pickle names: tensor and storage rebuilders, dtypes, quantization schemes, plain
# containers. All of them are on torch's weights-only allowlist (tests/test_fetched.py checks), so nothing passes
# here that torch.load(weights_only=True) would refuse.
_TENSOR_GLOBALS = {
    ("collections", "OrderedDict"),
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_qtensor"),
    ("torch", "per_tensor_affine"), ("torch", "per_channel_affine"), ("torch", "per_channel_affine_float_qparams"),
}
_STORAGES = ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool", "QInt8",
             "QUInt8", "QInt32", "QUInt4x2", "QUInt2x4")
_TENSOR_GLOBALS |= {("torch", f"{kind}Storage") for kind in _STORAGES}
_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "qint8", "quint8", "qint32", "quint4x2", "quint2x4")
_TENSOR_GLOBALS |= {("torch", dtype) for dtype in _DTYPES}

_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}


def problem(path, form):
    """None when the file at `path` is what a stage's output of `form` ("weights", "torchscript") must be;
    otherwise why not, in a few words."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if form == "torchscript":
                return _torchscript_problem(names)
            pickles = [name for name in names if name.endswith("/data.pkl")]
            if len(pickles) != 1:
                return "not a PyTorch weights file"
            return _weights_problem(archive.read(pickles[0]))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return f"not a PyTorch archive ({exc})"


def _torchscript_problem(names):
    prefixes = {name.split("/", 1)[0] for name in names}
    if len(prefixes) == 1:
        (prefix,) = prefixes
        if {f"{prefix}/data.pkl", f"{prefix}/constants.pkl"} <= set(names) and any(
                name.startswith(f"{prefix}/code/") for name in names):
            return None
    return "not a TorchScript archive"


def globals_named(data):
    """The (module, name) pairs a pickle would import, found without unpickling it; None for each one whose name
    the pickle computes (which no state_dict does)."""
    found, pushed, memo = [], [], {}
    for opcode, argument, _ in pickletools.genops(data):
        name = opcode.name
        if name in _STRINGS:
            pushed.append(argument)
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[argument] = pushed[-1] if pushed else None
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(argument))
        elif name in ("GLOBAL", "INST"):
            found.append(tuple(argument.split(" ", 1)))
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            pair = tuple(pushed[-2:])
            found.append(pair if len(pair) == 2 and all(isinstance(part, str) for part in pair) else None)
            pushed.append(None)
        elif name in ("EXT1", "EXT2", "EXT4"):  # the copyreg extension registry: a global by number
            found.append(None)
        else:
            pushed.append(None)
    return found


def _weights_problem(data):
    try:
        named = globals_named(data)
    except ValueError as exc:  # pickletools on a malformed pickle
        return f"an unreadable pickle ({exc})"
    unknown = [pair for pair in named if pair not in _TENSOR_GLOBALS]
    if unknown:
        first = unknown[0]
        what = ".".join(first) if first else "a computed name"
        return f"holds code, not only tensors (would call {what})"
    return None

"""Byte-identical artifacts wherever and however often a build runs (see README, Reproducible builds).

TorchScript archives differ between two builds of the same model for three reasons, each removed here:
- the debug info records the absolute path of every source file it compiled or traced through (the checkout,
  the virtual environment): `normalize_archive` makes them relative to the repository or to site-packages;
- names TorchScript mangles (`___torch_mangle_23`) count every class compiled earlier in the process:
  `jit_session` starts each stage with a fresh compilation unit;
- every archive carries a random `.data/serialization_id`: `normalize_archive` replaces it with one derived from
  the archive's content;
- the tracer's stack lines name the line of every frame, mobilebuild's own included ("mobilebuild/worker/
  serve.py(108): serve"): `normalize_archive` drops the line numbers of our frames, so that editing the build tool
  leaves its artifacts' bytes alone (a model's own frames keep theirs).
A fourth, the order of a module's constants, follows Python's string hashing: stages run in a worker started with
PYTHONHASHSEED=0 (build/worker_pool.py).
"""

import contextlib
import hashlib
import os
import pickle
import re
import site
import struct
import sys
import zipfile
from pathlib import Path

import torch
import torch.jit._pickle
import torch.jit._recursive
import torch.jit._state

SERIALIZATION_ID = ".data/serialization_id"
ALIGNMENT = 64  # torch's writer aligns stored records so that tensors can be memory-mapped; kept
# a frame of mobilebuild's own code in a tracer stack line, once machine prefixes are cut; the bundled example
# models (mobilebuild/examples) are models, and keep their line numbers
OWN_FRAME = re.compile(r"(?<![\w/])(mobilebuild/(?!examples/)[\w/]+\.py)\(\d+\)")


def machine_prefixes(root):
    """The absolute folders a source path may start with, longest first: the repository, mobilebuild's own
    installation, site-packages, the interpreter's prefix."""
    package_parent = str(Path(os.path.abspath(__file__)).parents[2])  # mobilebuild's own frames
    bases = [root, package_parent, *site.getsitepackages(), site.getusersitepackages(), sys.prefix, sys.base_prefix]
    return sorted({os.path.join(os.path.abspath(b), "") for b in bases if b}, key=len, reverse=True)


@contextlib.contextmanager
def jit_session():
    """Script and trace into a compilation unit of our own, so that mangled names restart from zero; the previous
    unit is back on exit. TorchScript names a class `___torch_mangle_<n>.<Class>` when one of that name already
    exists, with n counted over the whole process: a stage's second model (convert_model_to_nnapi defines new
    classes on every call), or the worker's second stage, would otherwise give other bytes."""
    state, recursive = torch.jit._state, torch.jit._recursive
    saved = state._python_cu, recursive._python_cu, recursive.concrete_type_store
    state._python_cu = recursive._python_cu = torch._C.CompilationUnit()
    recursive.concrete_type_store = recursive.ConcreteTypeStore()
    try:
        yield
    finally:
        state._python_cu, recursive._python_cu, recursive.concrete_type_store = saved


def normalize_archive(path, root):
    """Rewrite a torch archive (TorchScript, lite interpreter, torch.save) so that it reads the same wherever it
    was built: source paths in its debug info made relative (to the repository, site-packages or the interpreter's
    prefix) and the random serialization id replaced by digits of a digest of the content. Each record keeps its
    compression and its alignment. Other files are left alone."""
    if not zipfile.is_zipfile(path):
        return
    with zipfile.ZipFile(path) as archive:
        records = [(info, archive.read(info)) for info in archive.infolist()]
    if not any(info.filename.endswith(SERIALIZATION_ID) for info, _ in records):
        return
    prefixes = machine_prefixes(root)
    records = [(info, _portable_pickle(data, prefixes) if info.filename.endswith(".debug_pkl") else data)
               for info, data in records]
    digest = hashlib.sha256()
    for info, data in records:
        if not info.filename.endswith(SERIALIZATION_ID):
            digest.update(info.filename.encode() + b"\0" + hashlib.sha256(data).digest())
    with zipfile.ZipFile(path, "w") as archive:
        for info, data in records:
            if info.filename.endswith(SERIALIZATION_ID):
                data = str(int(digest.hexdigest(), 16)).rjust(len(data), "0")[:len(data)].encode()
            _write_record(archive, info, data)


class _IntList(list):
    """Pickled as TorchScript pickles integer lists, so that its C++ unpickler reads them back as such."""

    def __reduce__(self):
        return torch.jit._pickle.build_intlist, (list(self),)


def _portable_pickle(data, prefixes):
    """The debug pickle with machine prefixes cut from its strings (file names, and the tracer's stack lines
    "path(line): function") and the line numbers of mobilebuild's own frames. A source is a list of pieces of
    the string table, and ranges are offsets into their concatenation: offsets move with the text cut before them."""
    tag, table, *entries = pickle.loads(data)
    portable = tuple(_cut(text, prefixes) for text in table)
    if tag != "FORMAT_WITH_STRING_TABLE" or portable == table:
        return data

    def moved(offset, pieces):
        position = 0
        for index in pieces:
            old, new = len(table[index]), len(portable[index])
            if offset <= old:
                return position + max(0, offset - (old - new))
            offset -= old
            position += new
        return position

    def remap(source_range):
        (pieces, filename, line), start, end = source_range
        return (_IntList(pieces), filename, line), moved(start, pieces), moved(end, pieces)

    ranges = [tuple((offset, remap(source_range), *rest) for offset, source_range, *rest in entry)
              for entry in entries]
    return pickle.dumps((tag, portable, *ranges), protocol=2)


def _cut(text, prefixes):
    for prefix in prefixes:
        text = text.replace(prefix, "")
    return OWN_FRAME.sub(r"\1", text)


def _write_record(archive, original, data):
    info = zipfile.ZipInfo(original.filename, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = original.compress_type
    info.create_system = 0
    if info.compress_type == zipfile.ZIP_STORED:
        header = 30 + len(info.filename.encode("utf-8")) + 4
        padding = -(archive.fp.tell() + header) % ALIGNMENT
        info.extra = b"FB" + struct.pack("<H", padding) + b"Z" * padding
    archive.writestr(info, data)


@contextlib.contextmanager
def plain_attention():
    """Without torch's fused attention fast path, which eager Transformer layers take in eval mode: torch.export
    records it as aten::_transformer_encoder_layer_fwd, which ExecuTorch has no kernel for ("Missing operator"),
    and its input checks fail on dynamically quantized Linear layers ("'function' object has no attribute
    'device'"). A phone runs the plain operations either way."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


_registered_builtins = []  # every object TorchScript has mapped to a builtin operator by id(), kept alive


def _keep_builtins_alive():
    """TorchScript finds builtin operators by id() (torch.jit._builtins._builtin_table), and registering one keeps
    no reference to it. When a library adds an overload to an operator already looked up (ExecuTorch and torch.ao
    both extend quantized_decomposed), torch replaces the operator's object and the old one is freed; the next object
    at its address, a Conv2d's padding tuple say, then compiles as that operator: torch.jit.script failed with
    "builtin cannot be used as a value" in about one build in six. Objects kept alive keep their addresses."""
    from torch._ops import OpOverloadPacket, _OpNamespace

    builtins = torch.jit._builtins
    if getattr(builtins._register_builtin, "keeps_alive", False):
        return
    for namespace in vars(torch.ops).values():  # operators looked up before this module was imported
        if isinstance(namespace, _OpNamespace):
            _registered_builtins.extend(packet._op for packet in vars(namespace).values()
                                        if isinstance(packet, OpOverloadPacket))
    register = builtins._register_builtin

    def register_and_keep(fn, op):
        _registered_builtins.append(fn)
        register(fn, op)

    register_and_keep.keeps_alive = True
    builtins._register_builtin = register_and_keep


_keep_builtins_alive()


@contextlib.contextmanager
def stage_session():
    """What every stage runs in: a compilation unit of its own, and plain attention."""
    with jit_session(), plain_attention():
        yield

"""Silencing the libraries a stage drives. ExecuTorch, coremltools, torch.export and torch.onnx talk a lot (root-logger
lines, progress bars, printed graphs, deprecation warnings); users read our one-line messages and findings instead.
Failures still raise: only what is logged, warned and printed goes."""

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import threading
import warnings as _warnings
from pathlib import Path

# torchao registers Enums with torch's pytree, and torch logs a deprecation line about each in every process that
# imports it (ExecuTorch, transformers and a user's own factory do): lines that say nothing about the user's model.
# Every stage worker imports this module before any stage runs.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
# transformers' advice about a model's configuration (a bos_token_id outside a tiny vocabulary, an unset loss type),
# at every stage that builds the model, from a factory's transformers model too (a `transformers:` source's are off
# already: hub.quiet_transformers); read where transformers is first imported
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@contextlib.contextmanager
def quiet(logs=logging.CRITICAL, warnings=True, output=True):
    """`logs`: logging is disabled at this level and below (None: left alone); `warnings`: warnings are ignored;
    `output`: what is printed to stdout and stderr is swallowed."""
    previous = logging.root.manager.disable
    if logs is not None:
        logging.disable(logs)
    try:
        with contextlib.ExitStack() as silenced:
            if warnings:
                silenced.enter_context(_warnings.catch_warnings())
                _warnings.simplefilter("ignore")
            if output:
                silenced.enter_context(contextlib.redirect_stdout(io.StringIO()))
                silenced.enter_context(contextlib.redirect_stderr(io.StringIO()))
            yield
    finally:
        if logs is not None:
            logging.disable(previous)



@contextlib.contextmanager
def fx_reports_dropped():
    """What Python code prints to sys.stderr, dropped: torch.fx prints a failing GraphModule's traceback and an excerpt
    of its generated code there before it raises the exception again, which the stage then says in one line."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


@contextlib.contextmanager
def dropped_logs(module, *patterns, logger=None):
    """Log records that the Python module named `module` (its file's name, as logging records it) logs to `logger`
    (the root logger by default) and whose message matches one of the regular expressions `patterns` go; every
    other record passes, at every level: a library's expected complaints, not its real failures."""
    compiled = [re.compile(pattern) for pattern in patterns]

    def keep(record):
        return not (record.module == module and any(p.search(record.getMessage()) for p in compiled))

    target = logging.getLogger(logger)
    target.addFilter(keep)
    try:
        yield
    finally:
        target.removeFilter(keep)


# torch's C++ warnings: "[W1123 23:53:09.382403295 qlinear_dynamic.cpp:251] Warning: ..." (date, time, and a
# process id on some builds), printed each time the code runs: a quantized cat warned 32 times per benchmark
C10_WARNING = re.compile(rb"^\[W\d{4} [\d:.]+(?: \d+)? ([^\]]+)\] (.*)")
# torch's C++ warnings that tell the user nothing to act on, dropped wherever the native output is filtered once
# (`once`): (their source file, the start of their message). torch's dynamic quantized Linear always asks its kernel
# for reduce_range (torch/ao/nn/quantized/dynamic/modules/linear.py), which qnnpack ignores, as it should (7-bit
# activations are an x86 overflow workaround): every text model's dynamic int8 stage on qnnpack said so.
EXPECTED_WARNINGS = ((b"qlinear_dynamic.cpp:", b"Warning: Currently, qnnpack incorrectly ignores reduce_range"),)
# A file listing the C++ warnings shown so far in this build, one per line: each is shown once per build, not once
# per stage (qnnpack's reduce_range warning came from every dynamic int8 stage). Set by the build's reporter.
SHOWN_WARNINGS = "MOBILEBUILD_SHOWN_WARNINGS"


def _expected(warning):
    source, message = warning.groups()
    return any(source.startswith(file) and message.startswith(start) for file, start in EXPECTED_WARNINGS)


def _shown_in_build():
    path = os.environ.get(SHOWN_WARNINGS)
    try:
        with open(path, "rb") as shown:
            return set(shown.read().splitlines())
    except (OSError, TypeError):
        return set()


def _remember(key):
    path = os.environ.get(SHOWN_WARNINGS)
    if path:
        with contextlib.suppress(OSError), open(path, "ab") as shown:  # one short append: whole, even from workers
            shown.write(key + b"\n")


@contextlib.contextmanager
def native_stderr(dropped=(), kept=None, kept_prefix=(), once=False, python_too=True):
    """What native code writes to file descriptor 2, filtered: lines starting with `dropped` go, lines starting with
    `kept_prefix` are collected in the list `kept` instead of printed (a kernel's reason for failing, which its
    exception leaves out), with `once` each of torch's C++ warnings is shown the first time only (in the build, where
    one is running, else in this block) and those of EXPECTED_WARNINGS not at all, and the rest pass
    on as they come (a crash's last words included). Python's sys.stderr goes the same way (bindings log through it,
    and it need not be descriptor 2: under pytest, say), unless `python_too` is false: then it writes straight to
    the real stderr (a live progress counter, whose carriage returns a line filter would hold back)."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    stderr = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward():
        seen, repeated, earlier = set(), 0, _shown_in_build() if once else set()
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                warning = C10_WARNING.match(line) if once else None
                key = b" ".join(warning.groups()) if warning else None
                if kept is not None and kept_prefix and line.startswith(kept_prefix):
                    kept.append(line.decode(errors="replace"))
                elif key in earlier or warning and _expected(warning):
                    continue  # shown by an earlier stage of this build, or nothing to act on
                elif warning and key in seen:
                    repeated += 1
                elif not (dropped and line.startswith(dropped)):
                    if warning:
                        seen.add(key)
                        _remember(key)
                    os.write(stderr, line)
        if repeated:
            os.write(stderr, f"   ({repeated} repeats of the warnings above not shown)\n".encode())

    forwarding = threading.Thread(target=forward, daemon=True)
    forwarding.start()
    python_stderr = open(2 if python_too else stderr, "w", closefd=False)
    try:
        with contextlib.redirect_stderr(python_stderr):
            yield
    finally:
        python_stderr.flush()
        sys.stderr.flush()
        os.dup2(stderr, 2)  # closes the pipe's last write end: the forwarding ends with the lines written
        forwarding.join()
        os.close(stderr)


@contextlib.contextmanager
def native_stdout_dropped():
    """What native code writes to file descriptor 1 goes, for a block that prints nothing of its own there (Python's
    sys.stdout is flushed first): torch's ONNX log, which its TorchScript exporter turns on and writes with C++."""
    sys.stdout.flush()
    stdout = os.dup(1)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
        yield
    finally:
        os.dup2(stdout, 1)
        os.close(stdout)


@contextlib.contextmanager
def warnings_once():
    """Python warnings as torch's C++ ones: each (its category and message) shown the first time only, in the build
    where one is running, else in this block. A quantized cat's UserWarning came from every stage and every
    candidate `mobilebuild tune` built. Enter it inside warnings.catch_warnings(), which puts the display back."""
    shown, seen = _warnings.showwarning, set()

    def show_once(message, category, filename, lineno, file=None, line=None):
        key = f"{category.__name__}: {message}".encode(errors="replace").replace(b"\n", b" ")
        if key in seen or key in _shown_in_build():
            return
        seen.add(key)
        _remember(key)
        shown(message, category, filename, lineno, file, line)

    _warnings.showwarning = show_once
    yield


WARNINGS_LIST = "mobilebuild-warnings-"  # then the pid of the process that made the list


def _remove_stale_lists():
    """The lists of builds that were killed (their `finally` never ran): those whose process is gone."""
    for path in Path(tempfile.gettempdir()).glob(f"{WARNINGS_LIST}*-*"):
        try:
            os.kill(int(path.name[len(WARNINGS_LIST):].split("-")[0]), 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except (ValueError, OSError):  # another naming; another user's process
            continue


@contextlib.contextmanager
def shown_warnings_list():
    """A list of the warnings shown, for the workers started in this block to share (SHOWN_WARNINGS): a build's
    reporter starts one; `mobilebuild tune` one for all its rounds, which their reporters keep."""
    _remove_stale_lists()
    handle, path = tempfile.mkstemp(prefix=f"{WARNINGS_LIST}{os.getpid()}-")
    os.close(handle)
    try:
        with environment(SHOWN_WARNINGS, path):
            yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def environment(name, value):
    """os.environ[name] = value for a block, put back after (unittest.mock.patch.dict would do, but importing it
    costs an up-to-date build 12 ms: asyncio)."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous

"""ExecuTorch programs (.pte) in the host's ExecuTorch runtime (`executorch.runtime.Runtime`, from the pip wheel).

The host runtime has the XNNPACK delegate and the portable CPU kernels, so XNNPACK and undelegated programs run
here; Vulkan, Core ML and MPS programs need their device's runtime and are refused with a one-line error.

The runtime copies an input's bytes as the program laid its input out when it was exported (NCHW, or NHWC for a
channels_last export) whatever the tensor's strides say, so the callable converts each input to that layout first;
fed as-is, a channels_last tensor gives silently wrong numbers from an NCHW program, and vice versa.

config: "timing": {"threads": n} sizes ExecuTorch's CPU thread pool (which XNNPACK uses; torch's own thread
setting does not reach it).
"""

import contextlib
import os
import re
import sys
import threading
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import pte
from mobilebuild.worker.quiet import quiet

CHANNELS_LAST_DIM_ORDER = [0, 2, 3, 1]
# What the runtime writes to the process's stderr when it first sizes its thread pool: the CPU facts it looked for
# ("Failed to open midr file", "CPU info and manual query on # of cpus dont match" on every x86 host).
CPUINFO_NOTES = b"[cpuinfo_utils.cpp:"
# What it writes while loading a method whose operators it lacks: a dump of every registered kernel's dtypes and dim
# orders (hundreds of lines), then one line per missing operator.
LOADING_NOTES = (b"[operator_registry.cpp:", b"[method.cpp:")
MISSING_OPERATOR = re.compile(r"Missing operator: \[\d+\] (\S+)")


@contextlib.contextmanager
def without_cpuinfo_notes(kept=None):
    """The runtime's CPU probing notes, which say nothing about the program, kept out of build logs; with a list
    `kept`, its method-loading notes are collected there instead of printed. Native code writes them to file
    descriptor 2: it goes through a pipe whose other lines are passed on as they come (a crash's last words
    included)."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    stderr = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward():
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if kept is not None and line.startswith(LOADING_NOTES):
                    kept.append(line.decode(errors="replace"))
                elif not line.startswith(CPUINFO_NOTES):
                    os.write(stderr, line)

    forwarding = threading.Thread(target=forward, daemon=True)
    forwarding.start()
    # the runtime's Python binding logs through sys.stderr, which need not be file descriptor 2 (under pytest, say)
    python_stderr = open(2, "w", closefd=False)
    try:
        with contextlib.redirect_stderr(python_stderr):
            yield
    finally:
        python_stderr.flush()
        sys.stderr.flush()
        os.dup2(stderr, 2)  # closes the pipe's last write end: the forwarding ends with the lines written
        forwarding.join()
        os.close(stderr)


def _set_threads(config):
    threads = (getattr(config, "timing", None) or {}).get("threads")
    if threads:
        from executorch.extension.pybindings import portable_lib

        with quiet():
            portable_lib._unsafe_reset_threadpool(int(threads))


def unavailable(backends):
    """The backends of `backends` this host's runtime does not have."""
    from executorch.runtime import Runtime

    return [b for b in backends if not Runtime.get().backend_registry.is_available(b)]


def check_runs_here(path, backends):
    missing = unavailable(backends)
    if missing:
        raise MobileBuildError(f"{Path(path).name} delegates to {', '.join(missing)}, which this host's ExecuTorch "
                               "runtime does not have: it runs only on a device with that backend (the host runs "
                               "XNNPACK and portable-kernel programs)", field="targets")


def _in_dim_order(tensor, dim_order):
    if dim_order == CHANNELS_LAST_DIM_ORDER and tensor.dim() == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor.contiguous()


def load_method(data):
    """(program, its forward method) in this host's runtime; a method that cannot load is one line: the operators
    no kernel library of the runtime has (the portable kernels run what the delegate did not take), or the
    runtime's own error, without its log of every registered kernel."""
    from executorch.runtime import Runtime

    notes = []
    with without_cpuinfo_notes(kept=notes):
        try:
            program = Runtime.get().load_program(data)
            return program, program.load_method("forward")
        except RuntimeError as exc:
            error = exc
    missing = list(dict.fromkeys(match[1] for note in notes for match in MISSING_OPERATOR.finditer(note)))
    if missing:
        raise MobileBuildError(f"the program cannot load: ExecuTorch's runtime has no kernel for {few(missing)} "
                               "(outside the delegate, operators run on the portable kernels); replace that operation "
                               "in the model, or ship a runtime built with a kernel library that has it",
                               field="targets") from None
    raise MobileBuildError(f"the program cannot load in ExecuTorch's runtime: {error}", field="targets") from None


def load(path, config):
    facts = pte.read(path)
    check_runs_here(path, facts.backends)
    dim_orders = facts.input_dim_orders
    with without_cpuinfo_notes():
        _set_threads(config)
    program, method = load_method(facts.data)

    def run(*inputs, _program=program):  # the method uses the program's memory: keep the program alive with it
        outputs = method.execute([_in_dim_order(x, order) for x, order in zip(inputs, dim_orders, strict=True)])
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return run


def inspect(path, config):
    return {"delegation": pte.read(path).delegation, "bytes": Path(path).stat().st_size}

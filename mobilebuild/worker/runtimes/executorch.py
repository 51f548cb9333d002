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
import sys
import threading
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import pte
from mobilebuild.worker.quiet import quiet

CHANNELS_LAST_DIM_ORDER = [0, 2, 3, 1]
# What the runtime writes to the process's stderr when it first sizes its thread pool: the CPU facts it looked for
# ("Failed to open midr file", "CPU info and manual query on # of cpus dont match" on every x86 host).
CPUINFO_NOTES = b"[cpuinfo_utils.cpp:"


@contextlib.contextmanager
def without_cpuinfo_notes():
    """The runtime's CPU probing notes, which say nothing about the program, kept out of build logs. Native code
    writes them to file descriptor 2: it goes through a pipe whose other lines are passed on as they come (a
    crash's last words included)."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    stderr = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward():
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not line.startswith(CPUINFO_NOTES):
                    os.write(stderr, line)

    forwarding = threading.Thread(target=forward, daemon=True)
    forwarding.start()
    try:
        yield
    finally:
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


def check_runs_here(path, backends):
    from executorch.runtime import Runtime

    missing = [b for b in backends if not Runtime.get().backend_registry.is_available(b)]
    if missing:
        raise MobileBuildError(f"{Path(path).name} delegates to {', '.join(missing)}, which this host's ExecuTorch "
                               "runtime does not have: it runs only on a device with that backend (the host runs "
                               "XNNPACK and portable-kernel programs)", field="targets")


def _in_dim_order(tensor, dim_order):
    if dim_order == CHANNELS_LAST_DIM_ORDER and tensor.dim() == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor.contiguous()


def load(path, config):
    facts = pte.read(path)
    check_runs_here(path, facts.backends)
    dim_orders = facts.input_dim_orders
    from executorch.runtime import Runtime

    with without_cpuinfo_notes():
        _set_threads(config)
        program = Runtime.get().load_program(facts.data)
        method = program.load_method("forward")

    def run(*inputs, _program=program):  # the method uses the program's memory: keep the program alive with it
        outputs = method.execute([_in_dim_order(x, order) for x, order in zip(inputs, dim_orders, strict=True)])
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return run


def inspect(path, config):
    return {"delegation": pte.read(path).delegation, "bytes": Path(path).stat().st_size}

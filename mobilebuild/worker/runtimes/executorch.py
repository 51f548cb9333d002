"""ExecuTorch programs (.pte) in the host's ExecuTorch runtime (`executorch.runtime.Runtime`, from the pip wheel).

The host runtime has the XNNPACK delegate and the portable CPU kernels, so XNNPACK and undelegated programs run
here; Vulkan, Core ML and MPS programs need their device's runtime and are refused with a one-line error.

The runtime copies an input's bytes as the program laid its input out when it was exported (NCHW, or NHWC for a
channels_last export) whatever the tensor's strides say, so the callable converts each input to that layout first;
fed as-is, a channels_last tensor gives silently wrong numbers from an NCHW program, and vice versa.

config: "timing": {"threads": n} sizes ExecuTorch's CPU thread pool (which XNNPACK uses; torch's own thread
setting does not reach it).
"""

import re
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import pte
from mobilebuild.worker import quiet as quiet_module
from mobilebuild.worker.quiet import quiet

CHANNELS_LAST_DIM_ORDER = [0, 2, 3, 1]
# What the runtime writes to the process's stderr when it first sizes its thread pool: the CPU facts it looked for
# ("Failed to open midr file", "CPU info and manual query on # of cpus dont match" on every x86 host).
CPUINFO_NOTES = b"[cpuinfo_utils.cpp:"
# What it writes while loading a method whose operators it lacks: a dump of every registered kernel's dtypes and dim
# orders (hundreds of lines), then one line per missing operator.
LOADING_NOTES = (b"[operator_registry.cpp:", b"[method.cpp:")
MISSING_OPERATOR = re.compile(r"Missing operator: \[\d+\] (\S+)")


def without_cpuinfo_notes(kept=None, kept_prefix=LOADING_NOTES):
    """The runtime's CPU probing notes, which say nothing about the program, kept out of build logs; with a list
    `kept`, its lines starting with `kept_prefix` (its method-loading notes) are collected there instead."""
    return quiet_module.native_stderr(dropped=CPUINFO_NOTES, kept=kept, kept_prefix=kept_prefix)


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
    with without_cpuinfo_notes():
        _set_threads(config)
    return callable_for(facts)


def callable_for(facts):
    """The program (`pte.read`'s facts) as a callable from input tensors to its outputs."""
    dim_orders = facts.input_dim_orders
    program, method = load_method(facts.data)

    checked = []  # the first run collects the runtime's log: where a kernel refuses, its reason is only there

    def run(*inputs, _program=program):  # the method uses the program's memory: keep the program alive with it
        arranged = [_in_dim_order(x, order) for x, order in zip(inputs, dim_orders, strict=True)]
        if not checked:
            checked.append(True)
            outputs = _first_run(method, arranged)
        else:
            outputs = method.execute(arranged)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return run


KERNEL_CHECK = re.compile(r"\[(?P<file>\w+)\.cpp:\d+\] (?P<what>Check failed.*)")


def _first_run(method, arranged):
    """A run whose failure is one line: the runtime's exception says only "execute() failed with error 0x12", the
    kernel's own reason is in its log, a dozen lines of which are kept out of the build's output."""
    notes = []
    with without_cpuinfo_notes(kept=notes, kept_prefix=b"["):
        try:
            return method.execute(arranged)
        except RuntimeError as exc:
            error = str(exc).splitlines()[0]
    found = next((KERNEL_CHECK.search(note) for note in notes if KERNEL_CHECK.search(note)), None)
    if found is None:
        raise MobileBuildError(f"the program fails in ExecuTorch's runtime: {error}", field="targets")
    raise MobileBuildError(f"the program fails in ExecuTorch's runtime, in {found['file']}: {found['what'].strip()} "
                           "(outside the delegate, operators run on the portable kernels)", field="targets")


def inspect(path, config):
    return {"delegation": pte.read(path).delegation, "bytes": Path(path).stat().st_size}

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
import tempfile
from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.routes.executorch.worker import llm_runner as app_runner  # noqa: F401 - lm_bench's runner
from mobilebuild.routes.executorch.worker import pte
from mobilebuild.worker.quiet import native_stderr, quiet

CHANNELS_LAST_DIM_ORDER = [0, 2, 3, 1]
# What the runtime writes to the process's stderr when it first sizes its thread pool: the CPU facts it looked for
# ("Failed to open midr file", "CPU info and manual query on # of cpus dont match" on every x86 host).
CPUINFO_NOTES = b"[cpuinfo_utils.cpp:"
# What it logs ("[file.cpp:line] ...") where it cannot load or run a method: a dump of every registered kernel's
# dtypes and dim orders (hundreds of lines) then one line per missing operator, or a kernel's failed check.
LOG_LINE = b"["
MISSING_OPERATOR = re.compile(r"Missing operator: \[\d+\] (\S+)")
KERNEL_CHECK = re.compile(r"\[(?P<file>\w+)\.cpp:\d+\] (?P<what>Check failed.*)")


def without_cpuinfo_notes(kept=None):
    """The runtime's CPU probing notes, which say nothing about the program, kept out of build logs; with a list
    `kept`, everything else it logs is collected there instead of printed."""
    return native_stderr(dropped=CPUINFO_NOTES, kept=kept, kept_prefix=LOG_LINE)


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


def _explained(action, failing):
    """`action()`, with the runtime's log kept out of the build's output; where it fails, one line from that log:
    its exception says only "Failed to load method forward, error: 0x:14" or "execute() failed with error 0x12",
    the operators it has no kernel for or the kernel's failed check are in the log. `failing`: "cannot load" or
    "fails", what the program does in the line when the log says nothing more."""
    notes = []
    with without_cpuinfo_notes(kept=notes):
        try:
            return action()
        except RuntimeError as exc:
            error = str(exc).splitlines()[0]
    missing = list(dict.fromkeys(match[1] for note in notes for match in MISSING_OPERATOR.finditer(note)))
    check = next(filter(None, map(KERNEL_CHECK.search, notes)), None)
    if missing:
        raise MobileBuildError(f"the program cannot load: ExecuTorch's runtime has no kernel for {few(missing)} "
                               "(outside the delegate, operators run on the portable kernels); replace that operation "
                               "in the model, or ship a runtime built with a kernel library that has it",
                               field="targets")
    if check:
        raise MobileBuildError(f"the program fails in ExecuTorch's runtime, in {check['file']}: "
                               f"{check['what'].strip()} (outside the delegate, operators run on the portable kernels)",
                               field="targets")
    raise MobileBuildError(f"the program {failing} in ExecuTorch's runtime: {error}", field="targets")


def load_method(data):
    """(program, its forward method) in this host's runtime; a method that cannot load is one line (`_explained`)."""
    from executorch.runtime import Runtime

    def load():
        program = Runtime.get().load_program(data)
        return program, program.load_method("forward")

    return _explained(load, "cannot load")


def load(path, config):
    facts = pte.read(path)
    check_runs_here(path, facts.backends)
    with without_cpuinfo_notes():
        _set_threads(config)
    return callable_for(facts)


def arm64_options(path, config):
    """The input dim orders the runner in the emulated aarch64 Python lays its inputs out in (worker/guest)."""
    return {"dim_orders": pte.read(path).input_dim_orders}


def callable_for(facts):
    """The program (`pte.read`'s facts) as a callable from input tensors to its outputs."""
    dim_orders = facts.input_dim_orders
    program, method = load_method(facts.data)

    # the first run is explained where it fails (the kernel's reason is only in the runtime's log); the rest run
    # bare: a pipe and a thread per call would weigh on the benchmark's timings
    checked = []

    def run(*inputs, _program=program):  # the method uses the program's memory: keep the program alive with it
        arranged = [_in_dim_order(x, order) for x, order in zip(inputs, dim_orders, strict=True)]
        if checked:
            outputs = method.execute(arranged)
        else:
            outputs = _explained(lambda: method.execute(arranged), "fails")
            checked.append(True)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return run


def inspect(path, config):
    program = pte.read(path)
    made = {"made": program.record} if program.record is not None else {}
    return {"delegation": program.delegation, "bytes": Path(path).stat().st_size, **made}


class Generator:
    """A language model's program (lm_lower) a step at a time (worker/lm.py), the KV cache kept in the program's
    own buffers between calls. Two layouts, told by the rank of forward's output (as the LLM runner tells them by its
    inputs): transformers' and optimum-executorch's (input_ids [1, T], cache_position [T]) -> the logits of every
    position [1, T, vocab]; export_llm's (tokens [1, T], input_pos [1]) -> the last position's [1, vocab].
    `data`: the .pte's bytes; or with `weights` (the path of its .ptd), the .pte's path: the pybindings' module
    loads the pair (the `executorch.runtime` loader takes no data file)."""

    def __init__(self, data, weights=None):
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (export_llm's kernels)

        if weights is None:
            self.program, method = load_method(data)
            self.method_names, self._execute, meta = self.program.method_names, method.execute, method.metadata
        else:
            from executorch.extension.pybindings import portable_lib

            module = _explained(lambda: portable_lib._load_for_executorch(str(data), str(weights)), "cannot load")
            self.method_names, meta = set(module.method_names()), module.method_meta("forward")
            self._execute = lambda arguments: module.forward(tuple(arguments))
        self.all_positions = len(meta.output_tensor_meta(0).sizes()) == 3
        self.checked = False

    def forward(self, tokens, position):
        positions = (torch.arange(position, position + tokens.shape[1]) if self.all_positions
                     else torch.tensor([position]))
        arguments = [tokens.contiguous(), positions]
        if self.checked:
            found = self._execute(arguments)[0]
        else:
            found = _explained(lambda: self._execute(arguments), "fails")[0]
            self.checked = True
        return found if self.all_positions else found.view(1, 1, -1)


def generator(path, config):
    """`path`: lm_lower's artifact (a .pte, or the zip of a program and its weights, unpacked for as long as the
    generator lives), or a .pte's bytes."""
    with without_cpuinfo_notes():
        _set_threads(config)
    if isinstance(path, (bytes, bytearray)):
        return Generator(path)
    folder = tempfile.TemporaryDirectory(prefix="mobilebuild-executorch-")
    program, weights = pte.unpacked(path, folder.name)
    found = Generator(program.read_bytes()) if weights is None else Generator(program, weights)
    found.folder = folder  # removed with the generator
    return found

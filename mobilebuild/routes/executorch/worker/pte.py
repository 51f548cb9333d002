"""Reading an ExecuTorch program (.pte) back: how much of it went to delegates (the lower stage's message, verify's
facts) and what the host runtime needs to run it (the backends it calls, each input's dim order). One
deserialization answers both."""

import json
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.executorch import lm_package
from mobilebuild.routes.executorch.worker.setup import ensure_flatc


@dataclass(frozen=True)
class Program:
    data: bytes  # the .pte itself, as the runtime loads it
    # Delegate calls per backend id and the operator calls left to portable kernels, over all methods:
    # {"delegates": {"XnnpackBackend": 1}, "delegated_calls": 1, "fallback_ops": {"aten::add.out": 2},
    #  "fallback_calls": 2}
    delegation: dict
    backends: list  # the backend ids the first method delegates to, sorted
    input_dim_orders: list  # per input of the first method: its dim order ([] for a non-tensor)
    record: dict | None = None  # how the lower stage made it, where not as the recipe asked (RECORD_METHOD)


# A constant method the lower stage adds to a program it made otherwise than the recipe asked (int8 by torchao where
# PT2E failed): a JSON string, read back here for verify's record and the report.
RECORD_METHOD = "mobilebuild_record"
ZIP_MAGIC = b"PK\x03\x04"  # a zip's first bytes; a .pte's are a flatbuffer offset, then "ET12"


def read(pte):
    """The program in `pte`: a .pte file's path, or the bytes of one (a lowering's own output). A file flatc or the
    schema rejects is a one-line MobileBuildError."""
    if isinstance(pte, (bytes, bytearray, memoryview)):
        return _read(bytes(pte))
    data = Path(pte).read_bytes()
    try:
        return _read(data)
    except Exception as exc:  # flatc or the schema rejects it: not a program this ExecuTorch reads
        from mobilebuild.worker.stages import modeling

        raise MobileBuildError(f"{pte} is not a readable ExecuTorch program: {modeling.first_line(exc)}",
                               field="targets") from None


def _read(data):
    ensure_flatc()  # the serializer reads the program through flatc
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(data).program
    first = next(plan for plan in program.execution_plan if plan.name == "forward")
    recorded = next((plan.values[0].val.string_val for plan in program.execution_plan
                     if plan.name == RECORD_METHOD), None)
    return Program(data=data, delegation=_delegation(program),
                   backends=sorted({delegate.id for delegate in first.delegates}),
                   input_dim_orders=[list(getattr(first.values[index].val, "dim_order", None) or [])
                                     for index in first.inputs],
                   record=json.loads(recorded) if recorded is not None else None)


def _delegation(program):
    from executorch.exir.schema import DelegateCall, KernelCall

    delegates, fallback = Counter(), Counter()
    for plan in program.execution_plan:
        for chain in plan.chains:
            for instruction in chain.instructions:
                call = instruction.instr_args
                if isinstance(call, DelegateCall):
                    delegates[plan.delegates[call.delegate_index].id] += 1
                elif isinstance(call, KernelCall):
                    fallback[_operator_name(plan.operators[call.op_index])] += 1
    return {"delegates": dict(sorted(delegates.items())), "delegated_calls": sum(delegates.values()),
            "fallback_ops": dict(sorted(fallback.items())), "fallback_calls": sum(fallback.values())}


def _operator_name(operator):
    return f"{operator.name}.{operator.overload}" if operator.overload else operator.name


def unpacked(path, folder):
    """(the program's path, its weights' path or None) of lm_lower's artifact: a .pte as it is, or the zip of a
    program and its weights (routes/executorch/lm_package.py) unpacked into `folder`."""
    with open(path, "rb") as handle:
        if handle.read(4) != ZIP_MAGIC:
            return Path(path), None
    with zipfile.ZipFile(path) as archive:
        archive.extractall(folder)
    return Path(folder, lm_package.PROGRAM), Path(folder, lm_package.WEIGHTS)

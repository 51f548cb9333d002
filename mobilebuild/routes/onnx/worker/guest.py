"""ONNX Runtime runs an .onnx on its CPU execution provider, deterministic and sequential, with `threads` intra-op
threads, as an app pinning its thread count would. The host's runtime module (routes/onnx/worker/runtime.py)
makes its sessions with the same options."""

import onnxruntime


def session_options(threads):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.use_deterministic_compute = True
    options.log_severity_level = 3  # errors only: ONNX Runtime warns on stderr about things that are not ours
    return options


def load(path, threads):
    session = onnxruntime.InferenceSession(path, session_options(threads), providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_inputs()]
    return lambda arrays: session.run(None, dict(zip(names, arrays, strict=True)))

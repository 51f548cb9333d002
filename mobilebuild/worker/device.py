"""Benchmark a .ptl artifact on an Android device with PyTorch's speed_benchmark_torch, through adb.

The flow is the performance recipe's and the NNAPI blog's: push the model to /data/local/tmp, run the benchmark
binary there, read its one summary line. Every outcome is a JSON-able dict: "ran" with the binary's own figures,
"skipped" when there is nothing to run on, "failed" with the output's tail. A figure is only ever one the binary
printed (or, for iters per second, its exact inverse), never a guess. `adb_session` (a device, adb and the
binary checked) serves ExecuTorch's LLM runner too (routes/executorch/worker/llm_runner.py).
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

REMOTE_DIR = "/data/local/tmp"
DEFAULT_BINARY = f"{REMOTE_DIR}/speed_benchmark_torch"
BUILD_BINARY_COMMAND = "BUILD_PYTORCH_MOBILE=1 ANDROID_ABI=arm64-v8a ./scripts/build_android.sh -DBUILD_BINARY=ON"
RAW_LINES = 5
REASON_LINES = 3
REASON_CHARS = 400

_NUMBER = r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
# "Microseconds" from speed_benchmark_torch, "Milliseconds" from the iOS TestApp.
_PER_ITER = re.compile(r"(Micro|Milli)seconds per iter:\s*" + _NUMBER)
# The iOS TestApp prints "Iters per second: : 34.762".
_PER_SECOND = re.compile(r"Iters per second:[\s:]*" + _NUMBER)


def parse_speed_benchmark(text):
    """{"us_per_iter", "iters_per_second"} from speed_benchmark_torch (or iOS TestApp) console output."""
    per_iter = _PER_ITER.findall(text)
    if not per_iter:
        raise ValueError("no 'Microseconds per iter' (or 'Milliseconds per iter') figure in the output")
    unit, figure = per_iter[-1]
    us_per_iter = float(figure) * (1000.0 if unit == "Milli" else 1.0)
    per_second = _PER_SECOND.findall(text)
    # The binary computes iters/s as exactly 1e6 / us_per_iter, so deriving it when the line is cut off adds
    # no information the output did not already carry.
    iters_per_second = float(per_second[-1]) if per_second else 1e6 / us_per_iter
    return {"us_per_iter": us_per_iter, "iters_per_second": iters_per_second}


def format_speed_benchmark_line(us_per_iter, iters_per_second):
    """The summary line as speed_benchmark_torch prints it, so host and device figures read (and parse) alike.

    `:g` is printf's %g with 6 significant digits: what the binary's std::cout prints by default.
    """
    return f"Main run finished. Microseconds per iter: {us_per_iter:g}. Iters per second: {iters_per_second:g}"


def speed_benchmark_argv(binary, model, *, input_dims, input_type, warmup, iters, threads, use_bundled_input):
    """The device-side command line, flags as in the NNAPI blog's invocation.

    --use_bundled_input is an index into the model's bundled inputs, not a switch: 0 runs on the first bundled
    input, -1 (the binary's default) on a tensor of ones shaped by --input_dims. --pthreadpool_size=0 would mean
    one thread per big core.
    """
    dims = input_dims if isinstance(input_dims, str) else ",".join(str(d) for d in input_dims)
    return [binary, f"--model={model}", f"--input_dims={dims}", f"--input_type={input_type}",
            f"--warmup={warmup}", f"--iter={iters}", f"--use_bundled_input={0 if use_bundled_input else -1}",
            f"--pthreadpool_size={threads}"]


def adb_session(serial, binary, adb=None, timeout=600, *, build):
    """{"status": "ready", "run": run(words, what, shell=True)} where `binary` is on the attached device `serial`;
    else the "skipped" or "failed" result that says why not. `build`: (how to build the binary, the path it is
    built at), for the line that says so where it is missing."""
    if not serial:
        return skipped("no device selected (set benchmark.device.serial in the recipe or MOBILEBUILD_ADB_SERIAL)")
    adb_path = shutil.which(adb or "adb")
    if adb_path is None:
        return skipped("adb not on PATH" if adb is None else f"adb not found: {adb}")

    def run(words, what, shell=True, check=True):
        return _adb([adb_path, "-s", serial, *(["shell"] if shell else []), *words], timeout, what, check=check)

    try:
        states = attached_devices(_adb([adb_path, "devices"], timeout, "adb devices").stdout)
        if states.get(serial) != "device":
            listed = ", ".join(f"{name} {state}" for name, state in states.items()) or "nothing"
            return skipped(f"device {serial} not attached (adb devices lists: {listed})")
        if not _binary_present(run(["ls", shlex.quote(binary)], "adb shell ls", check=False), binary):
            return skipped(f"{binary} not found on device {serial}: build it {build[0]} and push it with "
                           f"`adb -s {serial} push {build[1]} {binary}`")
    except AdbFailed as failure:
        return failed(str(failure))
    return {"status": "ready", "run": run}


def benchmark_on_device(artifact, *, serial, input_dims, input_type="float", warmup=5, iters=200, threads=1,
                        use_bundled_input=False, binary=DEFAULT_BINARY, adb=None, timeout=600):
    """Push `artifact` to the device `serial` and run speed_benchmark_torch on it; see the module docstring."""
    session = adb_session(serial, binary, adb, timeout, build=(f"in a PyTorch checkout with `{BUILD_BINARY_COMMAND}`",
                                                              "build_android/bin/speed_benchmark_torch"))
    if session["status"] != "ready":
        return session
    run = session["run"]
    try:
        artifact = Path(artifact)
        if not artifact.is_file():
            return failed(f"artifact {artifact} does not exist")
        remote_model = f"{REMOTE_DIR}/{artifact.name}"
        run(["push", str(artifact), remote_model], "adb push", shell=False)

        # adb joins the words after `shell` with spaces for the device's shell, so each is quoted for it.
        device_argv = speed_benchmark_argv(binary, remote_model, input_dims=input_dims, input_type=input_type,
                                           warmup=warmup, iters=iters, threads=threads,
                                           use_bundled_input=use_bundled_input)
        ran = run([shlex.quote(word) for word in device_argv], "speed_benchmark_torch")
        try:
            figures = parse_speed_benchmark(ran.stdout)
        except ValueError as error:
            # Adb older than Android 7 reports exit status 0 whatever the device command did.
            return failed(f"speed_benchmark_torch: {error}: {tail(ran.stdout)}")
    except AdbFailed as failure:
        return failed(str(failure))
    command = list(ran.args)
    # The binary reports total time / iterations: a mean, not a median like the host benchmark.
    return {"status": "ran", "serial": serial, "command": command, **figures,
            "mean_ms": figures["us_per_iter"] / 1000.0, "raw": _lines(ran.stdout)[-RAW_LINES:]}


def attached_devices(text):
    """{serial: state} from `adb devices` output; state is "device" when it is usable."""
    states = {}
    for line in text.splitlines():
        # Skip the header and the "* daemon started successfully" lines an adb server start prints.
        if not line.strip() or line.startswith(("List of devices", "*")):
            continue
        fields = line.split(None, 1)
        if len(fields) == 2:
            states[fields[0]] = fields[1].strip()
    return states


def _binary_present(listed, binary):
    # `ls FILE` echoes FILE when it exists. The output is checked, not only the exit status, which adb older
    # than Android 7 does not pass on.
    return listed.returncode == 0 and binary in _lines(listed.stdout)


class AdbFailed(Exception):
    """An adb call that could not do its job; its message is the "failed" reason."""


def _adb(argv, timeout, what, *, check=True):
    """Run adb with stderr folded into stdout: the device's errors come on either, depending on adb's version."""
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        # Killing the local adb may leave the benchmark running on the device until it finishes by itself.
        partial = expired.output.decode(errors="replace") if isinstance(expired.output, bytes) else expired.output
        raise AdbFailed(f"{what} timed out after {timeout} s: {tail(partial or '')}") from None
    except OSError as error:
        raise AdbFailed(f"{what} could not start: {error}") from None
    if check and result.returncode != 0:
        raise AdbFailed(f"{what} exited with status {result.returncode}: {tail(result.stdout)}")
    return result


def _lines(text):
    # Output through an adb pty ends lines with \r\n.
    return [line.strip() for line in text.splitlines() if line.strip()]


def tail(text):
    """The output's last few lines as one line, for a reason string."""
    tail = " | ".join(_lines(text)[-REASON_LINES:]) or "(no output)"
    return tail if len(tail) <= REASON_CHARS else "..." + tail[-REASON_CHARS:]


def skipped(reason):
    return {"status": "skipped", "reason": reason}


def failed(reason):
    return {"status": "failed", "reason": reason}

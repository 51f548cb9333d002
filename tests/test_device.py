"""On-device benchmarking: the speed_benchmark_torch parser on the seeds' real outputs, and the adb flow against a
fake `adb` on PATH (this machine has neither adb nor a device)."""

import json
import sys
import textwrap

import pytest

from mobilebuild.routes.torchscript import plan as torchscript
from mobilebuild.worker import device

# Verbatim from the PyTorch Mobile performance recipe (Android) ...
ANDROID_OUTPUT = ("Starting benchmark.\n"
                  "Running warmup runs.\n"
                  "Main runs.\n"
                  "Main run finished. Microseconds per iter: 121318. Iters per second: 8.24281\n")
# ... the Arm NNAPI blog (one line as printed there) ...
NNAPI_OUTPUT = ("Starting benchmark. Running warmup runs. Main runs. Main run finished. "
                "Microseconds per iter: 36012.7. Iters per second: 27.768")
# ... and the recipe's iOS TestApp, which prints milliseconds.
IOS_OUTPUT = ("TestApp[2121:722447] Main runs\n"
              "TestApp[2121:722447] Main run finished. Milliseconds per iter: 28.767\n"
              "TestApp[2121:722447] Iters per second: : 34.762\n"
              "TestApp[2121:722447] Done.\n")

SERIAL = "R58M12ABCDE"
BINARY = "/data/local/tmp/speed_benchmark_torch"
MISSING_BINARY = f"ls: {BINARY}: No such file or directory\n"

FAKE_ADB = textwrap.dedent('''\
    #!{python}
    """Answers like adb from the replies in adb.json; logs every argv to calls.jsonl."""
    import json, sys, time
    from pathlib import Path

    here = Path(__file__).parent
    replies = json.loads((here / "adb.json").read_text())
    args = sys.argv[1:]
    with open(here / "calls.jsonl", "a") as log:
        log.write(json.dumps(args) + "\\n")
    if args == ["devices"]:
        reply = replies["devices"]
    elif args[:1] == ["-s"] and args[2:3] == ["push"]:
        reply = replies["push"]
    elif args[:1] == ["-s"] and args[2:4] == ["shell", "ls"]:
        reply = replies["ls"]
    elif args[:1] == ["-s"] and args[2:3] == ["shell"]:
        reply = replies["benchmark"]
    else:
        reply = {{"stdout": "fake adb: unexpected arguments\\n", "exit": 1}}
    time.sleep(reply.get("sleep", 0))
    sys.stdout.write(reply.get("stdout", ""))
    sys.exit(reply.get("exit", 0))
''')


class FakeAdb:
    """A fake `adb` first on PATH: replies are set per test, received argv lists are read back."""

    def __init__(self, directory):
        self.directory = directory
        self.path = directory / "adb"
        self.path.write_text(FAKE_ADB.format(python=sys.executable))
        self.path.chmod(0o755)
        self.replies = {
            "devices": {"stdout": f"List of devices attached\n{SERIAL}\tdevice\n\n"},
            "ls": {"stdout": f"{BINARY}\n"},
            "push": {"stdout": "m.ptl: 1 file pushed, 0 skipped. 31.2 MB/s (2410 bytes in 0.001s)\n"},
            "benchmark": {"stdout": ANDROID_OUTPUT},
        }
        self.save()

    def reply(self, command, stdout="", exit=0, sleep=0):
        self.replies[command] = {"stdout": stdout, "exit": exit, "sleep": sleep}
        self.save()

    def save(self):
        (self.directory / "adb.json").write_text(json.dumps(self.replies))

    @property
    def calls(self):
        log = self.directory / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def fake_adb(tmp_path, monkeypatch):
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    return FakeAdb(directory)


@pytest.fixture
def artifact(tmp_path):
    path = tmp_path / "artifacts" / "mobilenet_v2-xnnpack.ptl"
    path.parent.mkdir()
    path.write_bytes(b"PK\x03\x04 not really a model")
    return path


def bench(artifact, **overrides):
    options = {"serial": SERIAL, "input_dims": [1, 3, 224, 224], **overrides}
    return device.benchmark_on_device(artifact, **options)


# parse_speed_benchmark / format_speed_benchmark_line

@pytest.mark.parametrize("output, us_per_iter, iters_per_second", [
    (ANDROID_OUTPUT, 121318.0, 8.24281),
    (NNAPI_OUTPUT, 36012.7, 27.768),
])
def test_parses_the_android_outputs_of_the_seeds(output, us_per_iter, iters_per_second):
    assert device.parse_speed_benchmark(output) == {"us_per_iter": us_per_iter, "iters_per_second": iters_per_second}


def test_parses_the_ios_testapp_output_and_converts_milliseconds():
    parsed = device.parse_speed_benchmark(IOS_OUTPUT)
    assert parsed["us_per_iter"] == pytest.approx(28767.0, rel=1e-12)
    assert parsed["iters_per_second"] == 34.762


def test_ignores_the_per_run_observer_lines_of_report_pep():
    observer = '\n'.join(f'PyTorchObserver {{"type": "NET", "unit": "us", "metric": "latency", "value": "{v}"}}'
                         for v in (120000, 125000))
    assert device.parse_speed_benchmark(observer + "\n" + ANDROID_OUTPUT)["us_per_iter"] == 121318.0


def test_a_cut_off_rate_is_the_exact_inverse_of_the_per_iter_figure():
    assert device.parse_speed_benchmark("Main run finished. Microseconds per iter: 2000.") == {
        "us_per_iter": 2000.0, "iters_per_second": 500.0}


@pytest.mark.parametrize("garbage", [
    "",
    "Segmentation fault",
    "Iters per second: 8.24281",
    'CANNOT LINK EXECUTABLE "/data/local/tmp/speed_benchmark_torch": library "libc++_shared.so" not found',
])
def test_output_without_a_per_iter_figure_is_an_error(garbage):
    with pytest.raises(ValueError, match="per iter"):
        device.parse_speed_benchmark(garbage)


def test_formats_the_line_exactly_as_the_binary_prints_it():
    assert (device.format_speed_benchmark_line(121318.0, 8.24281)
            == "Main run finished. Microseconds per iter: 121318. Iters per second: 8.24281")
    assert device.format_speed_benchmark_line(36012.7, 27.768) in NNAPI_OUTPUT


@pytest.mark.parametrize("us_per_iter, iters_per_second", [
    (121318.0, 8.24281), (36012.7, 27.768), (812.345678, 1231.00455), (2_512_345.6, 0.398034)])
def test_format_and_parse_round_trip_to_six_significant_digits(us_per_iter, iters_per_second):
    line = device.format_speed_benchmark_line(us_per_iter, iters_per_second)
    parsed = device.parse_speed_benchmark(line)
    assert parsed["us_per_iter"] == pytest.approx(us_per_iter, rel=5e-6)
    assert parsed["iters_per_second"] == pytest.approx(iters_per_second, rel=5e-6)


def test_seconds_long_iterations_use_an_exponent_and_still_parse():
    line = device.format_speed_benchmark_line(2_500_000.0, 0.4)
    assert "Microseconds per iter: 2.5e+06." in line
    assert device.parse_speed_benchmark(line) == {"us_per_iter": 2_500_000.0, "iters_per_second": 0.4}


# select_device

def test_select_device_prefers_the_recipe_then_mobilebuild_then_android_serial():
    env = {"MOBILEBUILD_ADB_SERIAL": "from-mobilebuild", "ANDROID_SERIAL": "from-android"}
    assert torchscript.select_device("from-recipe", env=env) == "from-recipe"
    assert torchscript.select_device(None, env=env) == "from-mobilebuild"
    assert torchscript.select_device(None, env={"ANDROID_SERIAL": "from-android"}) == "from-android"
    assert torchscript.select_device(None, env={"MOBILEBUILD_ADB_SERIAL": "", "ANDROID_SERIAL": "x"}) == "x"
    assert torchscript.select_device(None, env={}) is None


def test_select_device_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.delenv("MOBILEBUILD_ADB_SERIAL", raising=False)
    monkeypatch.setenv("ANDROID_SERIAL", "emulator-5554")
    assert torchscript.select_device() == "emulator-5554"


# benchmark_on_device: skipped

@pytest.mark.parametrize("serial", [None, ""])
def test_no_serial_skips_without_calling_adb(fake_adb, artifact, serial):
    assert bench(artifact, serial=serial) == {
        "status": "skipped",
        "reason": "no device selected (set benchmark.device.serial in the recipe or MOBILEBUILD_ADB_SERIAL)"}
    assert fake_adb.calls == []


def test_no_adb_on_path_skips(tmp_path, monkeypatch, artifact):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert bench(artifact) == {"status": "skipped", "reason": "adb not on PATH"}
    assert bench(artifact, adb=str(empty / "adb")) == {"status": "skipped", "reason": f"adb not found: {empty / 'adb'}"}


@pytest.mark.parametrize("listing, listed", [
    ("emulator-5554\tdevice\nR3CN90XYZ\tunauthorized\n", "emulator-5554 device, R3CN90XYZ unauthorized"),
    (f"{SERIAL}\toffline\n", f"{SERIAL} offline"),
    ("", "nothing"),
])
def test_a_serial_not_listed_as_device_skips(fake_adb, artifact, listing, listed):
    fake_adb.reply("devices", "* daemon not running; starting now at tcp:5037\n* daemon started successfully\n"
                              f"List of devices attached\n{listing}\n")
    assert bench(artifact) == {"status": "skipped",
                               "reason": f"device {SERIAL} not attached (adb devices lists: {listed})"}
    assert fake_adb.calls == [["devices"]]


@pytest.mark.parametrize("exit_status", [1, 0], ids=["adb-passes-exit-status", "old-adb-always-0"])
def test_a_missing_benchmark_binary_skips_with_how_to_build_it(fake_adb, artifact, exit_status):
    fake_adb.reply("ls", MISSING_BINARY, exit=exit_status)
    result = bench(artifact)
    assert result["status"] == "skipped"
    assert result["reason"].startswith(f"{BINARY} not found on device {SERIAL}: ")
    build = "BUILD_PYTORCH_MOBILE=1 ANDROID_ABI=arm64-v8a ./scripts/build_android.sh -DBUILD_BINARY=ON"
    assert f"`{build}`" in result["reason"]
    assert f"adb -s {SERIAL} push build_android/bin/speed_benchmark_torch {BINARY}" in result["reason"]
    assert fake_adb.calls == [["devices"], ["-s", SERIAL, "shell", "ls", BINARY]]


# benchmark_on_device: ran

def test_pushes_runs_and_parses_with_the_seed_flags(fake_adb, artifact):
    result = bench(artifact)
    remote = "/data/local/tmp/mobilenet_v2-xnnpack.ptl"
    run_argv = ["-s", SERIAL, "shell", BINARY, f"--model={remote}", "--input_dims=1,3,224,224",
                "--input_type=float", "--warmup=5", "--iter=200", "--use_bundled_input=-1", "--pthreadpool_size=1"]
    assert fake_adb.calls == [
        ["devices"],
        ["-s", SERIAL, "shell", "ls", BINARY],
        ["-s", SERIAL, "push", str(artifact), remote],
        run_argv,
    ]
    assert result == {
        "status": "ran",
        "serial": SERIAL,
        "command": [str(fake_adb.path), *run_argv],
        "us_per_iter": 121318.0,
        "iters_per_second": 8.24281,
        "mean_ms": 121.318,
        "raw": ["Starting benchmark.", "Running warmup runs.", "Main runs.",
                "Main run finished. Microseconds per iter: 121318. Iters per second: 8.24281"],
    }
    json.dumps(result)


def test_bundled_input_is_index_zero_and_options_reach_the_binary(fake_adb, artifact):
    fake_adb.reply("ls", "/data/local/tmp/bin/sbt\r\n")
    fake_adb.reply("benchmark", NNAPI_OUTPUT)
    result = bench(artifact, input_dims="1,3,32,32", input_type="uint8_t", warmup=2, iters=50, threads=4,
                   use_bundled_input=True, binary="/data/local/tmp/bin/sbt")
    assert fake_adb.calls[-1][3:] == [
        "/data/local/tmp/bin/sbt", "--model=/data/local/tmp/mobilenet_v2-xnnpack.ptl", "--input_dims=1,3,32,32",
        "--input_type=uint8_t", "--warmup=2", "--iter=50", "--use_bundled_input=0", "--pthreadpool_size=4"]
    assert fake_adb.calls[1] == ["-s", SERIAL, "shell", "ls", "/data/local/tmp/bin/sbt"]
    assert (result["status"], result["us_per_iter"], result["iters_per_second"]) == ("ran", 36012.7, 27.768)
    assert result["mean_ms"] == pytest.approx(36.0127)


def test_a_name_with_a_space_is_quoted_for_the_device_shell_only(fake_adb, tmp_path):
    spaced = tmp_path / "my model.ptl"
    spaced.write_bytes(b"model")
    assert bench(spaced)["status"] == "ran"
    push, run = fake_adb.calls[2], fake_adb.calls[3]
    assert push == ["-s", SERIAL, "push", str(spaced), "/data/local/tmp/my model.ptl"]
    assert run[4] == "'--model=/data/local/tmp/my model.ptl'"


# benchmark_on_device: failed

def test_a_failing_binary_reports_the_output_tail_and_no_figures(fake_adb, artifact):
    fake_adb.reply("benchmark", "Model does not have bundled inputs.  Before saving,\n"
                                "use torch.utils.bundled_inputs.augment_model_with_bundled_inputs.\n", exit=1)
    assert bench(artifact, use_bundled_input=True) == {
        "status": "failed",
        "reason": "speed_benchmark_torch exited with status 1: Model does not have bundled inputs.  Before saving, "
                  "| use torch.utils.bundled_inputs.augment_model_with_bundled_inputs."}


def test_unparsable_output_with_exit_status_0_fails(fake_adb, artifact):
    # Adb before Android 7 does not pass the device command's exit status on.
    fake_adb.reply("benchmark", "Starting benchmark.\nRunning warmup runs.\nSegmentation fault\n")
    result = bench(artifact)
    assert result["status"] == "failed"
    assert set(result) == {"status", "reason"}
    assert result["reason"].startswith("speed_benchmark_torch: no 'Microseconds per iter'")
    assert result["reason"].endswith("Starting benchmark. | Running warmup runs. | Segmentation fault")
    assert "\n" not in result["reason"]


def test_a_long_tail_is_cut_to_one_bounded_line(fake_adb, artifact):
    fake_adb.reply("benchmark", "x" * 5000 + "\nterminate called after throwing an instance of 'c10::Error'\n",
                   exit=134)
    reason = bench(artifact)["reason"]
    assert reason.startswith("speed_benchmark_torch exited with status 134: ...")
    assert reason.endswith("terminate called after throwing an instance of 'c10::Error'")
    assert len(reason) < 500


def test_a_failed_push_fails_before_running(fake_adb, artifact):
    fake_adb.reply("push", "adb: error: failed to copy 'm.ptl' to '/data/local/tmp/m.ptl': No space left on device\n",
                   exit=1)
    result = bench(artifact)
    assert result == {"status": "failed",
                      "reason": "adb push exited with status 1: adb: error: failed to copy 'm.ptl' to "
                                "'/data/local/tmp/m.ptl': No space left on device"}
    assert len(fake_adb.calls) == 3


def test_a_failing_adb_devices_fails(fake_adb, artifact):
    fake_adb.reply("devices", "adb: failed to check server version: cannot connect to daemon\n", exit=1)
    assert bench(artifact) == {
        "status": "failed",
        "reason": "adb devices exited with status 1: adb: failed to check server version: cannot connect to daemon"}


def test_a_missing_artifact_fails_before_pushing(fake_adb, tmp_path):
    result = bench(tmp_path / "absent.ptl")
    assert result == {"status": "failed", "reason": f"artifact {tmp_path / 'absent.ptl'} does not exist"}
    assert [call[2] for call in fake_adb.calls[1:]] == ["shell"]


def test_a_hung_benchmark_times_out(fake_adb, artifact):
    fake_adb.reply("benchmark", ANDROID_OUTPUT, sleep=30)
    result = bench(artifact, timeout=1)
    assert result["status"] == "failed"
    assert result["reason"].startswith("speed_benchmark_torch timed out after 1 s")

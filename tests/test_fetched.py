"""What a file fetched from the shared cache must be before the build reads it back (build/fetched.py): the stages'
own outputs pass, a pickle that would call anything else is refused without being unpickled."""

import os
import pickle
import zipfile

import pytest
import torch
from torch import nn

from mobilebuild.engine import fetched
from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import calibration, fuse, modeling, quantize

INPUTS = [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]


class Payload:
    """What a cache poisoner stores: unpickling it runs a shell command that leaves a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def stage_outputs(folder):
    """A file of each form the weights stages write: checkpoint, fused, quantized (eager, FX, dynamic), fp16."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2)).eval()
    files = {"checkpoint": model.state_dict()}
    fused, _ = fuse.fuse(model, "auto")
    files["fused"] = fused.state_dict()
    batches = calibration.batches({"source": "random", "batches": 2, "seed": 0}, INPUTS)
    files["eager int8"] = quantize.static(fused, "qnnpack", batches, "per_channel", specs=INPUTS).state_dict()
    files["fx int8"] = {quantize.GRAPH_MODE: "fx", "state_dict": files["eager int8"]}
    files["dynamic int8"] = {"mode": "dynamic"}
    files["fp16"] = nn.Linear(2, 2).half().state_dict()
    paths = {}
    for name, state in files.items():
        paths[name] = folder / f"{name.replace(' ', '-')}.pt"
        modeling.save(state, paths[name])
    return paths


def test_every_global_allowed_here_is_allowed_by_torchs_weights_only_load():
    allowed = {tuple(name.rsplit(".", 1)) for name in torch._weights_only_unpickler._get_allowed_globals()}
    assert fetched._TENSOR_GLOBALS <= allowed


def test_the_stages_weights_files_pass_and_load_weights_only(tmp_path):
    for name, path in stage_outputs(tmp_path).items():
        assert fetched.problem(path, "weights") is None, name
        modeling.load_weights_only(path, field=None)


def test_a_pickle_that_would_run_code_is_refused_unread(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "fused.pt"
    modeling.save({"weight": torch.ones(2), "payload": Payload(marker)}, path)

    assert fetched.problem(path, "weights") == "holds code, not only tensors (would call posix.system)"
    with pytest.raises(MobileBuildError, match=r"fused.pt was refused: it carries code, not only tensors"):
        modeling.load_weights_only(path, field=None)
    assert not marker.exists()


def archive(path, pickled):
    """A torch.save-like archive around any pickle."""
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("archive/data.pkl", pickled)
        out.writestr("archive/version", "3\n")
    return path


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_every_way_a_pickle_names_a_global_is_seen(tmp_path, protocol):
    pickled = pickle.dumps(Payload(tmp_path / "ran"), protocol=protocol)  # GLOBAL, then STACK_GLOBAL with memo
    assert "posix.system" in fetched.problem(archive(tmp_path / "p.pt", pickled), "weights")


def test_a_global_whose_name_the_pickle_computes_is_refused(tmp_path):
    # STACK_GLOBAL whose module name comes from a tuple's element, not a string pushed just before
    computed = b"\x80\x04(\x8c\x05posix\x8c\x01xt\x8c\x06system\x93."
    assert fetched.problem(archive(tmp_path / "p.pt", computed), "weights") == \
        "holds code, not only tensors (would call a computed name)"


@pytest.mark.parametrize("content, form, expected", [
    (b"not a zip at all", "weights", "not a PyTorch archive"),
    (b"not a zip at all", "torchscript", "not a PyTorch archive"),
])
def test_what_is_no_archive_is_refused(tmp_path, content, form, expected):
    (tmp_path / "f.pt").write_bytes(content)
    assert fetched.problem(tmp_path / "f.pt", form).startswith(expected)


def test_torchscript_archives_pass_and_weights_files_do_not(tmp_path):
    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(nn.Linear(2, 2)), str(scripted))
    assert fetched.problem(scripted, "torchscript") is None
    weights = stage_outputs(tmp_path)["fused"]
    assert fetched.problem(weights, "torchscript") == "not a TorchScript archive"
    assert fetched.problem(scripted, "weights") is not None  # its pickle names TorchScript classes

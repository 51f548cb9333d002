"""worker/reproducible.py: archives that read the same wherever, and after whatever edit of mobilebuild, they
were built."""

import hashlib
import pickle
import zipfile

import torch

from mobilebuild.worker import reproducible

TRACING_SITE = '''
def trace(model, example):
    return torch.jit.trace(model, example)
'''


def _traced_from(source_file, blank_lines, path, root):
    """Trace a small model from a function whose frame reads as `source_file`, `blank_lines` lines further down,
    save it to `path` and normalise it against `root`."""
    namespace = {"torch": torch}
    exec(compile("\n" * blank_lines + TRACING_SITE, str(source_file), "exec"), namespace)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    with reproducible.jit_session():
        traced = namespace["trace"](model, torch.randn(1, 4))
    path.parent.mkdir(parents=True)
    traced.save(str(path))
    reproducible.normalize_archive(path, root)
    return path


def _debug_text(path):
    with zipfile.ZipFile(path) as archive:
        return "".join(str(pickle.loads(archive.read(name))) for name in archive.namelist()
                       if name.endswith(".debug_pkl"))


def test_our_frames_lose_their_line_numbers_so_editing_the_tool_keeps_the_bytes(tmp_path):
    root = tmp_path / "checkout"
    own = root / "mobilebuild" / "worker" / "tracing_site.py"
    paths = []
    for blank_lines in (0, 7):  # the same call site, moved down by an edit above it
        paths.append(_traced_from(own, blank_lines, tmp_path / f"moved-{blank_lines}" / "model.pt", root))
    digests = {hashlib.sha256(path.read_bytes()).hexdigest() for path in paths}
    assert len(digests) == 1
    text = _debug_text(paths[0])
    assert "mobilebuild/worker/tracing_site.py: trace" in text
    assert str(root) not in text
    loaded = torch.jit.load(str(paths[0]))  # the rewritten debug info still loads, and the model runs
    assert loaded(torch.randn(2, 4)).shape == (2, 3)


def test_a_models_own_frames_keep_their_line_numbers(tmp_path):
    root = tmp_path / "checkout"
    model_code = root / "models" / "site.py"
    paths = [_traced_from(model_code, blank_lines, tmp_path / f"model-{blank_lines}" / "model.pt", root)
             for blank_lines in (0, 7)]
    assert "models/site.py(3): trace" in _debug_text(paths[0])
    assert "models/site.py(10): trace" in _debug_text(paths[1])

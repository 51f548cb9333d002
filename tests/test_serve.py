"""The stage worker's run_stage (worker/serve.py): the warnings it keeps off the console."""

import subprocess
import sys
import textwrap

from conftest import REPO

COPIES_A_PYTREE_SPEC = textwrap.dedent('''
    import copy
    import warnings

    from torch.utils import _pytree


    def run(inputs, config, output):
        warnings.warn("a warning of the model's own", UserWarning)
        copy.deepcopy(_pytree.tree_flatten([1])[1])  # torch.export's graphs hold such specs
        output.write_text("done")
''')


def test_torchs_leafspec_deprecation_is_dropped_and_other_warnings_pass(tmp_path):
    """A deep copy of a pytree spec warns "`isinstance(treespec, LeafSpec)` is deprecated" from copyreg, where the
    module filters for torch miss it (timm's EfficientFormerV2 printed it in its et-int8 per-layer diagnosis)."""
    (tmp_path / "copying_stage.py").write_text(COPIES_A_PYTREE_SPEC)
    call = (f"from mobilebuild.worker import serve; serve.run_stage(None, {{}}, {{}}, {str(tmp_path / 'out.txt')!r}, "
            f"{str(tmp_path)!r}, module='copying_stage', config_type='types:SimpleNamespace')")
    # a process of its own, as a stage worker is: pytest records warnings instead of printing them
    printed = subprocess.run([sys.executable, "-c", call], cwd=REPO, capture_output=True, text=True, timeout=120,
                             check=True).stderr
    assert (tmp_path / "out.txt").read_text() == "done"
    assert "a warning of the model's own" in printed
    assert "LeafSpec" not in printed, printed

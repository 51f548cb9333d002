"""report.py: report.md and report.html written from hand-made manifests, the same bytes for the same input, and
`main` over a folder of manifests."""

import copy
import sys

from report_manifests import HEADER, full_manifest, manifest_file, write

from mobilebuild.results import report


def test_full_manifest_computes_speed_up_and_size_ratio_against_eager(tmp_path):
    paths, markdown, page = write([full_manifest()], tmp_path)

    assert paths == [tmp_path / "report.md", tmp_path / "report.html"]  # the figures are the plot stage's
    # speed-up = eager median / target median: 12.6 / 6.0 = 2.10, 12.6 / 4.2 = 3.00;
    # size ratio = target bytes / eager bytes: 14.7 / 14.0 = 1.05, 3.5 / 14.0 = 0.25.
    assert HEADER in markdown
    assert ("| eager fp32 | reference | PyTorch eager, fp32 | 12.60 | 13.40 | 1.00x | 14.00 | 1.00x | — | — |"
            in markdown)
    assert ("| xnnpack | passed | PyTorch Mobile, xnnpack, fp32 | 6.00 | 6.50 | 2.10x | 14.70 | 1.05x | 104.3 "
            "| 1.000 |" in markdown)
    assert ("| qnnpack | FAILED | PyTorch Mobile, qnnpack, int8 | 4.20 | 5.10 | 3.00x | 3.50 | 0.25x | 12.5 "
            "| 0.500 |" in markdown)
    assert "accuracy" not in markdown.split("| target |")[1].split("\n")[0]  # no labelled data: no column
    # what a person reads for one target rather than compares sits in a second table, only with what was measured
    assert "| target | cosine | max rel. error |" in markdown and "| qnnpack | 0.973148 | 2.10e-01 |" in markdown
    assert "compression" not in markdown and "sparsity" not in markdown
    assert "- Toolchain: mobilebuild 0.1.0, python 3.11.7, torch 2.12.1, torchvision 0.27.1" in markdown
    assert "- Host: cores 2, cpu Intel Xeon, machine x86_64" in markdown
    assert "- mnv2: 2 target(s): 1 passed, 1 FAILED" in markdown
    assert "Recipe recipes/mnv2.yaml, sha256 0123456789ab." in markdown
    assert "- qnnpack: sqnr_db 12.46 < 20\n- qnnpack: top1_agreement 0.5 < 0.99" in markdown
    assert "- device: skipped (adb not on PATH)" in markdown
    assert "](plots/mnv2.png)" in markdown

    # what to ship comes first: the faster qnnpack failed, and the reason is given
    assert ("**Ship xnnpack (PyTorch Mobile, xnnpack, fp32): the fastest of 1 artifact(s) verified on this host that "
            "pass the default thresholds; 6.00 ms median (2.10x eager fp32), 14.70 MB, SQNR 104.3 dB, top-1 agreement "
            "1.000.**" in markdown)
    assert ("- Faster, but left out: qnnpack (4.20 ms): FAILED (SQNR dB 12.5 < 20, cosine 0.973 < 0.9999, "
            "max rel. error 0.21 > 0.01, top-1 agreement 0.5 < 0.99)." in markdown)

    # The HTML page says the same, with the failed row marked and the columns under their headings.
    assert '<td class="num">2.10x</td>' in page and '<td class="num">0.25x</td>' in page
    failed_row = next(line for line in page.splitlines() if line.startswith("<tr") and ">qnnpack<" in line)
    assert failed_row.startswith('<tr class="failed">') and '<td class="status">FAILED</td>' in failed_row
    assert ('<tr class="groups"><th colspan="3"></th><th colspan="3">latency on the host</th>'
            '<th colspan="2">size</th><th colspan="2">quality vs eager fp32</th></tr>') in page
    assert '<div class="ship">' in page and "<details>" in page
    assert '<img src="plots/mnv2.png"' in page
    assert "<li>qnnpack: sqnr_db 12.46 &lt; 20</li>" in page


def test_output_is_byte_identical_for_the_same_input(tmp_path):
    manifests = [full_manifest(), {**full_manifest(), "recipe": "second"}]
    first = {p.name: p.read_bytes() for p in report.write_report(manifests, tmp_path)}
    again = {p.name: p.read_bytes() for p in report.write_report(copy.deepcopy(manifests), tmp_path)}
    elsewhere = {p.name: p.read_bytes() for p in report.write_report(manifests, tmp_path / "elsewhere")}
    assert sorted(first) == ["report.html", "report.md"]
    assert first == again == elsewhere


def test_a_recipe_without_benchmarks_gets_no_plots(tmp_path):
    manifest = full_manifest()
    del manifest["benchmarks"]
    paths, markdown, page = write([manifest], tmp_path)
    assert paths == [tmp_path / "report.md", tmp_path / "report.html"]
    assert "plots/" not in markdown and "<img" not in page
    assert "No plots: no benchmark ran for this recipe." in markdown and "No plots" in page
    assert "- Host: no benchmark recorded one" in markdown


def test_main_writes_the_report_or_says_there_is_nothing_to_report(tmp_path, capsys):
    assert report.main(tmp_path) == 2
    assert "no manifests in" in capsys.readouterr().err

    manifest_file(tmp_path, "mnv2", full_manifest())
    assert report.main(tmp_path) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "report.html") in out
    assert (tmp_path / "report.md").read_text().startswith("# mobilebuild report")
    assert not (tmp_path / "plots").exists()  # the build's plot stage draws them
    assert out.strip().endswith("report.md: 1 recipe(s) built (mnv2)")


def test_the_report_line_says_which_recipes_it_covers_and_which_it_does_not(tmp_path, capsys):
    """A broken recipe's build printed "wrote ... (7 recipe(s))" right after saying the report was skipped."""
    manifest_file(tmp_path, "mnv2", full_manifest())
    manifest_file(tmp_path, "bad", {**full_manifest(), "recipe": "bad"})  # an earlier build's: left out
    assert report.main(tmp_path, {"bad": ["checkpoint:bad: recipes/bad.yaml: input.shape: ..."]}) == 0
    assert capsys.readouterr().out.strip().endswith(
        "report.md: 1 recipe(s) built (mnv2); NOT BUILT, listed with their errors: bad")


def test_report_does_not_import_torch():
    import subprocess

    code = "import sys, mobilebuild.results.report; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from mobilebuild.engine import actions
from mobilebuild.results import report
failed = actions.write_report()
print("task:", failed.message if failed else None)
sys.exit(report.main("artifacts"))
"""


def test_a_report_a_full_disk_keeps_from_being_written_is_one_line_and_no_partial_file(tmp_path):
    """As the build's report task and as `doit report` (and the report a failed build writes): the line a stage's
    write gives, never a traceback (a 24 KB tmpfs as artifacts/ printed 30 lines of one)."""
    import subprocess

    manifest_file(tmp_path / "artifacts", "mnv2", full_manifest())
    done = subprocess.run([sys.executable, "-c", FULL_DISK], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    line = "cannot write artifacts/report.html: File too large"  # report.md fits, and is not written without it
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == f"task: {line}\n" and done.stderr == f"{line}\n"
    assert sorted(path.name for path in (tmp_path / "artifacts").iterdir()) == ["mnv2"]

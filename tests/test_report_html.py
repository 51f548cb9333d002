"""report_html.py: one self-contained page, every text from the manifest escaped."""

import html
import json
import re
import shutil
import subprocess

import pytest
from report_manifests import compressed_manifest, full_manifest, write


def test_html_is_self_contained(tmp_path):
    _, _, page = write([full_manifest()], tmp_path)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page
    for external in ("<script", "<link", "http://", "https://", "@import", "url("):
        assert external not in page


def test_html_escapes_every_text_from_the_manifest(tmp_path):
    manifest = full_manifest()
    manifest["recipe"] = "x<b>"
    manifest["targets"][0].update(target="<script>alert(1)</script>", status="not run on host",
                                  reason='needs <NEON> & "fp16"')
    _, markdown, page = write([manifest], tmp_path)
    assert "<script" not in page and "<b>" not in page and "<NEON>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "not run on host (&lt;script&gt;alert(1)&lt;/script&gt;): needs &lt;NEON&gt; &amp; &quot;fp16&quot;" in page
    assert "<h2>x&lt;b&gt;</h2>" in page
    assert '<img src="plots/x_b_.png"' in page  # and the file name is made safe
    assert 'not run on host (<script>alert(1)</script>): needs <NEON> & "fp16"' in markdown


PROBE = """<script>
const boxes = [...document.querySelectorAll(".scroll, td, th, li, p")];
document.body.dataset.widths = JSON.stringify({
  page: document.documentElement.scrollWidth, window: window.innerWidth,
  overflowing: boxes.filter(box => box.scrollWidth > box.clientWidth + 1).map(box => box.textContent.slice(0, 60))});
</script>"""


def wide_manifest():
    """What made the examples' tables too wide for 1,000 px: long target names, ExecuTorch's runs-on, accuracy
    with its reference, the pruned target's loss and the relaxed status."""
    manifest = compressed_manifest()
    for entry in manifest["targets"]:
        entry.update(target=f"mobilenet_v2-et-xnnpack-{entry['target']}-per-channel", runtime="executorch")
    manifest["verification"] = {f"mobilenet_v2-et-xnnpack-{name}-per-channel": {
        **found, "relaxed": {"sqnr_db": {"used": 20, "default": 30}},
        "metrics": {**found["metrics"], "accuracy_reference": 0.9031, "accuracy_artifact": 0.9012,
                    "top1_agreement": 0.92},
        "against_unpruned": {"accuracy_reference": 0.995, "accuracy_artifact": 0.9012, "sqnr_db": 12.0}}
        for name, found in manifest["verification"].items()}
    manifest["benchmarks"] = {f"mobilenet_v2-et-xnnpack-{name}-per-channel" if name != "eager" else name: found
                              for name, found in manifest["benchmarks"].items()}
    return manifest


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_page_fits_1000_px_without_a_horizontal_scrollbar(tmp_path):
    """Rendered by headless Chromium in a 1,000 px window: the page no wider than the window, and no table, cell or
    line that scrolls or clips its text."""
    _, _, page = write([wide_manifest()], tmp_path)
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1000,3000",
                          "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120).stdout
    widths = json.loads(html.unescape(re.search(r'data-widths="([^"]*)"', dom).group(1)))
    assert widths["window"] == 1000
    assert widths["page"] <= widths["window"], widths
    assert widths["overflowing"] == [], widths

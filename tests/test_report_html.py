"""report_html.py: one self-contained page, every text from the manifest escaped."""

from report_manifests import full_manifest, write


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

"""report_markdown.py: table cells and list items that stay what they are, whatever the manifest says."""

from report_manifests import HEADER, full_manifest, write


def test_markdown_keeps_pipes_inside_table_cells_and_a_multi_line_reason_on_one_line(tmp_path):
    manifest = full_manifest()
    manifest["targets"][0].update(target="x | y", status="not run on host", reason="a | b\nTraceback: line 2")
    _, markdown, _ = write([manifest], tmp_path)
    row = next(line for line in markdown.splitlines() if line.startswith("| x \\| y |"))
    assert row.replace("\\|", "").count("|") == HEADER.count("|")  # as many columns as the header
    assert "- not run on host (x | y): a | b Traceback: line 2" in markdown

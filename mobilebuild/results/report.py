"""artifacts/report.md and report.html from every recipe's manifest: `doit report`, and the build's last step. No torch
here.

What the report says is report_data's (the same manifests always give byte-identical files); report_markdown and
report_html render it.
"""

import sys
from pathlib import Path

from mobilebuild import store
from mobilebuild.results import report_data, report_html, report_markdown


def write_report(manifests, out_dir, unbuilt=None):
    """Write out_dir/report.md and report.html (the figures are the plot stage's); return the paths written.
    `unbuilt`: {recipe: [error line, ...]} for recipes that failed to build, listed in the summary."""
    out_dir = Path(out_dir)
    report = report_data.build(manifests, unbuilt)
    written = []
    for name, text in (("report.md", report_markdown.render(report)), ("report.html", report_html.render(report))):
        store.write_text(out_dir / name, text)
        written.append(out_dir / name)
    return written


def main(artifacts_dir="artifacts", unbuilt=None):
    """Write the report from every recipe's manifest; `unbuilt` as in write_report (keyed by recipe name or file),
    whose manifests, if any, are left out: they describe an earlier build."""
    unbuilt = unbuilt or {}
    manifests = [m for m in report_data.load_manifests(artifacts_dir)
                 if report_data.recipe_name(m) not in unbuilt and m.get("recipe_file") not in unbuilt]
    if not manifests and not unbuilt:
        print(f"no manifests in {Path(artifacts_dir) / '*' / 'manifest.json'}: build first (doit)", file=sys.stderr)
        return 2
    write_report(manifests, artifacts_dir, unbuilt)
    print(f"wrote {Path(artifacts_dir) / 'report.html'} and report.md: {covers(manifests, unbuilt)}")
    return 0


def covers(manifests, unbuilt):
    """'2 recipe(s) built (digits, topics); NOT BUILT, listed with their errors: bad': what the report covers."""
    built = sorted(report_data.recipe_name(manifest) for manifest in manifests)
    text = f"{len(built)} recipe(s) built ({', '.join(built)})" if built else "no recipe built"
    return text + (f"; NOT BUILT, listed with their errors: {', '.join(sorted(unbuilt))}" if unbuilt else "")

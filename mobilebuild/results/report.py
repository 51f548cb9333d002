"""artifacts/report.md and report.html from every recipe's manifest: `doit report`, and the build's last step. No torch
here.

What the report says is report_data's (the same manifests always give byte-identical files); report_markdown and
report_html render it.
"""

import contextlib
import sys
from pathlib import Path

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.results import report_data, report_html, report_markdown


def write_report(manifests, out_dir, unbuilt=None):
    """Write out_dir/report.md and report.html (the figures are the plot stage's); return the paths written.
    `unbuilt`: {recipe: [error line, ...]} for recipes that failed to build, listed in the summary."""
    out_dir = Path(out_dir)
    report = report_data.build(manifests, unbuilt)
    pages = {out_dir / "report.md": report_markdown.render(report), out_dir / "report.html": report_html.render(report)}
    writing = None
    try:  # both written before either replaces the last report: never a new report.md beside an old report.html
        with contextlib.ExitStack() as stack:
            for path, text in pages.items():
                writing = path
                stack.enter_context(store.atomic_output(path)).write_text(text, encoding="utf-8")
    except OSError as exc:  # a full disk, a read-only folder: one line, as a stage's write says it
        raise MobileBuildError(f"cannot write {writing}: {exc.strerror or exc}") from None
    return list(pages)


def main(artifacts_dir="artifacts", unbuilt=None):
    """Write the report from every recipe's manifest, saying so in one line; `unbuilt` as in write_report (keyed by
    recipe name or file), whose manifests, if any, are left out: they describe an earlier build. Returns 0, 1 where
    it could not write (the line on stderr says why), 2 where there is nothing to report."""
    try:
        said = write_all(artifacts_dir, unbuilt)
    except MobileBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    if said is None:
        print(nothing_to_report(artifacts_dir), file=sys.stderr)
        return 2
    print(said)
    return 0


def nothing_to_report(artifacts_dir):
    return f"no manifests in {Path(artifacts_dir) / '*' / 'manifest.json'}: build first (doit)"


def write_all(artifacts_dir, unbuilt=None):
    """main's report: the line that says what it covers, or None where there is nothing to report; raises
    MobileBuildError where it cannot write."""
    unbuilt = unbuilt or {}
    manifests = [m for m in report_data.load_manifests(artifacts_dir)
                 if report_data.recipe_name(m) not in unbuilt and m.get("recipe_file") not in unbuilt]
    if not manifests and not unbuilt:
        return None
    write_report(manifests, artifacts_dir, unbuilt)
    return f"wrote {Path(artifacts_dir) / 'report.html'} and report.md: {covers(manifests, unbuilt)}"


def covers(manifests, unbuilt):
    """'2 recipe(s) built (digits, topics); NOT BUILT, listed with their errors: bad': what the report covers."""
    built = sorted(report_data.recipe_name(manifest) for manifest in manifests)
    text = f"{len(built)} recipe(s) built ({', '.join(built)})" if built else "no recipe built"
    return text + (f"; NOT BUILT, listed with their errors: {', '.join(sorted(unbuilt))}" if unbuilt else "")

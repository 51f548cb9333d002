"""report.html: the report (report_data) as one self-contained page, its style included. No torch here."""

import html

from mobilebuild.results import report_arm64
from mobilebuild.results.report_data import (
    GENERATION_TITLE,
    LAYERS_TITLE,
    RELAXED,
    TITLE,
    file_stem,
    plot_href,
    plot_title,
)

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #1f2328;
       margin: 2em auto; max-width: 1400px; padding: 0 1em; line-height: 1.45; }
h1 { border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
h2 { margin-top: 2em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
.ship { border-left: 4px solid #1a7f37; background: #f0fff4; padding: .5em 1em; margin: 1em 0; }
.ship p { margin: 0 0 .3em 0; font-weight: 600; }
.ship ul { margin: 0; padding-left: 1.2em; font-size: 14px; }
.ship.none { border-left-color: #9a6700; background: #fff8c5; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 6px; }
th { background: #f6f8fa; }
thead tr.groups th { font-weight: normal; color: #59636e; font-size: 13px; }
td.status { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
ul.summary li.not-built { color: #cf222e; font-weight: 600; }
ul.summary li.failed { color: #9a6700; }
tr.reference td { background: #f6f8fa; font-style: italic; }
tr.failed td { background: #ffebe9; }
tr.failed td.status { color: #cf222e; font-weight: bold; }
tr.passed td.status { color: #1a7f37; }
tr.not-run td.status, tr.relaxed td.status { color: #9a6700; }
details { margin: .5em 0; }
summary { cursor: pointer; color: #0969da; font-size: 14px; }
.failures { border-left: 4px solid #cf222e; background: #fff5f5; padding: .5em 1em; margin: 1em 0; }
.failures h3 { color: #cf222e; margin: 0; font-size: 1em; }
ul.notes { color: #59636e; font-size: 14px; }
figure { margin: 1em 0 0 0; }
figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption { font-size: 13px; color: #59636e; }
"""


def _row_class(state, status):
    if status == RELAXED:
        return "relaxed"
    return state if state in ("reference", "passed", "failed") else "not-run"


def _table(table):
    e = html.escape
    out = ['<div class="scroll">', "<table>", "<thead>"]
    groups = table.groups()
    if any(name for name, _ in groups):
        out.append('<tr class="groups">' + "".join(
            f'<th colspan="{span}">{e(name)}</th>' if span > 1 else f"<th>{e(name)}</th>" for name, span in groups)
            + "</tr>")
    out += ["<tr>" + "".join(f"<th>{e(h)}</th>" for h in table.header) + "</tr>", "</thead>", "<tbody>"]
    for state, row in zip(table.states, table.cells):
        status = row[table.header.index("status")] if "status" in table.header else None
        cells = []
        for column, cell in zip(table.columns, row):
            kind = "status" if column.name == "status" else "num" if column.numeric else None
            cells.append(f'<td class="{kind}">{e(cell)}</td>' if kind else f"<td>{e(cell)}</td>")
        out.append(f'<tr class="{_row_class(state, status)}">{"".join(cells)}</tr>')
    return out + ["</tbody>", "</table>", "</div>"]


def render(report):
    """The page for a report_data.Report."""
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{e(TITLE)}</title>",
           f"<style>{CSS}</style>", "</head>", "<body>", f"<h1>{e(TITLE)}</h1>", "<ul>"]
    out += [f"<li>{e(line)}</li>" for line in report.about]
    out += ["</ul>", "<h2>Summary</h2>", '<ul class="summary">']
    states = report.summary_states or ["built"] * len(report.summary)
    out += [f'<li class="{state}">{e(line)}</li>' for state, line in zip(states, report.summary)]
    out.append("</ul>")
    for section in report.sections:
        out.append(f'<section id="{e(file_stem(section.recipe))}">')
        out.append(f"<h2>{e(section.recipe)}</h2>")
        out += [f"<p>{e(line)}</p>" for line in section.about]
        if section.recommendation:
            first, *rest = section.recommendation
            shipping = "ship" if first.startswith("Ship ") else "ship none"
            out += [f'<div class="{shipping}">', f"<p>{e(first)}</p>"]
            out += ["<ul>"] + [f"<li>{e(line)}</li>" for line in rest] + ["</ul>"] if rest else []
            out.append("</div>")
        out += _table(section.table)
        if section.details:
            out += ["<details>", "<summary>Details: compression, more metrics, the graph</summary>"]
            out += _table(section.details) + ["</details>"]
        if section.generation:
            out += [f"<h3>{e(GENERATION_TITLE)}</h3>"] + _table(section.generation)
        if section.arm64:
            out += [f"<h3>{e(report_arm64.TITLE)}</h3>"] + _table(section.arm64)
            out += ['<ul class="notes">'] + [f"<li>{e(note)}</li>" for note in section.arm64_notes] + ["</ul>"]
        if section.layers or section.layers_notes:
            out += ["<details>", f"<summary>{e(LAYERS_TITLE)}</summary>"]
            out += _table(section.layers) if section.layers else []
            out += ["<ul>"] + [f"<li>{e(note)}</li>" for note in section.layers_notes] + ["</ul>", "</details>"]
        if section.failures:
            out += ['<div class="failures">', "<h3>Failures</h3>", "<ul>"]
            out += [f"<li>{e(failure)}</li>" for failure in section.failures]
            out += ["</ul>", "</div>"]
        if section.notes:
            out += ['<ul class="notes">'] + [f"<li>{e(note)}</li>" for note in section.notes] + ["</ul>"]
        if section.no_plots:
            out.append(f"<p>{e(section.no_plots)}</p>")
        if section.plot:
            title = plot_title(section.recipe)
            out += ["<figure>", f'<img src="{e(plot_href(section.plot))}" alt="{e(title)}">',
                    f"<figcaption>{e(title)}</figcaption>", "</figure>"]
        out.append("</section>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)

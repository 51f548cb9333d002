"""report.md: the report (report_data) in Markdown. No torch here."""

from mobilebuild.results import report_arm64
from mobilebuild.results.report_data import GENERATION_TITLE, LAYERS_TITLE, TITLE, plot_href, plot_title


def _one_line(text):
    """A reason may be a multi-line message; in Markdown a stray line break can end a list or a table."""
    return " ".join(text.split())


def _cell(text):
    return _one_line(text.replace("\\", "\\\\").replace("|", "\\|"))


def _list(items):
    return [f"- {_one_line(item)}" for item in items]


def _table(table, header=None):
    lines = ["| " + " | ".join(_cell(h) for h in header or table.header) + " |",
             "|" + "|".join("---:" if numeric else "---" for numeric in table.numeric) + "|"]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.cells] + [""]


def _arm64_table(table):
    """Markdown has no grouped headings: each CPU model's columns carry its name."""
    return _table(table, [f"{column.group} {column.name}".strip() for column in table.columns])


def render(report):
    """The Markdown for a report_data.Report."""
    lines = [f"# {TITLE}", ""]
    lines += _list(report.about) + ["", "## Summary", ""]
    lines += _list(report.summary) + [""]
    for section in report.sections:
        lines += [f"## {_one_line(section.recipe)}", ""]
        lines += [*map(_one_line, section.about), ""] if section.about else []
        if section.recommendation:
            first, *rest = section.recommendation
            lines += [f"**{_one_line(first)}**", ""] + (_list(rest) + [""] if rest else [])
        lines += _table(section.table)
        if section.details:
            lines += ["**Details:**", ""] + _table(section.details)
        if section.generation:
            lines += [f"**{GENERATION_TITLE}:**", ""] + _table(section.generation)
        if section.arm64:
            lines += [f"**{report_arm64.TITLE}:**", ""] + _arm64_table(section.arm64)
            lines += _list(section.arm64_notes) + [""]
        if section.layers or section.layers_notes:
            lines += [f"**{LAYERS_TITLE}:**", ""] + (_table(section.layers) if section.layers else [])
            lines += _list(section.layers_notes) + [""]
        if section.failures:
            lines += ["**Failures:**", ""] + _list(section.failures) + [""]
        if section.notes:
            # A heading of its own: in Markdown, two lists separated only by a blank line merge into one.
            lines += ["**Notes:**", ""] + _list(section.notes) + [""]
        if section.no_plots:
            lines += [section.no_plots, ""]
        if section.plot:
            lines += [f"![{_one_line(plot_title(section.recipe))}]({plot_href(section.plot)})", ""]
    return "\n".join(lines)

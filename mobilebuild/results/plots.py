"""artifacts/plots/<recipe>.png: one figure per recipe, drawn from its manifest by the `plot` stage. No torch here.

A node per recipe, keyed on its manifest: a build renders only the recipes whose results changed, and a fresh
checkout fetches the figures from the shared cache instead of starting matplotlib. Labels never sit on the data:
every target has its own colour and marker, named once in the figure's legend.
"""

import io
import json
import textwrap
from pathlib import Path

from mobilebuild import store
from mobilebuild.results import report_data

FIGURE_WIDTH = 12  # inches, at DPI: as wide as the report's page
DPI = 100
EAGER_COLOUR = "#8c959f"
FAILED_EDGE = "#cf222e"
# tab10 without its grey (the eager baseline's): ten targets before a colour repeats, and the marker differs then
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
OUTLIER_REACH = 2.5  # the latency axes end at most this many times the slowest median (a p90 beyond is written)
SIDE_BY_SIDE = 9  # points between markers that would sit on top of each other
NEAR = 0.03  # of an axis' span: about a marker's width in the scatter panels, where markers start to hide each other


def run(inputs, config, output):
    with open(inputs["manifest"]) as handle:
        manifest = json.load(handle)
    with open(output, "wb") as handle:
        handle.write(draw(config.recipe, report_data.table_rows(manifest)))


def draw_all(artifacts_dir):
    """Every recipe's figure from its manifest, outside a build (`mobilebuild report`); returns how many."""
    manifests = report_data.load_manifests(artifacts_dir)
    for manifest in manifests:
        recipe = report_data.recipe_name(manifest)
        path = Path(artifacts_dir) / report_data.PLOTS_DIR / report_data.plot_name(recipe)
        store.write_bytes(path, draw(recipe, report_data.table_rows(manifest)))
    return len(manifests)


def timed(rows):
    """The rows with a host timing to draw: not those whose timings are never ranked (a software GPU driver's, which
    would squeeze every other bar into the axis' first pixels)."""
    return [row for row in rows if row.median_ms is not None and report_data.unranked(row) is None]


def not_drawn(rows):
    """The labels of timed rows left out of the figure (timed)."""
    return [row.label for row in rows if row.median_ms is not None and report_data.unranked(row) is not None]


def quality(rows):
    """(axis label, {row label: value}) for the quality axis: accuracy where the recipe has labelled data, else the
    worst SQNR against eager fp32 (the eager row is the reference and has none)."""
    accuracy = {row.label: row.metric("accuracy_artifact") for row in rows[1:]}
    if any(value is not None for value in accuracy.values()):
        reference = report_data.reference_accuracy(rows)
        if reference is not None:
            accuracy[rows[0].label] = reference
        return "accuracy (%)", {label: 100 * value for label, value in accuracy.items() if value is not None}
    sqnr = {row.label: row.metric("sqnr_db") for row in rows[1:]}
    return "SQNR vs eager fp32 (dB)", {label: value for label, value in sqnr.items() if value is not None}


def styles(rows):
    """{row label: scatter keywords}: eager grey, each target its own colour and marker, hollow so that points on
    top of each other stay visible; a failed target's marker is filled red."""
    found = {}
    for index, row in enumerate(rows):
        if index == 0:
            colour, marker = EAGER_COLOUR, "o"
        else:
            colour, marker = COLOURS[(index - 1) % len(COLOURS)], MARKERS[(index - 1) % len(MARKERS)]
        found[row.label] = {"marker": marker, "s": 110, "zorder": 3, "linewidths": 2, "edgecolors": colour,
                            "facecolors": FAILED_EDGE if row.state == "failed" else "none"}
    return found


def colour(style):
    return style["edgecolors"]


def legend_label(row):
    return f"{row.label} (FAILED)" if row.state == "failed" else row.label


def draw(recipe, rows):
    """The recipe's figure as PNG bytes."""
    return _png(figure(recipe, rows))


def figure(recipe, rows):
    """Median latency with p10-p90 whiskers above, size and quality against latency below. Rows without a host
    timing (device-only targets) have no point."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = timed(rows)
    style = styles(rows)
    # A bare Figure on an Agg canvas, not pyplot: no global backend switch, nothing left in pyplot's figure list.
    drawing = Figure(figsize=(FIGURE_WIDTH, 3.2 + 0.32 * len(points) + 4.2), dpi=DPI, layout="constrained")
    FigureCanvasAgg(drawing)
    axes = drawing.subplot_mosaic([["latency", "latency"], ["size", "quality"]],
                                 height_ratios=[1.2 + 0.32 * len(points), 4.2])
    drawing.suptitle(f"{recipe}: host latency, size and quality", fontsize=13)
    if not points:
        for name in axes:
            axes[name].set_axis_off()
        axes["latency"].text(0.5, 0.5, "no benchmark ran on the host for this recipe", ha="center", va="center")
        return drawing
    _latency_bars(axes["latency"], points, style, not_drawn(rows))
    slowest = max(row.median_ms for row in points) * 1.15 or 1  # one latency scale for both scatter panels
    _scatter(axes["size"], [(row, row.size_bytes / 1e6) for row in points if row.size_bytes is not None], style,
             "artifact size (MB)", slowest)
    label, values = quality(rows)
    _scatter(axes["quality"], [(row, values[row.label]) for row in points if row.label in values], style, label,
             slowest, from_zero=False)
    handles = [axes["latency"].scatter([], [], **style[row.label], label=legend_label(row)) for row in points]
    # as many columns as the longest name lets fit across the figure
    widest = max(len(legend_label(row)) for row in points) * 7 + 60
    drawing.legend(handles=handles, loc="outside lower center", frameon=False, fontsize=10, scatterpoints=1,
                   ncols=max(1, min(len(handles), (FIGURE_WIDTH * DPI - 100) // widest)))
    return drawing


def latency_limit(points):
    """Where the latency axes end: the farthest whisker, but no farther than OUTLIER_REACH times the slowest median,
    so that one eager p90 of 3.27 ms does not squeeze medians near 0.1-0.3 ms into the axis' first pixels."""
    medians = [row.median_ms for row in points]
    reach = max(median + _whiskers(row)[1] for median, row in zip(medians, points))
    return min(reach, OUTLIER_REACH * max(medians)) or 1


def _latency_bars(axes, points, style, left_out=()):
    positions = range(len(points))
    medians = [row.median_ms for row in points]
    limit = latency_limit(points)
    below, above = zip(*(_whiskers(row) for row in points))
    cut = [min(whisker, limit - median) for median, whisker in zip(medians, above)]  # an outlier ends at the edge
    axes.barh(positions, medians, xerr=[list(below), cut], capsize=4, height=0.6,
              color=[colour(style[row.label]) for row in points],
              edgecolor=[FAILED_EDGE if row.state == "failed" else "none" for row in points],
              error_kw={"ecolor": "#1f2328", "elinewidth": 1})
    for position, median, whisker, shown in zip(positions, medians, above, cut):
        text = report_data.two_or_three_decimals(median)
        if shown < whisker:  # said rather than drawn
            text += f" (p90 {report_data.two_or_three_decimals(median + whisker)} ms, beyond the axis)"
        axes.annotate(text, (median + shown, position), xytext=(4, 0), textcoords="offset points", va="center",
                      fontsize=9)
    axes.set_yticks(list(positions), [legend_label(row) for row in points])
    axes.invert_yaxis()  # the table's order, top down
    axes.set_xlim(0, limit * 1.15)
    whose = "their host timings are" if len(left_out) > 1 else "its host timing is"
    axes.set_xlabel("median latency on the host (ms), whiskers p10-p90" + (
        "\n" + textwrap.fill(f"not drawn: {', '.join(left_out)} ({whose} never ranked: see the notes)", 140)
        if left_out else ""))
    axes.grid(axis="x", alpha=0.3)
    axes.set_axisbelow(True)


def _scatter(axes, points, style, ylabel, slowest, from_zero=True):
    """Latency on x against a value on y; size starts at zero so that distances read as ratios. Points in the same
    place (targets with equal numbers) are set side by side, a few points apart, so that none hides another."""
    from matplotlib import transforms

    shifts = _side_by_side([(row.median_ms, value) for row, value in points], slowest)
    for (row, value), shift in zip(points, shifts):
        moved = transforms.offset_copy(axes.transData, fig=axes.figure, x=shift, units="points")
        axes.scatter([row.median_ms], [value], transform=moved, **style[row.label])
    axes.set_xlabel("median latency (ms)")
    axes.set_ylabel(ylabel)
    axes.set_xlim(0, slowest)
    if from_zero and points:
        axes.set_ylim(0, max(value for _, value in points) * 1.15 or 1)
    elif points:
        low, high = min(value for _, value in points), max(value for _, value in points)
        margin = (high - low) * 0.15 or max(abs(high) * 0.05, 1)
        axes.set_ylim(low - margin, high + margin)
    if not points:
        axes.text(0.5, 0.5, "nothing to show", ha="center", va="center", transform=axes.transAxes)
    axes.grid(alpha=0.3)
    axes.set_axisbelow(True)


def _side_by_side(positions, x_span):
    """A horizontal shift in points per (x, y): 0 for a point alone, spread around 0 for points closer than about a
    marker's width (3% of the axes) in latency and in value."""
    values = [y for _, y in positions]
    y_span = (max(values) - min(values)) if values else 0
    groups = []
    for index, (x, y) in enumerate(positions):
        near = next((group for group in groups if abs(positions[group[0]][0] - x) <= NEAR * x_span
                     and abs(positions[group[0]][1] - y) <= NEAR * (y_span or abs(y) or 1)), None)
        if near is None:
            groups.append([index])
        else:
            near.append(index)
    shifts = [0.0] * len(positions)
    for group in groups:  # in latency order: each neighbour ends SIDE_BY_SIDE farther away, none crosses another
        for rank, index in enumerate(sorted(group, key=lambda index: positions[index])):
            shifts[index] = (rank - (len(group) - 1) / 2) * SIDE_BY_SIDE
    return shifts


def _whiskers(row):
    """(median - p10, p90 - median), each 0 when not recorded (or out of order: a whisker never points inwards)."""
    median, p10, p90 = row.median_ms, report_data.finite(row.timing("p10_ms")), report_data.finite(row.timing("p90_ms"))
    return (max(0.0, median - p10) if p10 is not None else 0.0, max(0.0, p90 - median) if p90 is not None else 0.0)


def _png(figure):
    buffer = io.BytesIO()
    # no date or software version in the file: the same manifest gives the same bytes
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()

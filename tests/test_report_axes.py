"""Step axes show whole steps."""

import re

from lorapop.report.svg import Series, line_chart, nice_ticks


def test_integer_ticks_are_whole_numbers_and_value_ticks_are_not_forced():
    assert nice_ticks(1, 2, 6, integer=True) == [1, 2]
    assert nice_ticks(0, 37, 6, integer=True) == [0, 10, 20, 30]
    assert nice_ticks(1, 2, 6) == [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]  # a rate axis keeps fractions


def test_a_two_step_chart_labels_only_whole_steps():
    svg = line_chart([Series("reward", [(1, 0.5), (2, 0.7)])], "reward")
    # x tick labels sit below the plot frame; collect every tick label and keep those on the x axis (text-anchor middle)
    xs = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" text-anchor="middle">([^<]+)</text>', svg)
    assert xs and all(float(v).is_integer() for v in xs), xs


def test_a_long_legend_wraps_inside_the_figure_and_above_the_plots():
    """Twenty labels on a one-panel figure (the retention figure): every entry starts inside the width and no
    entry's estimated extent (the layout's own 7 px a character) passes the right edge, and the panels start below
    the last legend line."""
    from lorapop.report.svg import figure_svg, plot_svg

    legend = [Series(f"operator_number_{i}@3x", [(0, 0.0), (1, 1.0)], color="#123456") for i in range(20)]
    svg = figure_svg([("p", plot_svg(legend, "p"))], cols=1, legend=legend, title="t")
    width = float(re.search(r'<svg [^>]*width="([\d.]+)"', svg).group(1))
    entries = [(float(x), float(y), t) for x, y, t in
               re.findall(r'<text class="lg" x="([\d.]+)" y="([\d.]+)">([^<]+)</text>', svg)]
    assert [t for *_, t in entries] == [s.label for s in legend]
    assert all(x + 7 * len(t) <= width for x, _, t in entries), entries
    assert len({y for _, y, _ in entries}) > 1  # it wrapped
    panel_y = float(re.search(r'<svg class="plot" x="[\d.]+" y="([\d.]+)"', svg).group(1))
    assert panel_y > max(y for _, y, _ in entries)

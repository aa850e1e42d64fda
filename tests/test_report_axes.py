"""Step axes show whole steps."""

import re

from lorapop.report_svg import Series, line_chart, nice_ticks


def test_integer_ticks_are_whole_numbers_and_value_ticks_are_not_forced():
    assert nice_ticks(1, 2, 6, integer=True) == [1, 2]
    assert nice_ticks(0, 37, 6, integer=True) == [0, 10, 20, 30]
    assert nice_ticks(1, 2, 6) == [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]  # a rate axis keeps fractions


def test_a_two_step_chart_labels_only_whole_steps():
    svg = line_chart([Series("reward", [(1, 0.5), (2, 0.7)])], "reward")
    # x tick labels sit below the plot frame; collect every tick label and keep those on the x axis (text-anchor middle)
    xs = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" text-anchor="middle">([^<]+)</text>', svg)
    assert xs and all(float(v).is_integer() for v in xs), xs

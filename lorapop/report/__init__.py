"""The run report: a run read tolerantly (run_data.py), its charts as inline SVG (svg.py), one static report.html
(html.py). Floor 4: imports rundir, config, train's probe and yardstick readers; never a command. Stdlib only until
a report is written; ``write_report`` is kept here for scripts."""

from lorapop.report.html import write_report

__all__ = ["write_report"]

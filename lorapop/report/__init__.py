"""The run report: a run directory read tolerantly (data.py), its charts as inline SVG (svg.py), one static
report.html (html.py). Imports rundir, config-free readers of train/ and tasks/; nothing of the commands or the CLI.
Heavy modules stay out: stdlib only until a report is written. ``write_report`` is kept here for scripts."""

from lorapop.report.html import write_report

__all__ = ["write_report"]

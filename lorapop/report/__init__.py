"""The run report: a run as records/run_data.py reads it, its charts as inline SVG (svg.py), one static report.html
(html.py). Imports records, config and train's yardsticks; never a command. Stdlib only until a report is
written; ``write_report`` is the package's door."""

from lorapop.report.html import write_report

__all__ = ["write_report"]

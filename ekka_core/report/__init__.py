"""The report stage: ``report.json`` (contract ``ekka.report/1``), ``report.md`` and a self-contained
``report.html`` with the two plots (error ratio along the execution order, layer × position heat map).

Entry point: :func:`write_report` (:mod:`~ekka_core.report.build`, with :func:`build_report`). :func:`plot_data`
gives the plots as data for the editor's webview. The renderings: :mod:`~ekka_core.report.markdown`,
:mod:`~ekka_core.report.html`.
"""

from ekka_core.contracts.report import SCHEMA, headline
from ekka_core.report.build import build_report, plot_data, report_suspect, write_report
from ekka_core.report.findings import source_of
from ekka_core.report.html import render_html
from ekka_core.report.markdown import render_markdown

__all__ = ["SCHEMA", "build_report", "headline", "plot_data", "render_html", "render_markdown", "write_report"]

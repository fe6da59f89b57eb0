"""Report outputs: HTML, Markdown and terminal renderings of a ReportData.

Outputs only read analyzers/report_data.py's ReportData; every number they
show was computed there.
"""

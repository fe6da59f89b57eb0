"""Renderers of the one report model: terminal, HTML, Markdown and JSON.

They only read analyzers/report_data.py's ReportData; every number they
show was computed there. Nothing here imports cli/: `inferprobe report`
parses its flags and calls one of render_text (terminal.py), render_html
(html.py), render_markdown (markdown.py) or to_json (json_report.py).
"""

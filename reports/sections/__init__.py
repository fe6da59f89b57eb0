"""The report's analyzer sections: each module turns one analyzer's results
into an AnalyzerSection (model.py) that the HTML, Markdown and terminal
renderers draw alike; registry.py lists them in the report's order."""

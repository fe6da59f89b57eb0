"""Live and replayed export of finished Request timelines.

OTLP spans (otlp.py, shaped by spans.py) for the team's tracing backend and
Prometheus metrics (metrics.py) for its dashboards and alerts. These modules
only read Request timelines and the recording's metadata: they never touch
BPF, and the record loop reaches them through live.py alone.
"""

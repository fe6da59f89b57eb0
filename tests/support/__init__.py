"""What tests of both tiers share, one concept a module.

paths        where the repository, the test servers and the test programs are
processes    the recorder and test servers as subprocesses, and stopping them
cli          inferprobe's commands as subprocesses, and the shape of a failure
kernel       the root-only marker and in-memory capture of a probe set's events
sse_scan     how far the kernel scans a write for SSE events, as a model
pythons      a second CPython (3.12+) where the host has one
demo         the demo server's handle and the limits it is started with
backends     the real Phoenix and Prometheus servers the exporter tests start

The builders of in-memory recordings are tests/factories.py.
"""

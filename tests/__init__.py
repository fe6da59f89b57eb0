"""inferprobe's tests: unit/ (no root, no BPF), integration/ (the kernel and end to end).

A package so that helpers are imported by name (tests.support.processes,
tests.programs.build, tests.servers.sse_client) and two test files may share
a basename in different folders; tests/README.md says what goes where.
"""

# Entry points; scripts/setup.sh does the real work and is safe to rerun.
# `make test` is the test command (as root: the tests load real BPF programs).

VENV   ?= .venv
PYTHON := $(VENV)/bin/python
RUFF   := $(firstword $(wildcard $(VENV)/bin/ruff) ruff)

.PHONY: setup setup-demo test test-unit lint demo bench

# Everything the tests need: the demo's set-up plus the test backends.
setup:
	VENV="$(abspath $(VENV))" bash scripts/setup.sh

# Only what the tracer and the demo need (no Phoenix, Prometheus, Chromium, Go, Node).
setup-demo:
	VENV="$(abspath $(VENV))" bash scripts/setup.sh --demo

# The suite starts hundreds of Python processes (recorders, servers, SDK clients, the demo's
# torch). Where the environment says not to write bytecode (PYTHONDONTWRITEBYTECODE, as this
# CI's does) and set-up did not compile (pip --no-compile), each of them compiled every module
# it imported again; written once, into the venv and the tree's __pycache__ (git-ignored),
# they are read after. The client-call and CLI tests from a clean clone: 151 -> 134 s.
test: setup
	PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest -q --durations=60 --durations-min=5 tests

# The unit tier alone: no root, no BPF, no backends (tests/README.md).
test-unit:
	$(PYTHON) -m pytest -q tests/unit

# ruff, then mypy on the package under its imported names (see scripts/typecheck.py).
lint:
	$(RUFF) check .
	$(PYTHON) scripts/typecheck.py

demo: setup-demo
	bash scripts/demo.sh

# Side-by-side ratios, traced vs untraced (root: they attach BPF programs).
bench: setup
	$(PYTHON) benchmarks/bench_probes.py
	$(PYTHON) benchmarks/bench_collector.py
	$(PYTHON) benchmarks/bench_overhead.py
	$(PYTHON) benchmarks/bench_overhead.py --max-tokens 1 --interval-ms 0 --connections 16
	$(PYTHON) benchmarks/bench_overhead.py --max-tokens 1 --interval-ms 0 --connections 16 --unary
	$(PYTHON) benchmarks/bench_attach_toggle.py
	$(PYTHON) benchmarks/bench_startup.py
	$(PYTHON) benchmarks/bench_syscalls.py
	$(PYTHON) benchmarks/bench_node_sse.py

"""The collector: from the kernel's events to Request timelines, one folder per stage.

Each stage imports only the stages above it here:

- model/      the event model and the recording format, which every stage
              speaks: the generated layout of bpf/inferprobe.h, decoded records,
              Request timelines, process identities, recording files
- ingest/     decoded events into Request timelines and the server's own view
              (sessionizer, HTTP/2 streams, USDT and llama.cpp engine views)
- processes/  which processes to trace and what /proc says of them (targets,
              host-wide discovery, containers, mappings, TCP state)
- binaries/   what a process's files say: ELF symbols, Go's and CPython's
              layouts, llama.cpp's API, TLS libraries, the symbolizer
- attach/     load and attach the BPF programs of the active probe sets and
              read their rings while recording (the loader, probe_sets/,
              preflight)

errors.py (the one exception type that reaches the user) and
shared_constants.py (numbers several parts must agree on) serve them all.
"""

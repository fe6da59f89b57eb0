"""Attach: the BPF programs loaded, attached and read while recording.

loader compiles the active probe sets (probe_sets/, one module per set) and
attaches them; preflight says whether the host can; ringbuf and
event_stream drain what the kernel sends; the rest keeps attaching honest
and bounded (failed uprobes as notes, the agent's CPU budget, the CUPTI
shim's loading, an engine's own metrics scraped beside the wire, names for
lock-wait addresses while attached). A new
event source is a probe set here with its .bpf.c in bpf/.
"""

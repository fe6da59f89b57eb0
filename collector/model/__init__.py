"""The event model and the recording format: what every other stage speaks.

The byte layout of bpf/inferprobe.h mirrored for Python (layout_generated,
generated), its decoding into records (events), the Request timelines the
ingest stage builds from them (timeline), the CUDA functions hooked
(gpu_catalog), the frames that mark a cut stack (stack_markers), where each
process runs (process_identity), the kernel's connection tallies
(connection_tallies), and the files a recording is kept in (recording,
segment_ring, ringbuf_format).
Nothing here touches the kernel or /proc.
"""

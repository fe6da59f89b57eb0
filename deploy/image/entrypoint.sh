#!/bin/sh
# Start-up of the inferprobe image: make sure tracefs is there, then run
# inferprobe with the arguments. The BPF programs were built into the image
# (CO-RE): nothing is compiled here, and no kernel headers are needed. A node
# whose kernel exposes no BTF gets one sentence from the agent, with the fix
# (INFERPROBE_BTF=<this kernel's BTF file>, from BTFHub).
set -eu

# Tracepoints and the tracefs uprobe fallback live there; the DaemonSet mounts the node's.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ]; then
    mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
fi

exec inferprobe "$@"

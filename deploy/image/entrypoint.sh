#!/bin/sh
# Start-up of the inferprobe image: give bcc kernel headers for this node's
# kernel, make sure tracefs is there, then run inferprobe with the arguments.
#
# Headers, first that works (bcc compiles the BPF programs at start):
#   1. INFERPROBE_KERNEL_HEADERS, if set (a directory with include/generated/autoconf.h);
#   2. /lib/modules/$(uname -r)/build from the node (hostPath /lib/modules and /usr/src);
#   3. the kernel's own headers, /sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS; bcc
#      unpacks them itself), loading the kheaders module first where it is one;
#   4. the newest /usr/src/linux-headers-*-<arch> of the node, linked for this
#      release (a close version is fine for tracepoints, uprobes and USDT).
# If none works, the agent says what is missing in one sentence and exits.
set -eu

release="$(uname -r)"
usable() { [ -e "$1/include/generated/autoconf.h" ] || [ -e "$1/include/linux/kconfig.h" ]; }

if [ -n "${INFERPROBE_KERNEL_HEADERS:-}" ] && usable "$INFERPROBE_KERNEL_HEADERS"; then
    echo "inferprobe-entrypoint: kernel headers from INFERPROBE_KERNEL_HEADERS=$INFERPROBE_KERNEL_HEADERS"
elif usable "/lib/modules/$release/build"; then
    echo "inferprobe-entrypoint: kernel headers of the node: /lib/modules/$release/build"
else
    [ -e /sys/kernel/kheaders.tar.xz ] || modprobe kheaders 2>/dev/null || true
    if [ -e /sys/kernel/kheaders.tar.xz ]; then
        echo "inferprobe-entrypoint: kernel headers from /sys/kernel/kheaders.tar.xz"
    else
        arch="$(dpkg --print-architecture)"
        newest="$(ls -d /usr/src/linux-headers-*-"$arch" 2>/dev/null | sort -V | tail -n 1 || true)"
        if [ -n "$newest" ] && usable "$newest"; then
            export INFERPROBE_KERNEL_HEADERS="$newest"
            echo "inferprobe-entrypoint: no headers for $release; using the closest installed, $newest"
        fi
    fi
fi

# bcc finds tracepoints through tracefs; the DaemonSet mounts the node's.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ]; then
    mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
fi

# When no headers work, the agent itself says so in one sentence, with the fix,
# and exits non-zero (run `inferprobe doctor` in the pod for the full check).
exec inferprobe "$@"

/* common_core.bpf.h: common.bpf.h for the programs built ahead of time.
 *
 * The sources that include this are compiled once, at build time, by clang
 * against vmlinux.h (scripts/build_bpf.sh), and loaded with libbpf
 * (collector/attach/libbpf.py): no LLVM and no kernel headers when a
 * recording starts. Sets still compiled by bcc at start-up include
 * common.bpf.h instead.
 *
 * While both kinds exist, the bcc program creates the shared maps below and
 * the loader hands their fds to each built object before it loads
 * (bpf_map__reuse_fd): one event ring, one target filter, one set of
 * counters for every program, whichever way it was compiled. Their
 * definitions must match common.bpf.h's; the sizes that vary (the ring's)
 * come from the reused map, not from here.
 *
 * The helpers below repeat common.bpf.h's in libbpf's dialect (bcc refuses
 * bpf_map_lookup_elem(&map, ...), clang refuses bcc's map.lookup()). The
 * copy goes when the last bcc set moves over and common.bpf.h with it.
 *
 * Settings the loader writes before load (read-only globals, so the verifier
 * sees constants): ringbuf_wakeup_bytes.
 */
#ifndef INFERPROBE_COMMON_CORE_BPF_H
#define INFERPROBE_COMMON_CORE_BPF_H

/* The kernel has a struct io_event (aio) too: vmlinux.h's is renamed out of the way. */
#define io_event vmlinux_io_event
#include "vmlinux.h"
#undef io_event
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "inferprobe.h"

char LICENSE[] SEC("license") = "GPL";

/* Bytes a CPU writes between two wake-ups of the reader (common.bpf.h says why). */
const volatile u64 ringbuf_wakeup_bytes = 256 * 1024;

#define TARGET_PID_LIMIT (1U << 22)

/* What vmlinux.h, having types only, lacks: errno values and uapi macros. */
#define ENOENT 2
#define EFAULT 14
#define EEXIST 17
#define ENOSPC 28
#define PERF_MAX_STACK_DEPTH 127

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, TARGET_PID_LIMIT / 64);
    __type(key, u32);
    __type(value, u64);
} targets SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, COUNTER_MAX);
    __type(key, u32);
    __type(value, u64);
} counters SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} unwoken_bytes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096 * 4096);   /* replaced by the reused ring's size */
} events SEC(".maps");

static __always_inline void count(u32 index)
{
    u64 *value = bpf_map_lookup_elem(&counters, &index);
    if (value)
        *value += 1;
}

/* bcc's map.lookup_or_try_init(): the value at key, inserting init first if
 * there is none; NULL when the map is full. */
static __always_inline void *lookup_or_try_init(void *map, const void *key, const void *init)
{
    void *value = bpf_map_lookup_elem(map, key);
    if (value)
        return value;
    bpf_map_update_elem(map, key, init, BPF_NOEXIST);
    return bpf_map_lookup_elem(map, key);
}

static __always_inline int is_target(u32 tgid)
{
    u32 word = tgid / 64;
    u64 *bits = bpf_map_lookup_elem(&targets, &word);
    return bits && ((*bits >> (tgid % 64)) & 1);
}

static __always_inline void fill_header(struct event_header *hdr, u32 type, u64 ts_ns, u64 pid_tgid)
{
    hdr->type = type;
    hdr->pid = pid_tgid >> 32;
    hdr->tid = (u32)pid_tgid;
    hdr->cpu = bpf_get_smp_processor_id();
    hdr->ts_ns = ts_ns;
}

static __always_inline u64 wakeup_flag(u32 size)
{
    u32 zero = 0;
    u64 *unwoken = bpf_map_lookup_elem(&unwoken_bytes, &zero);
    if (!unwoken)
        return BPF_RB_NO_WAKEUP;
    *unwoken += size;
    if (*unwoken < ringbuf_wakeup_bytes)
        return BPF_RB_NO_WAKEUP;
    *unwoken = 0;
    return BPF_RB_FORCE_WAKEUP;
}

static __always_inline int send_event(void *ev, u32 size)
{
    if (bpf_ringbuf_output(&events, ev, size, wakeup_flag(size)) != 0) {
        count(COUNTER_EVENTS_LOST);
        return 0;
    }
    count(COUNTER_EVENTS_SENT);
    return 0;
}

#endif /* INFERPROBE_COMMON_CORE_BPF_H */

/* common.bpf.h: what every probe set's object shares. Include it first.
 *
 * Every bpf/<set>.bpf.c is compiled once, at build time, by clang against
 * vmlinux.h (scripts/build_bpf.sh), and loaded with libbpf
 * (collector/attach/libbpf.py): no LLVM and no kernel headers when a
 * recording starts.
 *
 * The maps below exist once for all objects: the sockets set's object,
 * loaded first, creates them, and the loader hands their fds to each later
 * object before it loads (bpf_map__reuse_fd): one event ring, one target
 * filter, one set of counters for every program. The sizes that vary (the
 * ring's) are set by the loader, not here.
 *
 * Settings the loader writes before load (read-only globals, so the verifier
 * sees constants): ringbuf_wakeup_bytes.
 */
#ifndef INFERPROBE_COMMON_BPF_H
#define INFERPROBE_COMMON_BPF_H

/* The kernel has a struct io_event (aio) too: vmlinux.h's is renamed out of the way. */
#define io_event vmlinux_io_event
#include "vmlinux.h"
#undef io_event
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "inferprobe.h"

char LICENSE[] SEC("license") = "GPL";

/* Bytes a CPU writes between two wake-ups of the reader (wakeup_flag() says why). */
const volatile u64 ringbuf_wakeup_bytes = 256 * 1024;

/* The pids (tgids, and the tids of their threads) we trace, one bit each.
 * is_target() runs on every syscall, context switch and futex of every
 * process on the host, so it is an array lookup the JIT inlines rather than
 * a hash lookup: ~30 ns less per call on the test VM, for 512 KiB covering
 * every pid a 64-bit kernel can hand out (PID_MAX_LIMIT). */
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

/* v & mask, kept by the compiler: where it can prove v <= mask it drops the
 * AND, and the verifier, which tracks 32-bit bounds less well, then refuses
 * a helper's size argument. */
static __always_inline u64 bounded(u64 v, u64 mask)
{
    asm volatile("" : "+r"(v));
    return v & mask;
}

/* floor(log2(v)) (0 for v = 0), by halving: what bcc's bpf_log2l() less one
 * gave, which libbpf has no copy of. The histograms' buckets come from it. */
static __always_inline u32 log2_floor(u64 v)
{
    u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8) { v >>= 8; r += 8; }
    if (v >> 4) { v >>= 4; r += 4; }
    if (v >> 2) { v >>= 2; r += 2; }
    if (v >> 1) r += 1;
    return r;
}

static __always_inline void count(u32 index)
{
    u64 *value = bpf_map_lookup_elem(&counters, &index);
    if (value)
        *value += 1;
}

/* The value at key, inserting init first if
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

/* Wake-ups are batched. By default the kernel wakes the reader whenever it
 * writes into an empty ring, and a reader that keeps up always leaves it
 * empty: one wake-up per event, paid inside the traced server's syscall
 * (irq_work, try_to_wake_up) and again by the reader's context switch and
 * Python loop. On a syscall-heavy server that was most of the overhead. So
 * events are written without a wake-up, each CPU wakes the reader once it
 * has written ringbuf_wakeup_bytes, and the reader also drains on a timer
 * (collector/attach/ringbuf.py), which bounds the delay when traffic is light. */
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

#endif /* INFERPROBE_COMMON_BPF_H */

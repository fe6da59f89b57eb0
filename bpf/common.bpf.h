/* common.bpf.h: what every probe set shares when compiled together.
 *
 * collector/attach/loader.py compiles the enabled probe sets as one translation unit
 * (one clang run at start-up instead of one per set), so the target filter,
 * the event ring buffer and the counters exist once and every set reports
 * through them. Include this first from every *.bpf.c.
 *
 * Compile-time settings arrive as -D flags from collector/attach/loader.py:
 *   RINGBUF_PAGES          size of the event ring buffer, in pages
 *   RINGBUF_WAKEUP_BYTES   bytes a CPU writes between two wake-ups of the reader
 *   HAVE_EXIT_GROUP_DEAD   sched_process_exit has the group_dead field
 */
#ifndef INFERPROBE_COMMON_BPF_H
#define INFERPROBE_COMMON_BPF_H

#include <uapi/linux/ptrace.h>
#include "inferprobe.h"

#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 2048
#endif

#ifndef RINGBUF_WAKEUP_BYTES
#define RINGBUF_WAKEUP_BYTES (256 * 1024)
#endif

/* The pids (tgids, and the tids of their threads) we trace, one bit each.
 * is_target() runs on every syscall, context switch and futex of every
 * process on the host, so it is an array lookup the JIT inlines rather than
 * a hash lookup: ~30 ns less per call on the test VM, for 512 KiB covering
 * every pid a 64-bit kernel can hand out (PID_MAX_LIMIT). */
#define TARGET_PID_LIMIT (1U << 22)
BPF_ARRAY(targets, u64, TARGET_PID_LIMIT / 64);
BPF_PERCPU_ARRAY(counters, u64, COUNTER_MAX);
BPF_PERCPU_ARRAY(unwoken_bytes, u64, 1);                /* written since this CPU last woke the reader */
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

/* v & mask, kept by the compiler: where it can prove v <= mask it drops the
 * AND, and the verifier, which tracks 32-bit bounds less well, then refuses
 * a helper's size argument. */
static __always_inline u64 bounded(u64 v, u64 mask)
{
    asm volatile("" : "+r"(v));
    return v & mask;
}

static __always_inline void count(u32 index)
{
    u64 *value = counters.lookup(&index);
    if (value)
        *value += 1;
}

static __always_inline int is_target(u32 tgid)
{
    u32 word = tgid / 64;
    u64 *bits = targets.lookup(&word);
    return bits && ((*bits >> (tgid % 64)) & 1);
}

/* Atomic: forks on two CPUs may touch the same word at once. */
static __always_inline void add_target(u32 pid)
{
    u32 word = pid / 64;
    u64 *bits = targets.lookup(&word);
    if (bits)
        __sync_fetch_and_or(bits, 1ULL << (pid % 64));
}

static __always_inline void remove_target(u32 pid)
{
    u32 word = pid / 64;
    u64 *bits = targets.lookup(&word);
    if (bits)
        __sync_fetch_and_and(bits, ~(1ULL << (pid % 64)));
}

static __always_inline void fill_header(struct event_header *hdr, u32 type, u64 ts_ns, u64 pid_tgid)
{
    hdr->type = type;
    hdr->pid = pid_tgid >> 32;
    hdr->tid = (u32)pid_tgid;
    hdr->cpu = bpf_get_smp_processor_id();
    hdr->ts_ns = ts_ns;
}

/* Copies a fully built event into the ring buffer, counting the outcome.
 *
 * Wake-ups are batched. By default the kernel wakes the reader whenever it
 * writes into an empty ring, and a reader that keeps up always leaves it
 * empty: one wake-up per event, paid inside the traced server's syscall
 * (irq_work, try_to_wake_up) and again by the reader's context switch and
 * Python loop. On a syscall-heavy server that was most of the overhead. So
 * events are written without a wake-up, each CPU wakes the reader once it
 * has written RINGBUF_WAKEUP_BYTES, and the reader also drains on a timer
 * (collector/attach/ringbuf.py), which bounds the delay when traffic is light. */
static __always_inline u64 wakeup_flag(u32 size)
{
    u32 zero = 0;
    u64 *unwoken = unwoken_bytes.lookup(&zero);
    if (!unwoken)
        return BPF_RB_NO_WAKEUP;
    *unwoken += size;
    if (*unwoken < RINGBUF_WAKEUP_BYTES)
        return BPF_RB_NO_WAKEUP;
    *unwoken = 0;
    return BPF_RB_FORCE_WAKEUP;
}

static __always_inline int send_event(void *ev, u32 size)
{
    if (events.ringbuf_output(ev, size, wakeup_flag(size)) != 0) {
        count(COUNTER_EVENTS_LOST);
        return 0;
    }
    count(COUNTER_EVENTS_SENT);
    return 0;
}

/* Host-wide mode (`record --all`, `agent`; -DHOST_WIDE): bpf/host_wide.bpf.c,
 * pasted after sock.bpf.c, defines these; sock.bpf.c calls them where a
 * process listens or accepts. Without it they are constants. */
#define HOST_WIDE_LISTEN 1   /* how a process was adopted: it listened ... */
#define HOST_WIDE_ACCEPT 2   /* ... or accepted */
#ifdef HOST_WIDE
static __always_inline int host_wide_adopt(u32 tgid, u16 port, u16 how);
static __always_inline int host_wide_follow(u64 conn_id);
/* The kernel tallies of every accepted connection, followed or not (host_wide.bpf.c). */
static __always_inline void host_wide_tally_open(u32 tgid, s32 fd);
static __always_inline int host_wide_tallied(u32 tgid, s32 fd);
static __always_inline void host_wide_tally(u32 tgid, s32 fd, u16 dir, u64 t_ns);
static __always_inline void host_wide_tally_close(u32 tgid, s32 fd);
#else
#define host_wide_adopt(tgid, port, how) 0
#define host_wide_follow(conn_id) 1
#define host_wide_tally_open(tgid, fd) do {} while (0)
#define host_wide_tallied(tgid, fd) 0
#define host_wide_tally(tgid, fd, dir, t_ns) do {} while (0)
#define host_wide_tally_close(tgid, fd) do {} while (0)
#endif

/* ---------------------------------------------------------------- process tree
 * The target set follows fork(): children and new threads of a target are
 * targets, so a pre-forking server's workers are traced from their birth. */

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(parent))
        return 0;
    /* child_pid is a new process's tgid or a new thread's tid: both are
     * added; thread entries are never looked up as a tgid and are removed
     * again when the thread exits. */
    add_target(args->child_pid);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    u32 tgid = id >> 32;
    if (tid != tgid) {
        remove_target(tid);
        return 0;
    }
#ifdef HAVE_EXIT_GROUP_DEAD
    if (args->group_dead)
        remove_target(tgid);
#endif
    return 0;
}

#endif /* INFERPROBE_COMMON_BPF_H */

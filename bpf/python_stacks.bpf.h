/* python_stacks.bpf.h: the Python stack of the current thread, kept once per
 * distinct stack, for every set that takes stacks (profile, offcpu, locks).
 *
 * Each of those objects includes this header, so each has these maps; the
 * loader gives a map the same name in several objects one instance
 * (collector/attach/loader.py), so a stack id means the same stack in all of
 * them. python_thread_exit is in each object too and attached once, by the
 * first (collector/binaries/python_stacks.py).
 *
 * User space (collector/binaries/python_stacks.py) fills python_layouts with each
 * CPython target's offsets and python_threads with every thread's
 * PyThreadState address, refreshed about once a second. A thread started
 * since is looked up here, in the interpreter's own thread list, at its
 * first sample (python_find_tstate); a thread not in the list (a C thread
 * of a Python process) is remembered as such (PYTHON_TSTATE_NONE and when)
 * and looked up again after PYTHON_RETRY_NS, not at every sample. A known
 * thread state is used only while it still names the thread (a thread
 * state freed by PyGILState_Release, its memory reused, is looked up
 * afresh), and entries go at thread exit (python_thread_exit).
 *
 * A stack's id is 31 bits of the walk's 64-bit hash; the other 32 bits are
 * kept with it, so a second stack hashing to the same id is recognised and
 * dropped (-EEXIST), never shown as the first one's frames.
 *
 * Settings:
 *   python_stacks_off     (read-only global) no walk at all, for every set
 *                         (benchmarks/bench_python_frames.py compares)
 *   PYTHON_STACK_SLOTS    distinct Python stacks kept (16384)
 *   PYTHON_MAX_FRAMES     innermost frames walked (32; a power of two)
 */
#ifndef INFERPROBE_PYTHON_STACKS_BPF_H
#define INFERPROBE_PYTHON_STACKS_BPF_H

#include "common.bpf.h"
#include "python_frames.bpf.h"

#define PYTHON_STACK_SLOTS 16384

const volatile bool python_stacks_off = false;

#define PYTHON_TSTATE_NONE (1ULL << 63)  /* python_threads value: none found, at (low bits) ns */
#define PYTHON_RETRY_NS 20000000ULL      /* look again for a thread with none after 20 ms */

struct {   /* tid -> PyThreadState address */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, u32);
    __type(value, u64);
} python_threads SEC(".maps");

struct {   /* tgid -> its interpreter's offsets */
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, u32);
    __type(value, struct python_layout);
} python_layouts SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, PYTHON_STACK_SLOTS);
    __type(key, s32);
    __type(value, struct python_stack);
} python_stacks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct python_stack);
} python_stack_scratch SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct python_frame_buf);
} python_frame_scratch SEC(".maps");

/* The current thread's Python stack id: > 0 an entry of python_stacks, 0 no
 * Python frames (not a CPython thread, or none running), < 0 -errno: the
 * stack was taken but not kept (-EEXIST another stack holds its id,
 * -ENOSPC python_stacks is full). */
static __always_inline s32 python_stack_id(u32 tgid, u32 tid)
{
    if (python_stacks_off)
        return 0;
    struct python_layout *layout = bpf_map_lookup_elem(&python_layouts, &tgid);
    if (!layout)
        return 0;
    /* the tid the thread states hold: its own pid namespace's (a container's) */
    u32 own_tid = tid;
    if (layout->pidns_ino) {
        struct bpf_pidns_info ns = {};
        if (bpf_get_ns_current_pid_tgid(layout->pidns_dev, layout->pidns_ino, &ns, sizeof(ns)) != 0)
            return 0;
        own_tid = ns.pid;
    }
    u64 tstate = 0;
    u64 *known = bpf_map_lookup_elem(&python_threads, &tid);
    /* a known thread state still naming this thread (not freed, its memory
     * not reused: one read per sample) is used as it is */
    if (known && !(*known & PYTHON_TSTATE_NONE) && python_tstate_tid(layout, *known) == own_tid) {
        tstate = *known;
    } else {
        u64 now = bpf_ktime_get_ns();
        if (known && (*known & PYTHON_TSTATE_NONE) &&
            now - (*known & ~PYTHON_TSTATE_NONE) < PYTHON_RETRY_NS)
            return 0;
        tstate = python_find_tstate(layout, own_tid);
        u64 value = tstate ? tstate : (PYTHON_TSTATE_NONE | now);
        bpf_map_update_elem(&python_threads, &tid, &value, BPF_ANY);
    }
    if (tstate == 0)
        return 0;
    u32 zero = 0;
    struct python_stack *stack = bpf_map_lookup_elem(&python_stack_scratch, &zero);
    struct python_frame_buf *buf = bpf_map_lookup_elem(&python_frame_scratch, &zero);
    if (!stack || !buf)
        return 0;
    if (python_walk(layout, tstate, stack, buf) == 0)
        return 0;
    s32 id = (s32)(stack->hash & 0x7fffffff);
    if (id == 0)
        id = 1;
    struct python_stack *kept = bpf_map_lookup_elem(&python_stacks, &id);
    if (kept)
        return kept->check == stack->check && kept->depth == stack->depth ? id : -EEXIST;
    if (bpf_map_update_elem(&python_stacks, &id, stack, BPF_ANY) != 0)
        return -ENOSPC;
    return id;
}

/* sched:sched_process_exit, attached once by collector/binaries/python_stacks.py: the
 * exiting thread's entry goes, so its tid, reused later, starts afresh. */
SEC("tracepoint")
int python_thread_exit(void *args)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    bpf_map_delete_elem(&python_threads, &tid);
    return 0;
}

#endif /* INFERPROBE_PYTHON_STACKS_BPF_H */

/* python_stacks.bpf.c: the Python stack of the current thread, kept once per
 * distinct stack, for every set that takes stacks (profile, offcpu, locks).
 *
 * Pasted once into the program by collector/attach/loader.py before the sets that
 * name it in their shared_sources, so these maps and python_stack_id() exist
 * once however many stack sets are on (bcc rewrites map calls only in the
 * main text, which is why they are not in python_frames.bpf.h).
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
 * Settings (-D flags from the probe sets):
 *   PYTHON_STACK_SLOTS    distinct Python stacks kept (default 16384)
 *   PYTHON_MAX_FRAMES     innermost frames walked (default 32; a power of two)
 *   PYTHON_STACKS_OFF     no walk at all (benchmarks/bench_python_frames.py compares)
 */
#include "common.bpf.h"
#include "python_frames.bpf.h"

#ifndef PYTHON_STACK_SLOTS
#define PYTHON_STACK_SLOTS 16384
#endif

#define PYTHON_TSTATE_NONE (1ULL << 63)  /* python_threads value: none found, at (low bits) ns */
#define PYTHON_RETRY_NS 20000000ULL      /* look again for a thread with none after 20 ms */

BPF_TABLE("lru_hash", u32, u64, python_threads, 65536);   /* tid -> PyThreadState address */
BPF_HASH(python_layouts, u32, struct python_layout, 4096);  /* tgid -> its interpreter's offsets */
BPF_HASH(python_stacks, s32, struct python_stack, PYTHON_STACK_SLOTS);
BPF_PERCPU_ARRAY(python_stack_scratch, struct python_stack, 1);
BPF_PERCPU_ARRAY(python_frame_scratch, struct python_frame_buf, 1);

/* The current thread's Python stack id: > 0 an entry of python_stacks, 0 no
 * Python frames (not a CPython thread, or none running), < 0 -errno: the
 * stack was taken but not kept (-EEXIST another stack holds its id,
 * -ENOSPC python_stacks is full). */
static __always_inline s32 python_stack_id(u32 tgid, u32 tid)
{
#ifdef PYTHON_STACKS_OFF
    return 0;
#endif
    struct python_layout *layout = python_layouts.lookup(&tgid);
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
    u64 *known = python_threads.lookup(&tid);
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
        python_threads.update(&tid, &value);
    }
    if (tstate == 0)
        return 0;
    u32 zero = 0;
    struct python_stack *stack = python_stack_scratch.lookup(&zero);
    struct python_frame_buf *buf = python_frame_scratch.lookup(&zero);
    if (!stack || !buf)
        return 0;
    if (python_walk(layout, tstate, stack, buf) == 0)
        return 0;
    s32 id = (s32)(stack->hash & 0x7fffffff);
    if (id == 0)
        id = 1;
    struct python_stack *kept = python_stacks.lookup(&id);
    if (kept)
        return kept->check == stack->check && kept->depth == stack->depth ? id : -EEXIST;
    if (python_stacks.update(&id, stack) != 0)
        return -ENOSPC;
    return id;
}

/* sched:sched_process_exit, attached once by collector/binaries/python_stacks.py: the
 * exiting thread's entry goes, so its tid, reused later, starts afresh. */
int python_thread_exit(void *args)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    python_threads.delete(&tid);
    return 0;
}

/* offcpu.bpf.c: where the target threads wait, weighted by how long.
 *
 * At sched_switch the thread being switched out is `current`, so its user
 * and kernel stacks are taken right there and kept with the switch-out time
 * in offcpu_start, with its Python stack for a CPython thread (the walk of
 * bpf/python_stacks.bpf.c, pasted before this file). When that thread is
 * switched in again, the period it was off the CPU is added, in
 * microseconds, to its stack's entry in offcpu_counts, if it lasted at least
 * OFFCPU_MIN_NS: lock waits, I/O, sleeps and run-queue waits all show up
 * with their real weight.
 *
 * Not a TRACEPOINT_PROBE: that macro names the function after the
 * tracepoint, and another probe set may hook sched_switch too (all sets are
 * one program). The probe set attaches offcpu_on_switch itself and passes
 * the offsets of the two fields read here from the running kernel's format
 * file (SWITCH_PREV_STATE_OFF, SWITCH_NEXT_PID_OFF), so no header layout is
 * assumed.
 *
 * Settings (-D flags from the probe set):
 *   OFFCPU_MIN_NS         shortest period recorded (default 1 ms)
 *   OFFCPU_STACK_SLOTS    entries of the stack map (default 16384)
 *   OFFCPU_STREAM         also send each period as a stack_sample_event
 */
#include "common.bpf.h"

#ifndef OFFCPU_MIN_NS
#define OFFCPU_MIN_NS 1000000
#endif
#ifndef OFFCPU_STACK_SLOTS
#define OFFCPU_STACK_SLOTS 16384
#endif

struct offcpu_start_t {
    u64 ts_ns;
    u32 tgid;
    s32 user_stack_id;
    s32 kernel_stack_id;
    u32 flags;
    s32 python_stack_id;    /* bpf/python_stacks.bpf.c: taken at switch-out, like the others */
    u32 pad;
};

BPF_STACK_TRACE(offcpu_stacks, OFFCPU_STACK_SLOTS);
BPF_TABLE("lru_hash", u32, struct offcpu_start_t, offcpu_start, 65536);  /* tid -> switch-out */
BPF_HASH(offcpu_counts, struct stack_key, struct offcpu_value, 65536);
BPF_PERCPU_ARRAY(offcpu_counters, u64, STACK_COUNTER_MAX);

static __always_inline void offcpu_count(u32 index)
{
    u64 *value = offcpu_counters.lookup(&index);
    if (value)
        *value += 1;
}

static __always_inline void offcpu_note_stack_error(s32 id)
{
    if (id == -EEXIST)
        offcpu_count(STACK_COUNTER_COLLISIONS);
    else if (id < 0)
        offcpu_count(STACK_COUNTER_LOST);
}

int offcpu_on_switch(void *args)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;

    /* the thread going off the CPU: remember when and where */
    if (tgid != 0 && is_target(tgid)) {
        struct offcpu_start_t start = {};
        start.ts_ns = now;
        start.tgid = tgid;
        start.user_stack_id = offcpu_stacks.get_stackid(args, BPF_F_USER_STACK);
        start.kernel_stack_id = offcpu_stacks.get_stackid(args, 0);
        start.python_stack_id = python_stack_id(tgid, (u32)id);
        /* No sleep-state bit (the low byte; 0x100 is the "preempted" mark on
         * newer kernels): the thread was runnable and preempted, not waiting. */
        long prev_state = *(long *)((char *)args + SWITCH_PREV_STATE_OFF);
        if ((prev_state & 0xff) == 0)
            start.flags = STACK_FLAG_PREEMPTED;
        u32 prev_tid = (u32)id;
        if (offcpu_start.update(&prev_tid, &start) != 0)
            offcpu_count(STACK_COUNTER_UNMATCHED);
    }

    /* the thread coming back: account its period off the CPU */
    u32 next_tid = *(u32 *)((char *)args + SWITCH_NEXT_PID_OFF);
    struct offcpu_start_t *start = offcpu_start.lookup(&next_tid);
    if (!start)
        return 0;
    u64 delta = now - start->ts_ns;
    if (delta < OFFCPU_MIN_NS) {
        offcpu_count(STACK_COUNTER_SHORT);
        offcpu_start.delete(&next_tid);
        return 0;
    }
    struct stack_key key = {};
    key.pid = start->tgid;
    key.tid = next_tid;
    key.user_stack_id = start->user_stack_id;
    key.kernel_stack_id = start->kernel_stack_id;
    key.flags = start->flags;
    key.python_stack_id = start->python_stack_id;
    u64 switch_out_ns = start->ts_ns;
    offcpu_start.delete(&next_tid);
    offcpu_note_stack_error(key.user_stack_id);
    offcpu_note_stack_error(key.kernel_stack_id);
    if (key.python_stack_id > 0)
        offcpu_count(STACK_COUNTER_PYTHON_STACKS);
    else if (key.python_stack_id < 0)
        offcpu_count(STACK_COUNTER_PYTHON_LOST);

    struct offcpu_value zero = {};
    struct offcpu_value *value = offcpu_counts.lookup_or_try_init(&key, &zero);
    if (!value) {
        offcpu_count(STACK_COUNTER_KEYS_FULL);
        return 0;
    }
    u64 us = delta / 1000;
    __sync_fetch_and_add(&value->total_us, us);
    __sync_fetch_and_add(&value->periods, 1);
    offcpu_count(STACK_COUNTER_SAMPLES);

#ifdef OFFCPU_STREAM
    struct stack_sample_event ev = {};
    fill_header(&ev.hdr, EVENT_OFFCPU_SAMPLE, switch_out_ns, ((u64)key.pid << 32) | next_tid);
    ev.user_stack_id = key.user_stack_id;
    ev.kernel_stack_id = key.kernel_stack_id;
    ev.flags = key.flags;
    ev.python_stack_id = key.python_stack_id;
    ev.weight = us;
    send_event(&ev, sizeof(ev));
#else
    (void)switch_out_ns;
#endif
    return 0;
}

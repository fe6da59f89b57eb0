/* offcpu.bpf.c: the off-CPU tracker, the one program on sched_switch.
 *
 * A target thread's period off the CPU runs from its switch-out to its
 * switch-in (what a period is, why it began and which are kept:
 * bpf/offcpu_periods.bpf.h). Two probe sets use the periods, each turning on
 * its part before load; with both on, the kernel runs one program per switch:
 *
 * offcpu_profile (the off-CPU profile, collector/attach/probe_sets/stacks.py):
 *   where threads wait, weighted by how long. At the switch-out the thread is
 *   `current`, so its user and kernel stacks are taken right there, with its
 *   Python stack for a CPython thread (bpf/python_stacks.bpf.h); at the
 *   switch-in the period is added, in microseconds, to its stack's entry in
 *   offcpu_counts if it lasted at least offcpu_min_ns. Lock waits, I/O, sleeps
 *   and run-queue waits all show up with their real weight.
 * offcpu_events (the lock set, collector/attach/probe_sets/locks.py):
 *   why, and who woke them. Each period of at least offcpu_floor_ns becomes an
 *   offcpu_event with its reason (a futex sleep told apart by the lock set's
 *   lock_pending), its split at the wake-up (offcpu_on_waking) and its waker.
 *
 * Built ahead of time (CO-RE, libbpf; common.bpf.h). The fields read of
 * sched_switch (prev_state, next_pid) are CO-RE relocated, so no layout of
 * the tracepoint is assumed. Settings, written by the sets before load:
 *   offcpu_profile, offcpu_min_ns, offcpu_stream (also send each profiled
 *   period as a stack_sample_event); offcpu_events, offcpu_floor_ns.
 */
#include "common.bpf.h"
#include "lock_state.bpf.h"
#include "offcpu_periods.bpf.h"
#include "python_stacks.bpf.h"

const volatile bool offcpu_profile = false;
const volatile u64 offcpu_min_ns = 1000000;
const volatile bool offcpu_stream = false;
const volatile bool offcpu_events = false;
const volatile u64 offcpu_floor_ns = 50000;

struct offcpu_start_t {     /* one period in progress */
    u64 ts_ns;              /* switched out */
    u32 tgid;
    s32 user_stack_id;      /* the profile's: taken at the switch-out */
    s32 kernel_stack_id;
    u32 flags;
    s32 python_stack_id;    /* bpf/python_stacks.bpf.h */
    u32 reason;             /* enum offcpu_reason (OFFCPU_FUTEX only with the events on) */
    u64 wake_ns;            /* the events': sched_waking (0: not yet) */
    u32 waker_tid;
    u32 waker_pid;
    s32 waker_stack_id;
    u32 pad;
};

struct {
    __uint(type, BPF_MAP_TYPE_STACK_TRACE);
    __uint(max_entries, 1);   /* the profile sizes it (OFFCPU_PROFILE_SIZES) */
    __type(key, u32);
    __uint(value_size, PERF_MAX_STACK_DEPTH * sizeof(u64));
} offcpu_stacks SEC(".maps");

struct {   /* tid -> switch-out */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, u32);
    __type(value, struct offcpu_start_t);
} offcpu_start SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1);   /* ditto */
    __type(key, struct stack_key);
    __type(value, struct offcpu_value);
} offcpu_counts SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, STACK_COUNTER_MAX);
    __type(key, u32);
    __type(value, u64);
} offcpu_counters SEC(".maps");

static __always_inline void offcpu_count(u32 index)
{
    u64 *value = bpf_map_lookup_elem(&offcpu_counters, &index);
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

/* The switch-out: when, why, and what each part on needs at the switch-in. */
static __always_inline void offcpu_switch_out(struct trace_event_raw_sched_switch *args, u64 now, u64 id)
{
    u32 tid = (u32)id;
    struct offcpu_start_t start = {};
    start.ts_ns = now;
    start.tgid = id >> 32;
    start.reason = offcpu_reason_of(args->prev_state);
    start.waker_stack_id = -1;
    if (offcpu_profile) {
        start.user_stack_id = bpf_get_stackid(args, &offcpu_stacks, BPF_F_USER_STACK);
        start.kernel_stack_id = bpf_get_stackid(args, &offcpu_stacks, 0);
        start.python_stack_id = python_stack_id(start.tgid, tid);
        if (start.reason == OFFCPU_PREEMPTED)
            start.flags = STACK_FLAG_PREEMPTED;
    }
    if (offcpu_events) {
        if (start.reason == OFFCPU_SLEEP && bpf_map_lookup_elem(&lock_pending, &tid))
            start.reason = OFFCPU_FUTEX;
        start.wake_ns = offcpu_wake_at_switch_out(start.reason, now);
    }
    if (bpf_map_update_elem(&offcpu_start, &tid, &start, BPF_ANY) != 0) {
        if (offcpu_profile)
            offcpu_count(STACK_COUNTER_UNMATCHED);
        if (offcpu_events)
            lock_count(LOCK_COUNTER_MAP_FULL, 1);
    }
}

/* The profile's part of a period: its weight on the stack it began in. The
 * profile does not split at a wake-up: a sleeping thread's period counts as
 * blocked all along, and is kept when all of it reaches offcpu_min_ns. */
static __always_inline void offcpu_profile_period(struct offcpu_start_t *start, u32 tid, u64 now)
{
    u64 blocked, runq;
    offcpu_period_split(start->ts_ns, offcpu_wake_at_switch_out(start->reason, start->ts_ns), now, &blocked,
                        &runq);
    if (!offcpu_period_kept(blocked, runq, offcpu_min_ns)) {
        offcpu_count(STACK_COUNTER_SHORT);
        return;
    }
    struct stack_key key = {};
    key.pid = start->tgid;
    key.tid = tid;
    key.user_stack_id = start->user_stack_id;
    key.kernel_stack_id = start->kernel_stack_id;
    key.flags = start->flags;
    key.python_stack_id = start->python_stack_id;
    offcpu_note_stack_error(key.user_stack_id);
    offcpu_note_stack_error(key.kernel_stack_id);
    if (key.python_stack_id > 0)
        offcpu_count(STACK_COUNTER_PYTHON_STACKS);
    else if (key.python_stack_id < 0)
        offcpu_count(STACK_COUNTER_PYTHON_LOST);

    struct offcpu_value zero = {};
    struct offcpu_value *value = lookup_or_try_init(&offcpu_counts, &key, &zero);
    if (!value) {
        offcpu_count(STACK_COUNTER_KEYS_FULL);
        return;
    }
    u64 us = (blocked + runq) / 1000;
    __sync_fetch_and_add(&value->total_us, us);
    __sync_fetch_and_add(&value->periods, 1);
    offcpu_count(STACK_COUNTER_SAMPLES);

    if (offcpu_stream) {
        struct stack_sample_event ev = {};
        fill_header(&ev.hdr, EVENT_OFFCPU_SAMPLE, start->ts_ns, ((u64)key.pid << 32) | tid);
        ev.user_stack_id = key.user_stack_id;
        ev.kernel_stack_id = key.kernel_stack_id;
        ev.flags = key.flags;
        ev.python_stack_id = key.python_stack_id;
        ev.weight = us;
        send_event(&ev, sizeof(ev));
    }
}

/* The lock set's part: one event per period of at least offcpu_floor_ns in
 * either part, split at the wake-up seen, with the waker. */
static __always_inline void offcpu_event_period(struct offcpu_start_t *start, u32 tid, u64 now)
{
    u64 blocked, runq;
    offcpu_period_split(start->ts_ns, start->wake_ns, now, &blocked, &runq);
    if (!offcpu_period_kept(blocked, runq, offcpu_floor_ns)) {
        lock_count(LOCK_COUNTER_OFFCPU_SHORT, 1);
        return;
    }
    struct offcpu_event ev = {};
    fill_header(&ev.hdr, EVENT_OFFCPU, start->ts_ns, ((u64)start->tgid << 32) | tid);
    ev.blocked_ns = blocked;
    ev.runq_ns = runq;
    ev.reason = start->reason;
    ev.waker_tid = start->waker_tid;
    ev.waker_pid = start->waker_pid;
    ev.waker_stack_id = start->waker_stack_id;
    send_event(&ev, sizeof(ev));
}

SEC("tracepoint/sched/sched_switch")
int offcpu_on_switch(struct trace_event_raw_sched_switch *args)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;

    /* current is still the thread going off the CPU */
    if (tgid != 0 && is_target(tgid))
        offcpu_switch_out(args, now, id);

    /* the thread coming back: its period ends */
    u32 next_tid = args->next_pid;
    struct offcpu_start_t *start = bpf_map_lookup_elem(&offcpu_start, &next_tid);
    if (!start)
        return 0;
    if (offcpu_profile)
        offcpu_profile_period(start, next_tid, now);
    if (offcpu_events)
        offcpu_event_period(start, next_tid, now);
    bpf_map_delete_elem(&offcpu_start, &next_tid);
    return 0;
}

/* The wake-up that splits a sleeping thread's period, for the events. It
 * runs in the waker's context (sched_wakeup may run on the wakee's CPU, in
 * whatever task is current there). Attached only with the events on. */
SEC("tracepoint/sched/sched_waking")
int offcpu_on_waking(struct trace_event_raw_sched_wakeup_template *args)
{
    u32 wakee = args->pid;
    struct offcpu_start_t *start = bpf_map_lookup_elem(&offcpu_start, &wakee);
    if (!start || start->wake_ns)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    start->wake_ns = now;
    start->waker_tid = (u32)id;
    start->waker_pid = id >> 32;
    /* the waker's stack only for long blocks: a stack walk per wake-up would
     * cost the ping-pong workloads the most */
    if (now - start->ts_ns >= offcpu_floor_ns)
        start->waker_stack_id = bpf_get_stackid(args, &lock_stacks, BPF_F_USER_STACK);
    return 0;
}

/* offcpu.bpf.c: where the target threads wait, weighted by how long.
 *
 * At sched_switch the thread being switched out is `current`, so its user
 * and kernel stacks are taken right there and kept with the switch-out time
 * in offcpu_start, with its Python stack for a CPython thread (the walk of
 * bpf/python_stacks.bpf.h). When that thread is
 * switched in again, the period it was off the CPU is added, in
 * microseconds, to its stack's entry in offcpu_counts, if it lasted at least
 * OFFCPU_MIN_NS: lock waits, I/O, sleeps and run-queue waits all show up
 * with their real weight. What a period is and which are kept is
 * bpf/offcpu_periods.bpf.h, shared with the lock set's off-CPU events.
 *
 * Built ahead of time (CO-RE, libbpf; common.bpf.h). The two fields
 * read of sched_switch (prev_state, next_pid) are CO-RE relocated, so no
 * layout of the tracepoint is assumed. Settings, written by the probe set
 * before load:
 *   offcpu_min_ns         shortest period recorded (default 1 ms)
 *   offcpu_stream         also send each period as a stack_sample_event
 */
#include "common.bpf.h"
#include "offcpu_periods.bpf.h"
#include "python_stacks.bpf.h"

#define OFFCPU_STACK_SLOTS 16384

const volatile u64 offcpu_min_ns = 1000000;
const volatile bool offcpu_stream = false;

struct offcpu_start_t {
    u64 ts_ns;
    u32 tgid;
    s32 user_stack_id;
    s32 kernel_stack_id;
    u32 flags;
    s32 python_stack_id;    /* bpf/python_stacks.bpf.c: taken at switch-out, like the others */
    u32 pad;
};

struct {
    __uint(type, BPF_MAP_TYPE_STACK_TRACE);
    __uint(max_entries, OFFCPU_STACK_SLOTS);
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
    __uint(max_entries, 65536);
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

SEC("tracepoint/sched/sched_switch")
int offcpu_on_switch(struct trace_event_raw_sched_switch *args)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;

    /* the thread going off the CPU: remember when and where */
    if (tgid != 0 && is_target(tgid)) {
        struct offcpu_start_t start = {};
        start.ts_ns = now;
        start.tgid = tgid;
        start.user_stack_id = bpf_get_stackid(args, &offcpu_stacks, BPF_F_USER_STACK);
        start.kernel_stack_id = bpf_get_stackid(args, &offcpu_stacks, 0);
        start.python_stack_id = python_stack_id(tgid, (u32)id);
        if (offcpu_reason_of(args->prev_state) == OFFCPU_PREEMPTED)
            start.flags = STACK_FLAG_PREEMPTED;
        u32 prev_tid = (u32)id;
        if (bpf_map_update_elem(&offcpu_start, &prev_tid, &start, BPF_ANY) != 0)
            offcpu_count(STACK_COUNTER_UNMATCHED);
    }

    /* the thread coming back: account its period off the CPU */
    u32 next_tid = args->next_pid;
    struct offcpu_start_t *start = bpf_map_lookup_elem(&offcpu_start, &next_tid);
    if (!start)
        return 0;
    /* no sched_waking here: a sleeping thread's period counts as blocked all along */
    u32 reason = start->flags & STACK_FLAG_PREEMPTED ? OFFCPU_PREEMPTED : OFFCPU_SLEEP;
    u64 blocked, runq;
    offcpu_period_split(start->ts_ns, offcpu_wake_at_switch_out(reason, start->ts_ns), now, &blocked, &runq);
    u64 delta = blocked + runq;
    if (!offcpu_period_kept(blocked, runq, offcpu_min_ns)) {
        offcpu_count(STACK_COUNTER_SHORT);
        bpf_map_delete_elem(&offcpu_start, &next_tid);
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
    bpf_map_delete_elem(&offcpu_start, &next_tid);
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
        return 0;
    }
    u64 us = delta / 1000;
    __sync_fetch_and_add(&value->total_us, us);
    __sync_fetch_and_add(&value->periods, 1);
    offcpu_count(STACK_COUNTER_SAMPLES);

    if (offcpu_stream) {
        struct stack_sample_event ev = {};
        fill_header(&ev.hdr, EVENT_OFFCPU_SAMPLE, switch_out_ns, ((u64)key.pid << 32) | next_tid);
        ev.user_stack_id = key.user_stack_id;
        ev.kernel_stack_id = key.kernel_stack_id;
        ev.flags = key.flags;
        ev.python_stack_id = key.python_stack_id;
        ev.weight = us;
        send_event(&ev, sizeof(ev));
    }
    return 0;
}

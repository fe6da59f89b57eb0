/* lock_state.bpf.h: the lock set's maps that the off-CPU tracker reads too.
 *
 * The lock set (locks.bpf.c) and the off-CPU tracker (offcpu.bpf.c) are two
 * objects; a map is one map across objects by its name (the loader hands a
 * later object the maps of those loaded before it). So each map is defined
 * once, here, and both objects see the same one:
 *   lock_pending   tid -> futex wait in progress: the tracker tells a futex
 *                  sleep (OFFCPU_FUTEX) from other sleeps by it
 *   lock_stacks    frame-pointer user stacks: the waiters' (locks.bpf.c)
 *                  and the wakers' of long off-CPU periods (the tracker)
 *   lock_counters  the lock set's counters (enum lock_counter)
 * Sized small here: a recording without the lock set pays nothing for them;
 * the lock set gives them their size before load
 * (collector/attach/probe_sets/locks.py, LOCK_STATE_SIZES).
 */
#ifndef INFERPROBE_LOCK_STATE_BPF_H
#define INFERPROBE_LOCK_STATE_BPF_H

struct lk_pending {
    u64 start_ns;
    u64 uaddr;
    u32 op;
    u32 val;
    u32 flags;
    u32 pad;
};

struct {   /* tid -> wait in progress */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 256);
    __type(key, u32);
    __type(value, struct lk_pending);
} lock_pending SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_STACK_TRACE);
    __uint(max_entries, 1);
    __type(key, u32);
    __uint(value_size, PERF_MAX_STACK_DEPTH * sizeof(u64));
} lock_stacks SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, LOCK_COUNTER_MAX);
    __type(key, u32);
    __type(value, u64);
} lock_counters SEC(".maps");

static __always_inline void lock_count(u32 index, u64 by)
{
    u64 *value = bpf_map_lookup_elem(&lock_counters, &index);
    if (value)
        *value += by;
}

#endif

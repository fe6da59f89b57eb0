/* process_tree.bpf.h: the target set follows fork() and exit.
 *
 * Children and new threads of a target are targets, so a pre-forking
 * server's workers are traced from their birth. Part of sock.bpf.o, the
 * object that owns the target bitmap (common.bpf.h) and is always loaded.
 */
#ifndef INFERPROBE_PROCESS_TREE_BPF_H
#define INFERPROBE_PROCESS_TREE_BPF_H

#include <bpf/bpf_core_read.h>

/* Atomic: forks on two CPUs may touch the same word at once. */
static __always_inline void add_target(u32 pid)
{
    u32 word = pid / 64;
    u64 *bits = bpf_map_lookup_elem(&targets, &word);
    if (bits)
        __sync_fetch_and_or(bits, 1ULL << (pid % 64));
}

static __always_inline void remove_target(u32 pid)
{
    u32 word = pid / 64;
    u64 *bits = bpf_map_lookup_elem(&targets, &word);
    if (bits)
        __sync_fetch_and_and(bits, ~(1ULL << (pid % 64)));
}

SEC("tracepoint/sched/sched_process_fork")
int sched_process_fork(struct trace_event_raw_sched_process_fork *args)
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

/* The record as kernels before 6.x lay it out: no group_dead (CO-RE tells
 * which one this kernel has; the ___ suffix is libbpf's name for a flavour). */
struct trace_event_raw_sched_process_exit___with_group_dead {
    bool group_dead;
} __attribute__((preserve_access_index));

SEC("tracepoint/sched/sched_process_exit")
int sched_process_exit(void *args)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    u32 tgid = id >> 32;
    if (tid != tgid) {
        remove_target(tid);
        return 0;
    }
    /* The last thread of the group: the process is gone. Where the record
     * does not say (kernels before group_dead was added to it), the bit
     * stays: a pid is reused only after many others. */
    struct trace_event_raw_sched_process_exit___with_group_dead *exit = args;
    if (bpf_core_field_exists(exit->group_dead) && exit->group_dead)
        remove_target(tgid);
    return 0;
}

#endif /* INFERPROBE_PROCESS_TREE_BPF_H */

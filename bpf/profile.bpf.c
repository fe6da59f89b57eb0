/* profile.bpf.c: on-CPU stack sampling of the target threads.
 *
 * collector/attach/probe_sets/stacks.py attaches profile_on_cpu to the software
 * cpu-clock perf event on every CPU at a fixed rate (hardware PMUs are often
 * absent in VMs, so never the cycles event). Each sample that lands on a
 * target thread is counted per (pid, tid, user stack, kernel stack) in
 * profile_counts; the stacks themselves live in profile_stacks. User space
 * reads both once, at stop, and symbolises them.
 *
 * A sample of a CPython thread also carries its Python stack (the frame walk
 * of bpf/python_stacks.bpf.c, pasted before this file): stack_key's
 * python_stack_id, resolved by user space to function, file and line.
 *
 * Settings (-D flags from the probe set):
 *   PROFILE_STACK_SLOTS   entries of the stack map (default 16384)
 *   PROFILE_STREAM        also send each sample as a stack_sample_event, for
 *                         per-phase tagging (costs a ring-buffer record per sample)
 */
#include "common.bpf.h"
#include <uapi/linux/bpf_perf_event.h>

#ifndef PROFILE_STACK_SLOTS
#define PROFILE_STACK_SLOTS 16384
#endif

BPF_STACK_TRACE(profile_stacks, PROFILE_STACK_SLOTS);
BPF_HASH(profile_counts, struct stack_key, u64, 65536);
BPF_PERCPU_ARRAY(profile_counters, u64, STACK_COUNTER_MAX);

static __always_inline void profile_count(u32 index)
{
    u64 *value = profile_counters.lookup(&index);
    if (value)
        *value += 1;
}

/* A negative stack id is -errno: -EEXIST is a hash collision (the slot holds
 * another stack, so this one is lost); -EFAULT for the kernel stack just
 * means the sample hit user mode. */
static __always_inline void profile_note_stack_error(s32 id, int user)
{
    if (id == -EEXIST)
        profile_count(STACK_COUNTER_COLLISIONS);
    else if (id < 0 && (user || id != -EFAULT))
        profile_count(STACK_COUNTER_LOST);
}

int profile_on_cpu(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (tgid == 0 || !is_target(tgid))
        return 0;

    struct stack_key key = {};
    key.pid = tgid;
    key.tid = (u32)id;
    key.user_stack_id = profile_stacks.get_stackid(&ctx->regs, BPF_F_USER_STACK);
    key.kernel_stack_id = profile_stacks.get_stackid(&ctx->regs, 0);
    profile_note_stack_error(key.user_stack_id, 1);
    profile_note_stack_error(key.kernel_stack_id, 0);
    key.python_stack_id = python_stack_id(tgid, key.tid);
    if (key.python_stack_id > 0)
        profile_count(STACK_COUNTER_PYTHON_STACKS);
    else if (key.python_stack_id < 0)
        profile_count(STACK_COUNTER_PYTHON_LOST);

    u64 zero = 0;
    u64 *count = profile_counts.lookup_or_try_init(&key, &zero);
    if (!count) {
        profile_count(STACK_COUNTER_KEYS_FULL);
        return 0;
    }
    __sync_fetch_and_add(count, 1);
    profile_count(STACK_COUNTER_SAMPLES);

#ifdef PROFILE_STREAM
    struct stack_sample_event ev = {};
    fill_header(&ev.hdr, EVENT_CPU_SAMPLE, bpf_ktime_get_ns(), id);
    ev.user_stack_id = key.user_stack_id;
    ev.kernel_stack_id = key.kernel_stack_id;
    ev.python_stack_id = key.python_stack_id;
    ev.weight = 1;
    send_event(&ev, sizeof(ev));
#endif
    return 0;
}

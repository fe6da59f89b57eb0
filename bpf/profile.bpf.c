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
 * of bpf/python_stacks.bpf.h): stack_key's python_stack_id, resolved by user
 * space to function, file and line.
 *
 * Built ahead of time (CO-RE, libbpf; common.bpf.h). Settings, written
 * by the probe set before load:
 *   profile_stream        also send each sample as a stack_sample_event, for
 *                         per-phase tagging (costs a ring-buffer record per sample)
 */
#include "common.bpf.h"
#include "python_stacks.bpf.h"

#define PROFILE_STACK_SLOTS 16384

const volatile bool profile_stream = false;

struct {
    __uint(type, BPF_MAP_TYPE_STACK_TRACE);
    __uint(max_entries, PROFILE_STACK_SLOTS);
    __type(key, u32);
    __uint(value_size, PERF_MAX_STACK_DEPTH * sizeof(u64));
} profile_stacks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, struct stack_key);
    __type(value, u64);
} profile_counts SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, STACK_COUNTER_MAX);
    __type(key, u32);
    __type(value, u64);
} profile_counters SEC(".maps");

static __always_inline void profile_count(u32 index)
{
    u64 *value = bpf_map_lookup_elem(&profile_counters, &index);
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

SEC("perf_event")
int profile_on_cpu(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (tgid == 0 || !is_target(tgid))
        return 0;

    struct stack_key key = {};
    key.pid = tgid;
    key.tid = (u32)id;
    key.user_stack_id = bpf_get_stackid(ctx, &profile_stacks, BPF_F_USER_STACK);
    key.kernel_stack_id = bpf_get_stackid(ctx, &profile_stacks, 0);
    profile_note_stack_error(key.user_stack_id, 1);
    profile_note_stack_error(key.kernel_stack_id, 0);
    key.python_stack_id = python_stack_id(tgid, key.tid);
    if (key.python_stack_id > 0)
        profile_count(STACK_COUNTER_PYTHON_STACKS);
    else if (key.python_stack_id < 0)
        profile_count(STACK_COUNTER_PYTHON_LOST);

    u64 zero = 0;
    u64 *count = lookup_or_try_init(&profile_counts, &key, &zero);
    if (!count) {
        profile_count(STACK_COUNTER_KEYS_FULL);
        return 0;
    }
    __sync_fetch_and_add(count, 1);
    profile_count(STACK_COUNTER_SAMPLES);

    if (profile_stream) {
        struct stack_sample_event ev = {};
        fill_header(&ev.hdr, EVENT_CPU_SAMPLE, bpf_ktime_get_ns(), id);
        ev.user_stack_id = key.user_stack_id;
        ev.kernel_stack_id = key.kernel_stack_id;
        ev.python_stack_id = key.python_stack_id;
        ev.weight = 1;
        send_event(&ev, sizeof(ev));
    }
    return 0;
}

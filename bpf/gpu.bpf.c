/* gpu.bpf.c: what a CPU thread asks of the GPU, from uprobes on the CUDA libraries.
 *
 * NVIDIA's driver has no kernel tracepoints, so collector/attach/probe_sets/gpu.py
 * attaches the handlers below to the exported functions of libcuda (driver
 * API) and libcudart (runtime API) in each target process: gpu_enter_<FN>
 * at entry, gpu_return_<FN> at return, one pair per enum gpu_function.
 *
 * Outermost calls only. The runtime calls the driver (cudaMemcpy ends in a
 * cuMemcpy*), and both may be hooked: the first hooked call a thread enters
 * is the one that counts; any hooked call entered before it returns is
 * "nested" and only counted as such. That rule needs no knowledge of which
 * library calls which.
 *
 * Waits, copies, memory calls and queries: one gpu_call_event each, sent at
 * return, with duration, return code and the arguments that matter (size
 * and direction, the address, the stream or event handle).
 *
 * Launches are too frequent to stream (an eager-mode decode step launches
 * hundreds of kernels). Each thread keeps an open run of launches in
 * gpu_runs (first and last launch time, kernel and graph counts, time inside
 * runtime launch calls), sent as one gpu_launches_event when the thread
 * enters a wait, copy or memory call (where an engine's step ends: the copy
 * of sampled tokens to the host), when the run reaches GPU_RUN_MAX_LAUNCHES,
 * or when a launch comes more than GPU_RUN_MAX_NS after the run began. So
 * the event rate follows the step rate, not the launch rate, and a request
 * timeline still sees when launching began and ended in each step.
 * GPU_RUN_MAX_LAUNCHES=1 streams every launch (the benchmark's baseline).
 *
 * Driver launch functions get no return probe: they are the innermost layer
 * and a uretprobe would double their cost. Runtime launch functions do get
 * one, so that the driver launch inside them is seen as nested.
 *
 * Exact per-function totals (calls, nested calls, errors, time, bytes, a
 * log2 histogram of durations) are kept in gpu_fn_stats and stored in the
 * recording at stop: they stay right even if the ring buffer drops events.
 *
 * DRM: dma_fence waits in target threads become gpu_fence_event; queued
 * gpu_scheduler jobs become gpu_drm_event; the scheduler's run and done
 * tracepoints run in kernel threads and interrupts, where the target is
 * unknown, so they are only counted, host-wide. Each is loaded only where
 * the probe set saw its tracepoint.
 *
 * Built ahead of time (CO-RE, libbpf; common.bpf.h). Settings, written
 * by collector/attach/probe_sets/gpu.py before load: gpu_run_max_launches,
 * gpu_run_max_ns.
 */
#include "common.bpf.h"
#include <bpf/usdt.bpf.h>

const volatile u32 gpu_run_max_launches = 256;
const volatile u64 gpu_run_max_ns = 10000000;
#define GPU_HIST_SLOTS 32

struct gpu_fn_stats {
    u64 calls;      /* outermost calls entered */
    u64 nested;     /* calls entered inside another hooked call on the same thread */
    u64 errors;     /* returned non-zero */
    u64 total_ns;   /* entry to return, outermost calls with a return probe */
    u64 bytes;      /* copies and allocations */
    u64 hist[GPU_HIST_SLOTS]; /* durations: slot k counts [2^(k-1), 2^k) ns */
};

struct gpu_call_entry {
    u64 ts_ns;
    u64 bytes;
    u64 addr;
    u64 out_ptr;    /* allocations: where the library writes the new address */
    u32 function;
    u32 copy_kind;
};

struct gpu_run {
    u64 first_ns;
    u64 last_ns;
    u64 launch_ns;
    u32 kernels;
    u32 graphs;
    u32 pid;        /* for the runs still open at stop, which user space reads from the map */
    u32 pad;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, GPU_FN_MAX);
    __type(key, u32);
    __type(value, struct gpu_fn_stats);
} gpu_fn_stats SEC(".maps");

struct {   /* tid -> outermost call */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, struct gpu_call_entry);
} gpu_calls SEC(".maps");

struct {   /* tid -> open launch run */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, struct gpu_run);
} gpu_runs SEC(".maps");

static __always_inline struct gpu_fn_stats *gpu_stats(u32 fn)
{
    return bpf_map_lookup_elem(&gpu_fn_stats, &fn);
}

static __always_inline u32 gpu_hist_slot(u64 ns)
{
    u32 slot = 0;
    if (ns)
        slot = log2_floor(ns) + 1;
    return slot < GPU_HIST_SLOTS ? slot : GPU_HIST_SLOTS - 1;
}

static __always_inline void gpu_send_run(struct gpu_run *run, u64 pid_tgid, u16 reason)
{
    struct gpu_launches_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_LAUNCHES, run->first_ns, pid_tgid);
    ev.last_ns = run->last_ns;
    ev.launch_ns = run->launch_ns;
    ev.kernels = run->kernels;
    ev.graphs = run->graphs;
    ev.reason = reason;
    send_event(&ev, sizeof(ev));
}

static __always_inline void gpu_close_run(u64 pid_tgid, u16 reason)
{
    u32 tid = (u32)pid_tgid;
    struct gpu_run *run = bpf_map_lookup_elem(&gpu_runs, &tid);
    if (!run)
        return;
    gpu_send_run(run, pid_tgid, reason);
    bpf_map_delete_elem(&gpu_runs, &tid);
}

/* Counts a hooked call of a target thread: as nested when another hooked
 * call of that thread is in progress (the runtime calling the driver), as a
 * call otherwise. Returns 1 for an outermost call, which the caller records. */
static __always_inline int gpu_count_entry(u32 fn, u64 id)
{
    if (!is_target(id >> 32))
        return 0;
    u32 tid = (u32)id;
    struct gpu_fn_stats *st = gpu_stats(fn);
    if (!st)
        return 0;
    if (bpf_map_lookup_elem(&gpu_calls, &tid)) {
        st->nested += 1;
        return 0;
    }
    st->calls += 1;
    return 1;
}

/* A launch entered. with_return: a return probe will follow (runtime). */
static __always_inline int gpu_launch(u32 fn, int graph, int with_return)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!gpu_count_entry(fn, id))
        return 0;
    u32 tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
    struct gpu_run *run = bpf_map_lookup_elem(&gpu_runs, &tid);
    if (run) {
        u16 reason = 0;
        if (run->kernels + run->graphs >= gpu_run_max_launches)
            reason = GPU_FLUSH_CAP;
        else if (now - run->first_ns > gpu_run_max_ns)
            reason = GPU_FLUSH_AGE;
        if (reason) {
            gpu_send_run(run, id, reason);
            run->first_ns = now;
            run->launch_ns = 0;
            run->kernels = 0;
            run->graphs = 0;
        }
    } else {
        struct gpu_run fresh = {};
        fresh.first_ns = now;
        fresh.pid = id >> 32;
        bpf_map_update_elem(&gpu_runs, &tid, &fresh, BPF_ANY);
        run = bpf_map_lookup_elem(&gpu_runs, &tid);
        if (!run)
            return 0;
    }
    run->last_ns = now;
    if (graph)
        run->graphs += 1;
    else
        run->kernels += 1;
    if (with_return) {
        struct gpu_call_entry entry = {};
        entry.ts_ns = now;
        entry.function = fn;
        bpf_map_update_elem(&gpu_calls, &tid, &entry, BPF_ANY);
    }
    return 0;
}

/* A wait, copy, memory call or query entered. */
static __always_inline int gpu_call(struct pt_regs *ctx, u32 fn)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!gpu_count_entry(fn, id))
        return 0;
    u32 tid = (u32)id;
    if (fn < GPU_FN_FIRST_QUERY)
        gpu_close_run(id, GPU_FLUSH_CALL);

    struct gpu_call_entry entry = {};
    entry.function = fn;
    if (fn >= GPU_FN_FIRST_WAIT && fn < GPU_FN_FIRST_COPY) {
        if (fn != GPU_FN_CU_CTX_SYNCHRONIZE && fn != GPU_FN_CUDA_DEVICE_SYNCHRONIZE)
            entry.addr = PT_REGS_PARM1(ctx);        /* the stream or event */
    } else if (fn >= GPU_FN_FIRST_COPY && fn < GPU_FN_FIRST_MEMORY) {
        entry.bytes = PT_REGS_PARM3(ctx);           /* every copy has its size third */
        if (fn == GPU_FN_CUDA_MEMCPY || fn == GPU_FN_CUDA_MEMCPY_ASYNC) {
            /* The application's cudaMemcpyKind, unchecked by anyone before
             * the driver: a value enum gpu_copy_kind does not name (a bug in
             * the caller, or a later CUDA's kind) would make the decoder drop
             * the whole event (collector/model/events.py refuses unknown enum
             * values), so it is sent as GPU_COPY_DEFAULT and the copy still
             * counts. An int argument: only the register's low 32 bits. */
            u32 kind = (u32)PT_REGS_PARM4(ctx);
            entry.copy_kind = kind <= GPU_COPY_DEFAULT ? kind : GPU_COPY_DEFAULT;
        }
        else if (fn == GPU_FN_CU_MEMCPY_DTOH || fn == GPU_FN_CU_MEMCPY_DTOH_ASYNC)
            entry.copy_kind = GPU_COPY_DTOH;
        else if (fn == GPU_FN_CU_MEMCPY_HTOD || fn == GPU_FN_CU_MEMCPY_HTOD_ASYNC)
            entry.copy_kind = GPU_COPY_HTOD;
        else if (fn == GPU_FN_CU_MEMCPY_DTOD || fn == GPU_FN_CU_MEMCPY_DTOD_ASYNC)
            entry.copy_kind = GPU_COPY_DTOD;
        else
            entry.copy_kind = GPU_COPY_DEFAULT;
    } else if (fn == GPU_FN_CU_MEM_FREE || fn == GPU_FN_CU_MEM_FREE_ASYNC ||
               fn == GPU_FN_CUDA_FREE || fn == GPU_FN_CUDA_FREE_ASYNC) {
        entry.addr = PT_REGS_PARM1(ctx);
    } else if (fn >= GPU_FN_FIRST_MEMORY && fn < GPU_FN_FIRST_QUERY) {
        entry.out_ptr = PT_REGS_PARM1(ctx);         /* (void **ptr, size_t size, ...) */
        entry.bytes = PT_REGS_PARM2(ctx);
    }
    entry.ts_ns = bpf_ktime_get_ns();
    bpf_map_update_elem(&gpu_calls, &tid, &entry, BPF_ANY);
    return 0;
}

/* Any hooked function returned. */
static __always_inline int gpu_return(struct pt_regs *ctx, u32 fn)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct gpu_call_entry *entry = bpf_map_lookup_elem(&gpu_calls, &tid);
    /* Not ours: a nested call returning, or a call already running when we attached. */
    if (!entry || entry->function != fn)
        return 0;
    s32 ret = (s32)PT_REGS_RC(ctx);
    u64 duration = now - entry->ts_ns;
    struct gpu_fn_stats *st = gpu_stats(fn);
    if (st) {
        if (ret != 0)
            st->errors += 1;
        st->total_ns += duration;
        st->bytes += entry->bytes;
        st->hist[gpu_hist_slot(duration) & (GPU_HIST_SLOTS - 1)] += 1;
    }
    if (fn < GPU_FN_FIRST_WAIT) {
        struct gpu_run *run = bpf_map_lookup_elem(&gpu_runs, &tid);
        if (run)
            run->launch_ns += duration;
        bpf_map_delete_elem(&gpu_calls, &tid);
        return 0;
    }
    struct gpu_call_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_CALL, entry->ts_ns, id);
    ev.exit_ns = now;
    ev.bytes = entry->bytes;
    ev.addr = entry->addr;
    ev.ret = ret;
    ev.function = fn;
    ev.copy_kind = entry->copy_kind;
    if (entry->out_ptr && ret == 0)
        bpf_probe_read_user(&ev.addr, sizeof(ev.addr), (void *)entry->out_ptr);
    bpf_map_delete_elem(&gpu_calls, &tid);
    return send_event(&ev, sizeof(ev));
}

#define GPU_DRIVER_LAUNCH(FN, GRAPH) \
    SEC("uprobe") int gpu_enter_##FN(struct pt_regs *ctx) { return gpu_launch(FN, GRAPH, 0); }
#define GPU_RUNTIME_LAUNCH(FN, GRAPH) \
    SEC("uprobe") int gpu_enter_##FN(struct pt_regs *ctx) { return gpu_launch(FN, GRAPH, 1); } \
    SEC("uprobe") int gpu_return_##FN(struct pt_regs *ctx) { return gpu_return(ctx, FN); }
#define GPU_CALL(FN) \
    SEC("uprobe") int gpu_enter_##FN(struct pt_regs *ctx) { return gpu_call(ctx, FN); } \
    SEC("uprobe") int gpu_return_##FN(struct pt_regs *ctx) { return gpu_return(ctx, FN); }

GPU_DRIVER_LAUNCH(GPU_FN_CU_LAUNCH_KERNEL, 0)
GPU_DRIVER_LAUNCH(GPU_FN_CU_LAUNCH_KERNEL_EX, 0)
GPU_DRIVER_LAUNCH(GPU_FN_CU_GRAPH_LAUNCH, 1)
GPU_RUNTIME_LAUNCH(GPU_FN_CUDA_LAUNCH_KERNEL, 0)
GPU_RUNTIME_LAUNCH(GPU_FN_CUDA_LAUNCH_KERNEL_EX, 0)
GPU_RUNTIME_LAUNCH(GPU_FN_CUDA_GRAPH_LAUNCH, 1)
GPU_CALL(GPU_FN_CU_STREAM_SYNCHRONIZE)
GPU_CALL(GPU_FN_CU_EVENT_SYNCHRONIZE)
GPU_CALL(GPU_FN_CU_CTX_SYNCHRONIZE)
GPU_CALL(GPU_FN_CU_STREAM_WAIT_EVENT)
GPU_CALL(GPU_FN_CUDA_STREAM_SYNCHRONIZE)
GPU_CALL(GPU_FN_CUDA_EVENT_SYNCHRONIZE)
GPU_CALL(GPU_FN_CUDA_DEVICE_SYNCHRONIZE)
GPU_CALL(GPU_FN_CUDA_STREAM_WAIT_EVENT)
GPU_CALL(GPU_FN_CU_MEMCPY)
GPU_CALL(GPU_FN_CU_MEMCPY_ASYNC)
GPU_CALL(GPU_FN_CU_MEMCPY_DTOH)
GPU_CALL(GPU_FN_CU_MEMCPY_DTOH_ASYNC)
GPU_CALL(GPU_FN_CU_MEMCPY_HTOD)
GPU_CALL(GPU_FN_CU_MEMCPY_HTOD_ASYNC)
GPU_CALL(GPU_FN_CU_MEMCPY_DTOD)
GPU_CALL(GPU_FN_CU_MEMCPY_DTOD_ASYNC)
GPU_CALL(GPU_FN_CUDA_MEMCPY)
GPU_CALL(GPU_FN_CUDA_MEMCPY_ASYNC)
GPU_CALL(GPU_FN_CU_MEM_ALLOC)
GPU_CALL(GPU_FN_CU_MEM_FREE)
GPU_CALL(GPU_FN_CU_MEM_ALLOC_ASYNC)
GPU_CALL(GPU_FN_CU_MEM_FREE_ASYNC)
GPU_CALL(GPU_FN_CUDA_MALLOC)
GPU_CALL(GPU_FN_CUDA_FREE)
GPU_CALL(GPU_FN_CUDA_MALLOC_ASYNC)
GPU_CALL(GPU_FN_CUDA_FREE_ASYNC)
GPU_CALL(GPU_FN_CUDA_GET_DEVICE_COUNT)

/* ---------------------------------------------------------------- DRM GPUs */

/* The two fields read of dma_fence's tracepoints, relocated by name (CO-RE):
 * this file builds also where the build host's kernel has no dma_fence. */
struct trace_event_raw_dma_fence___gpu {
    unsigned int context;
    unsigned int seqno;
} __attribute__((preserve_access_index));

struct {   /* tid -> open wait */
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u32);
    __type(value, struct gpu_fence_event);
} gpu_fence_waits SEC(".maps");

SEC("tracepoint/dma_fence/dma_fence_wait_start")
int gpu_fence_wait_start(struct trace_event_raw_dma_fence___gpu *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    u32 tid = (u32)id;
    struct gpu_fence_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_FENCE_WAIT, bpf_ktime_get_ns(), id);
    ev.context = args->context;
    ev.seqno = args->seqno;
    bpf_map_update_elem(&gpu_fence_waits, &tid, &ev, BPF_ANY);
    return 0;
}

SEC("tracepoint/dma_fence/dma_fence_wait_end")
int gpu_fence_wait_end(void *args)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct gpu_fence_event *open = bpf_map_lookup_elem(&gpu_fence_waits, &tid);
    if (!open)
        return 0;
    struct gpu_fence_event ev = *open;
    bpf_map_delete_elem(&gpu_fence_waits, &tid);
    ev.exit_ns = bpf_ktime_get_ns();
    return send_event(&ev, sizeof(ev));
}

/* Host-wide counts of the scheduler's tracepoints: 0 job queued by a target,
 * 1 job run, 2 job done (the last two for every process on the host). */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 4);
    __type(key, u32);
    __type(value, u64);
} gpu_drm_counts SEC(".maps");

static __always_inline void gpu_drm_count(u32 index)
{
    u64 *value = bpf_map_lookup_elem(&gpu_drm_counts, &index);
    if (value)
        *value += 1;
}

SEC("tracepoint/gpu_scheduler/drm_sched_job")
int gpu_drm_sched_job(void *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    gpu_drm_count(0);
    struct gpu_drm_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_DRM_JOB, bpf_ktime_get_ns(), id);
    ev.what = GPU_DRM_SCHED_JOB;
    return send_event(&ev, sizeof(ev));
}

SEC("tracepoint/gpu_scheduler/drm_run_job")
int gpu_drm_run_job(void *args)
{
    gpu_drm_count(1);
    return 0;
}

SEC("tracepoint/gpu_scheduler/drm_sched_process_job")
int gpu_drm_sched_process_job(void *args)
{
    gpu_drm_count(2);
    return 0;
}

/* ------------------------------------------------------------ CUPTI shim
 *
 * The USDT probes of probes/cupti/inferprobe_cupti.c (provider
 * "inferprobe_gpu"), attached where a target maps the shim, by libbpf, which
 * reads each probe's arguments from its note. One event per probe: the shim already batches
 * (CUPTI hands it buffers of records) and the records are what the GPU ran,
 * so there is nothing left to aggregate here. The api probe fires on the
 * launching thread: its tid and timestamp are what joins a GPU record (by
 * correlation id) to the launch uprobes above. A USDT attach is per process,
 * so no target check. */
/* USDT argument n (1-based, as the shim's header numbers them), 0 where unreadable. */
static __always_inline u64 gpu_shim_arg(struct pt_regs *ctx, u32 n)
{
    long value = 0;
    if (bpf_usdt_arg(ctx, n - 1, &value) != 0)
        count(COUNTER_USDT_BAD_ARGS);
    return value;
}

SEC("usdt")
int gpu_shim_api(struct pt_regs *ctx)
{
    struct gpu_api_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_API, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    u64 cbid = 0, domain = 0;
    ev.correlation_id = gpu_shim_arg(ctx, 1);
    cbid = gpu_shim_arg(ctx, 2);
    domain = gpu_shim_arg(ctx, 3);
    ev.cbid = cbid;
    ev.domain = domain;
    return send_event(&ev, sizeof(ev));
}

SEC("usdt")
int gpu_shim_activity(struct pt_regs *ctx)
{
    struct gpu_activity_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_ACTIVITY, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    u64 kind = 0, device = 0, stream = 0, name_id = 0;
    kind = gpu_shim_arg(ctx, 1);
    ev.gpu_start = gpu_shim_arg(ctx, 2);
    ev.gpu_end = gpu_shim_arg(ctx, 3);
    ev.correlation_id = gpu_shim_arg(ctx, 4);
    device = gpu_shim_arg(ctx, 5);
    stream = gpu_shim_arg(ctx, 6);
    ev.shape = gpu_shim_arg(ctx, 7);
    name_id = gpu_shim_arg(ctx, 8);
    /* A kind user space does not know would make it drop the event: count it instead. */
    if (kind < GPU_ACTIVITY_KERNEL || kind > GPU_ACTIVITY_MEMSET) {
        count(COUNTER_USDT_BAD_ARGS);
        return 0;
    }
    ev.kind = kind;
    ev.device = device;
    ev.stream = stream;
    ev.name_id = name_id;
    return send_event(&ev, sizeof(ev));
}

SEC("usdt")
int gpu_shim_clock(struct pt_regs *ctx)
{
    struct gpu_clock_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_CLOCK, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    ev.cupti_ns = gpu_shim_arg(ctx, 1);
    ev.mono_before_ns = gpu_shim_arg(ctx, 2);
    ev.mono_after_ns = gpu_shim_arg(ctx, 3);
    return send_event(&ev, sizeof(ev));
}

SEC("usdt")
int gpu_shim_kernel_name(struct pt_regs *ctx)
{
    struct gpu_kernel_name_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_KERNEL_NAME, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    u64 id = 0, name = 0;
    id = gpu_shim_arg(ctx, 1);
    name = gpu_shim_arg(ctx, 2);
    ev.name_id = id;
    long n = bpf_probe_read_user_str(ev.name, sizeof(ev.name), (void *)name);
    ev.len = n > 0 ? n - 1 : 0;
    return send_event(&ev, sizeof(ev));
}

SEC("usdt")
int gpu_shim_status(struct pt_regs *ctx)
{
    struct gpu_shim_status_event ev = {};
    fill_header(&ev.hdr, EVENT_GPU_SHIM_STATUS, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    u64 status = 0, result = 0, text = 0;
    status = gpu_shim_arg(ctx, 1);
    result = gpu_shim_arg(ctx, 2);
    text = gpu_shim_arg(ctx, 3);
    ev.status = status <= GPU_SHIM_STOPPED ? status : GPU_SHIM_CUPTI_ERROR;
    ev.cupti_result = result;
    long n = bpf_probe_read_user_str(ev.text, sizeof(ev.text), (void *)text);
    ev.len = n > 0 ? n - 1 : 0;
    return send_event(&ev, sizeof(ev));
}

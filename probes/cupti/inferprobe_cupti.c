/*
 * inferprobe_cupti.c: a small CUPTI client that turns the GPU's own record of
 * what it ran into inferprobe USDT probes (provider "inferprobe_gpu").
 *
 * A uprobe on cudaLaunchKernel sees when a CPU thread *enqueued* a kernel,
 * not when the GPU ran it. CUPTI's activity API does: the driver writes one
 * record per kernel, copy and memset, with GPU start and end timestamps and
 * the correlation id of the API call that launched it. This library enables
 * those records and fires a probe per record; bpf/gpu.bpf.c reads them.
 *
 * Two ways in (docs/gpu.md):
 *   - at process start: CUDA_INJECTION64_PATH=<this .so>; the driver calls
 *     InitializeInjection() during cuInit;
 *   - into a running process: `inferprobe gpu-attach -p PID` dlopen()s this
 *     file through gdb and calls inferprobe_cupti_start(); --detach calls
 *     inferprobe_cupti_stop(), which flushes and disables the records.
 *
 * Probes (arguments in order; docs/gpu.md has the table):
 *   api(correlation_id, cbid, domain)   at entry of a launch/copy/memset API
 *       call, on the calling thread: BPF stamps its tid and CLOCK_MONOTONIC,
 *       which is what joins a GPU record to the launch uprobes.
 *   activity(kind, start, end, correlation_id, device, stream, shape, name_id)
 *       one GPU record; start/end in CUPTI's clock; shape is the grid
 *       (x | y << 21 | z << 42) of a kernel, the byte count of a copy or memset.
 *   clock(cupti_ns, mono_before_ns, mono_after_ns)   a clock pairing.
 *   kernel_name(name_id, name)   once per name (and again when a tracer attaches).
 *   status(code, cupti_result, sentence)   what the shim did, in one sentence.
 *
 * Every probe has a semaphore: while no tracer is attached the records are
 * still consumed (CUPTI's buffers must be returned) but nothing is fired. A
 * poller thread re-sends, while a tracer is attached, the status and a clock
 * pairing every second and the name table every five seconds (and all three
 * when a tracer appears), so a recorder started after the shim still sees
 * them. Not only once: bcc raises the semaphores before its programs are
 * attached (it compiles in between), so what is sent at the rise alone can
 * be lost. The poller also flushes CUPTI's buffers, so records arrive within
 * a poll period instead of when a buffer fills.
 *
 * INFERPROBE_CUPTI_DUMP=<file> (read at start) also writes every probe's
 * arguments to that file, one line each (the api line with the calling
 * thread's tid and CLOCK_MONOTONIC, what BPF would stamp). It is for hosts
 * without BPF tooling, where benchmarks/gpu_check.py compares the shim's
 * records with torch.profiler's; a recording never needs it.
 */
#define _GNU_SOURCE
#define _SDT_HAS_SEMAPHORES 1
/* Every probe argument in a register: sdt.h's default also allows memory
 * operands such as "-4@status_code(%rip)", which bcc cannot read in a shared
 * library. */
#define STAP_SDT_ARG_CONSTRAINT r
#include <sys/sdt.h>

#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* Same codes as enum gpu_shim_status in bpf/inferprobe.h. */
enum shim_status {
    SHIM_NOT_STARTED = 0,
    SHIM_COLLECTING = 1,
    SHIM_NO_DEVICE = 2,
    SHIM_CUPTI_ERROR = 3,
    SHIM_STOPPED = 4,
};

/* Same values as enum gpu_activity_kind in bpf/inferprobe.h. */
enum activity_kind { ACT_KERNEL = 1, ACT_MEMCPY = 2, ACT_MEMSET = 3 };

#define PROBES(X) X(api) X(activity) X(clock) X(kernel_name) X(status)
#define DEFINE_SEMAPHORE(name)                                                 \
    __attribute__((section(".probes"), visibility("hidden"), used))            \
    volatile unsigned short inferprobe_gpu_##name##_semaphore = 0;
PROBES(DEFINE_SEMAPHORE)
/* Every argument goes out as 8 bytes: bcc's argument readers insist that the
 * BPF side reads exactly the size the note declares, and gpu.bpf.c reads u64s. */
#define U64(v) ((uint64_t)(uintptr_t)(v))
#define TRACED(name) __builtin_expect(inferprobe_gpu_##name##_semaphore != 0, 0)

/* Bounded name table: ids 1..MAX_NAMES; every later name shares OTHER_NAME_ID,
 * so a process that generates kernels without end (JIT) cannot grow it. */
#define MAX_NAMES 4096
#define NAME_BYTES 192
#define OTHER_NAME_ID 0xffff
#define BUFFER_BYTES (4u << 20)
#define POLL_MS 200
#define STATUS_EVERY_POLLS 5
#define NAMES_EVERY_POLLS 25

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int status_code = SHIM_NOT_STARTED;
static int status_result = 0;
static char status_text[256] = "the inferprobe CUPTI shim is loaded but was not started";
static CUpti_SubscriberHandle subscriber;
static int subscribed = 0;
static volatile int poller_running = 0;
static pthread_t poller;

static char *names[MAX_NAMES + 1];  /* by id; [0] unused */
static unsigned name_count = 0;

static FILE *dump = NULL;
static pthread_mutex_t dump_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t records_seen = 0;
static uint64_t records_dropped = 0;

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void dump_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void dump_line(const char *fmt, ...)
{
    if (!dump)
        return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&dump_lock);
    vfprintf(dump, fmt, ap);
    pthread_mutex_unlock(&dump_lock);
    va_end(ap);
}

static void fire_status(void)
{
    if (TRACED(status))
        STAP_PROBE3(inferprobe_gpu, status, U64(status_code), U64(status_result), U64(status_text));
    dump_line("status %d %d %s\n", status_code, status_result, status_text);
}

static void set_status(int code, int result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_status(int code, int result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(status_text, sizeof(status_text), fmt, ap);
    va_end(ap);
    status_code = code;
    status_result = result;
    fire_status();
}

static void fire_clock(void)
{
    if (!TRACED(clock) && !dump)
        return;
    uint64_t cupti_ns = 0;
    uint64_t before = monotonic_ns();
    cuptiGetTimestamp(&cupti_ns);
    uint64_t after = monotonic_ns();
    STAP_PROBE3(inferprobe_gpu, clock, U64(cupti_ns), U64(before), U64(after));
    dump_line("clock %llu %llu %llu\n", (unsigned long long)cupti_ns, (unsigned long long)before,
              (unsigned long long)after);
}

/* C++ kernel names come mangled; demangled they are shorter and readable.
 * libstdc++ is in every process that runs CUDA kernels from C++; where it is
 * not, the mangled name is kept. */
typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);

static char *readable_name(const char *raw)
{
    static demangle_fn demangle = NULL;
    static int looked = 0;
    if (!looked) {
        demangle = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
        looked = 1;
    }
    char *out = NULL;
    if (demangle && raw[0] == '_' && raw[1] == 'Z') {
        int st = 0;
        out = demangle(raw, NULL, NULL, &st);
        if (st != 0)
            out = NULL;
    }
    if (!out)
        out = strdup(raw);
    if (out && strlen(out) >= NAME_BYTES)
        out[NAME_BYTES - 1] = '\0';
    return out;
}

/* Called with lock held. Linear search by pointer first (CUPTI shares one
 * name string per kernel), then by text: the table is small and this runs
 * in CUPTI's worker thread, off the application's path. */
static const char *name_keys[MAX_NAMES + 1];

static unsigned name_id(const char *raw)
{
    if (!raw)
        return 0;
    for (unsigned i = 1; i <= name_count; i++)
        if (name_keys[i] == raw)
            return i;
    if (name_count >= MAX_NAMES)
        return OTHER_NAME_ID;
    char *readable = readable_name(raw);
    if (!readable)
        return OTHER_NAME_ID;
    for (unsigned i = 1; i <= name_count; i++) {
        if (strcmp(names[i], readable) == 0) {
            free(readable);
            return i;
        }
    }
    unsigned id = ++name_count;
    names[id] = readable;
    name_keys[id] = raw;
    if (TRACED(kernel_name))
        STAP_PROBE2(inferprobe_gpu, kernel_name, U64(id), U64(names[id]));
    dump_line("name %u %s\n", id, names[id]);
    return id;
}

static void resend_names(void)
{
    if (!TRACED(kernel_name))
        return;
    for (unsigned i = 1; i <= name_count; i++)
        STAP_PROBE2(inferprobe_gpu, kernel_name, U64(i), U64(names[i]));
}

static uint64_t grid_shape(int32_t x, int32_t y, int32_t z)
{
    const uint64_t mask = (1u << 21) - 1;
    return ((uint64_t)x & mask) | (((uint64_t)y & mask) << 21) | (((uint64_t)z & mask) << 42);
}

static void emit_record(CUpti_Activity *record)
{
    records_seen++;
    if (!TRACED(activity) && !dump)
        return;
    /* An untraced STAP_PROBE is a nop: with only the dump on, it costs nothing more. */
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        CUpti_ActivityKernel9 *k = (CUpti_ActivityKernel9 *)record;
        unsigned id = name_id(k->name);
        uint64_t grid = grid_shape(k->gridX, k->gridY, k->gridZ);
        STAP_PROBE8(inferprobe_gpu, activity, U64(ACT_KERNEL), U64(k->start), U64(k->end), U64(k->correlationId),
                    U64(k->deviceId), U64(k->streamId), U64(grid), U64(id));
        dump_line("activity %d %llu %llu %u %u %u %llu %u\n", ACT_KERNEL, (unsigned long long)k->start,
                  (unsigned long long)k->end, k->correlationId, k->deviceId, k->streamId,
                  (unsigned long long)grid, id);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)record;
        /* name_id carries the copy kind (CUpti_ActivityMemcpyKind) for copies. A copy's
         * correlationId is the driver call's; a cudaMemcpy* also has the runtime call's,
         * which is the one the api probe saw (runtime callbacks are enabled for copies). */
        uint32_t correlation = m->runtimeCorrelationId ? m->runtimeCorrelationId : m->correlationId;
        STAP_PROBE8(inferprobe_gpu, activity, U64(ACT_MEMCPY), U64(m->start), U64(m->end), U64(correlation),
                    U64(m->deviceId), U64(m->streamId), U64(m->bytes), U64(m->copyKind));
        dump_line("activity %d %llu %llu %u %u %u %llu %u\n", ACT_MEMCPY, (unsigned long long)m->start,
                  (unsigned long long)m->end, correlation, m->deviceId, m->streamId,
                  (unsigned long long)m->bytes, (unsigned)m->copyKind);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)record;
        STAP_PROBE8(inferprobe_gpu, activity, U64(ACT_MEMSET), U64(m->start), U64(m->end), U64(m->correlationId),
                    U64(m->deviceId), U64(m->streamId), U64(m->bytes), U64(0));
        dump_line("activity %d %llu %llu %u %u %u %llu 0\n", ACT_MEMSET, (unsigned long long)m->start,
                  (unsigned long long)m->end, m->correlationId, m->deviceId, m->streamId,
                  (unsigned long long)m->bytes);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer,
                                      size_t size, size_t valid)
{
    (void)stream_id;
    CUpti_Activity *record = NULL;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
        emit_record(record);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS)
        records_dropped += dropped;
    pthread_mutex_unlock(&lock);
    (void)size;
    free(buffer);
}

/* At entry of the API calls that put work on the GPU. The correlation id is
 * the one CUPTI also writes into that work's activity record. */
static void CUPTIAPI on_api(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                            const void *data)
{
    (void)userdata;
    const CUpti_CallbackData *info = data;
    if (info->callbackSite != CUPTI_API_ENTER)
        return;
    if (TRACED(api))
        STAP_PROBE3(inferprobe_gpu, api, U64(info->correlationId), U64(cbid), U64(domain));
    if (dump)
        dump_line("api %u %u %u %ld %llu\n", info->correlationId, (unsigned)cbid, (unsigned)domain,
                  (long)gettid(), (unsigned long long)monotonic_ns());
}

static const CUpti_CallbackId RUNTIME_CBIDS[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_ptds_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemset_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020,
};
static const CUpti_CallbackId DRIVER_CBIDS[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};

static const char *result_name(CUptiResult r)
{
    const char *s = NULL;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s)
        return "unknown CUPTI result";
    return s;
}

/* CUPTI's ways of saying there is no GPU (or no driver) to trace. */
static int means_no_device(CUptiResult r)
{
    return r == CUPTI_ERROR_NOT_INITIALIZED ||
           r == CUPTI_ERROR_INVALID_DEVICE || r == CUPTI_ERROR_NOT_COMPATIBLE;
}

static int fail(const char *step, CUptiResult r)
{
    /* Say why there is no device where it is plain: no driver in the process. */
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver)
        dlclose(driver);
    if (means_no_device(r))
        set_status(SHIM_NO_DEVICE, r, "CUPTI found no CUDA device in pid %d%s (%s: %s)", getpid(),
                   driver ? "" : ", which has no CUDA driver (libcuda.so.1) loaded", step, result_name(r));
    else
        set_status(SHIM_CUPTI_ERROR, r, "CUPTI refused to trace pid %d (%s: %s)", getpid(), step,
                   result_name(r));
    return -1;
}

static void *poll_loop(void *unused)
{
    (void)unused;
    int was_traced = 0;
    unsigned polls = 0;
    while (poller_running) {
        struct timespec ts = {0, POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
        int traced = inferprobe_gpu_status_semaphore || inferprobe_gpu_activity_semaphore || dump;
        if (traced && !was_traced)
            polls = 0;
        if (traced) {
            pthread_mutex_lock(&lock);
            if (polls % STATUS_EVERY_POLLS == 0)
                fire_status();
            if (polls % NAMES_EVERY_POLLS == 0)
                resend_names();
            pthread_mutex_unlock(&lock);
            if (polls % STATUS_EVERY_POLLS == 0)
                fire_clock();
            polls++;
        }
        was_traced = traced;
        if (traced && status_code == SHIM_COLLECTING)
            cuptiActivityFlushAll(0);
    }
    return NULL;
}

static void start_poller(void)
{
    if (poller_running)
        return;
    poller_running = 1;
    if (pthread_create(&poller, NULL, poll_loop, NULL) != 0)
        poller_running = 0;
}

static const CUpti_ActivityKind KINDS[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
};

static void flush_at_exit(void)
{
    if (status_code == SHIM_COLLECTING)
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (dump)
        fflush(dump);
}

static int start_collecting(void)
{
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS)
        return fail("cuptiActivityRegisterCallbacks", r);
    for (size_t i = 0; i < sizeof(KINDS) / sizeof(KINDS[0]); i++) {
        r = cuptiActivityEnable(KINDS[i]);
        if (r != CUPTI_SUCCESS) {
            for (size_t j = 0; j < i; j++)
                cuptiActivityDisable(KINDS[j]);
            return fail("cuptiActivityEnable", r);
        }
    }
    r = cuptiSubscribe(&subscriber, (CUpti_CallbackFunc)on_api, NULL);
    if (r != CUPTI_SUCCESS) {
        for (size_t j = 0; j < sizeof(KINDS) / sizeof(KINDS[0]); j++)
            cuptiActivityDisable(KINDS[j]);
        return fail("cuptiSubscribe", r);
    }
    subscribed = 1;
    for (size_t i = 0; i < sizeof(RUNTIME_CBIDS) / sizeof(RUNTIME_CBIDS[0]); i++)
        cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, RUNTIME_CBIDS[i]);
    for (size_t i = 0; i < sizeof(DRIVER_CBIDS) / sizeof(DRIVER_CBIDS[0]); i++)
        cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, DRIVER_CBIDS[i]);
    set_status(SHIM_COLLECTING, 0, "CUPTI is recording kernel, copy and memset activity in pid %d",
               getpid());
    return 0;
}

/* Starts collection; returns the status code. Safe to call again. */
EXPORT int inferprobe_cupti_start(void)
{
    if (status_code == SHIM_COLLECTING)
        return status_code;
    const char *path = getenv("INFERPROBE_CUPTI_DUMP");
    if (path && *path && !dump) {
        dump = fopen(path, "a");
        if (dump)
            atexit(flush_at_exit);  /* records still in CUPTI's buffers at exit */
    }
    start_collecting();
    /* Also after a failure: the poller re-sends the status sentence to a
     * recorder that attaches later, which is how it learns why. */
    start_poller();
    return status_code;
}

/* Stops collection (the library stays loaded: unloading CUPTI from a running
 * process is not supported). Returns the status code. */
EXPORT int inferprobe_cupti_stop(void)
{
    if (status_code == SHIM_COLLECTING) {
        for (size_t j = 0; j < sizeof(KINDS) / sizeof(KINDS[0]); j++)
            cuptiActivityDisable(KINDS[j]);
        cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        if (subscribed) {
            cuptiUnsubscribe(subscriber);
            subscribed = 0;
        }
        if (dump)
            fflush(dump);
        set_status(SHIM_STOPPED, 0,
                   "CUPTI activity collection stopped in pid %d after %llu records (%llu dropped by CUPTI)",
                   getpid(), (unsigned long long)records_seen, (unsigned long long)records_dropped);
    }
    return status_code;
}

/* The last status as one sentence (read by gpu-attach through gdb). */
EXPORT const char *inferprobe_cupti_status(void)
{
    return status_text;
}

/* Sends one constructed record of each kind through the same code as CUPTI's
 * (emit_record, on_api), so that a host without a GPU can check the whole
 * path to a recording, field offsets included (tests/integration/gpu). The
 * values are fixed; docs/gpu.md lists them. Returns the records sent. */
EXPORT int inferprobe_cupti_selftest(void)
{
    static const char name[] = "inferprobe_selftest_kernel";
    CUpti_ActivityKernel9 kernel;
    memset(&kernel, 0, sizeof(kernel));
    kernel.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    kernel.start = 1000000;
    kernel.end = 1250000;
    kernel.correlationId = 41;
    kernel.deviceId = 0;
    kernel.streamId = 7;
    kernel.gridX = 128;
    kernel.gridY = 2;
    kernel.gridZ = 1;
    kernel.name = name;
    CUpti_ActivityMemcpy6 copy;
    memset(&copy, 0, sizeof(copy));
    copy.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    copy.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
    copy.bytes = 4096;
    copy.start = 1300000;
    copy.end = 1310000;
    copy.correlationId = 42;
    copy.streamId = 7;
    CUpti_ActivityMemset4 set;
    memset(&set, 0, sizeof(set));
    set.kind = CUPTI_ACTIVITY_KIND_MEMSET;
    set.bytes = 512;
    set.start = 1320000;
    set.end = 1321000;
    set.correlationId = 43;
    set.streamId = 7;
    CUpti_CallbackData call;
    memset(&call, 0, sizeof(call));
    call.callbackSite = CUPTI_API_ENTER;
    call.correlationId = 41;
    on_api(NULL, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, &call);
    pthread_mutex_lock(&lock);
    emit_record((CUpti_Activity *)&kernel);
    emit_record((CUpti_Activity *)&copy);
    emit_record((CUpti_Activity *)&set);
    pthread_mutex_unlock(&lock);
    return 4;
}

/* CUDA_INJECTION64_PATH entry point: the driver calls it once, in cuInit. */
EXPORT int InitializeInjection(void)
{
    inferprobe_cupti_start();
    return 1;
}

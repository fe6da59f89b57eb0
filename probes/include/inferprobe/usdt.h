/*
 * inferprobe USDT probes for C and C++ servers (provider "inferprobe").
 *
 * The same probes, argument names and argument order as the Python API
 * (inferprobe.probes, docs/usdt-probes.md); every argument is passed as int64.
 *
 * Use:
 *   // in exactly one .c/.cc file of the program or library:
 *   #define INFERPROBE_USDT_DEFINE_SEMAPHORES
 *   #include <inferprobe/usdt.h>
 *   // everywhere else just:
 *   #include <inferprobe/usdt.h>
 *
 *   INFERPROBE_REQUEST_START(req_id, prompt_tokens, conn_fd);
 *   if (INFERPROBE_ENABLED()) { ...compute costly arguments... }
 *
 * Each probe macro first tests the probe's USDT semaphore, which a tracer
 * increments while attached, so untraced it costs one load and a branch and
 * its arguments are not evaluated. Arguments may therefore be evaluated zero
 * times: do not pass expressions with side effects.
 *
 * Needs <sys/sdt.h> (Debian/Ubuntu: systemtap-sdt-dev; Fedora:
 * systemtap-sdt-devel). The include path: python -c 'import
 * inferprobe.probes as p; print(p.include_dir())'.
 *
 * sys/sdt.h only supports semaphores for a whole translation unit: every
 * STAP_PROBE in a file that includes this header must have a semaphore
 * named <provider>_<name>_semaphore. Keep other providers' probes that have
 * none in other files.
 */
#ifndef INFERPROBE_USDT_H
#define INFERPROBE_USDT_H

#if defined(_SYS_SDT_H) && !defined(_SDT_HAS_SEMAPHORES)
#error "<sys/sdt.h> was included without _SDT_HAS_SEMAPHORES before <inferprobe/usdt.h>: include <inferprobe/usdt.h> first"
#endif
#ifndef _SDT_HAS_SEMAPHORES
#define _SDT_HAS_SEMAPHORES 1
#endif
#include <sys/sdt.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* sys/sdt.h requires these exact names: <provider>_<probe>_semaphore. */
#define INFERPROBE__SEMAPHORES(X)  \
    X(request_start)               \
    X(request_queued)              \
    X(request_scheduled)           \
    X(prefill_start)               \
    X(prefill_end)                 \
    X(decode_step_start)           \
    X(decode_step_end)             \
    X(token_emit)                  \
    X(request_end)                 \
    X(queue_depth)                 \
    X(kv_usage)

#define INFERPROBE__DECLARE(name) extern volatile unsigned short inferprobe_##name##_semaphore;
INFERPROBE__SEMAPHORES(INFERPROBE__DECLARE)
#undef INFERPROBE__DECLARE

#ifdef INFERPROBE_USDT_DEFINE_SEMAPHORES
/* ".probes": a writable, file-backed section where tracers expect semaphores. */
#define INFERPROBE__DEFINE(name) \
    __attribute__((section(".probes"), used)) volatile unsigned short inferprobe_##name##_semaphore = 0;
INFERPROBE__SEMAPHORES(INFERPROBE__DEFINE)
#undef INFERPROBE__DEFINE
#endif

#ifdef __cplusplus
}
#endif

#define INFERPROBE__LIKELY_OFF(name) __builtin_expect(inferprobe_##name##_semaphore != 0, 0)

/* True while a tracer is attached to that one probe. */
#define INFERPROBE_PROBE_ENABLED(name) (inferprobe_##name##_semaphore != 0)

#define INFERPROBE__OR(name) | inferprobe_##name##_semaphore
/* True while a tracer is attached to any inferprobe probe. */
#define INFERPROBE_ENABLED() ((0 INFERPROBE__SEMAPHORES(INFERPROBE__OR)) != 0)

#define INFERPROBE__FIRE2(name, a, b)                                           \
    do {                                                                        \
        if (INFERPROBE__LIKELY_OFF(name))                                       \
            STAP_PROBE2(inferprobe, name, (int64_t)(a), (int64_t)(b));          \
    } while (0)
#define INFERPROBE__FIRE3(name, a, b, c)                                        \
    do {                                                                        \
        if (INFERPROBE__LIKELY_OFF(name))                                       \
            STAP_PROBE3(inferprobe, name, (int64_t)(a), (int64_t)(b), (int64_t)(c)); \
    } while (0)

/* One macro per probe; parameter names are the contract's argument names. */
#define INFERPROBE_REQUEST_START(req_id, prompt_tokens, conn_fd) \
    INFERPROBE__FIRE3(request_start, req_id, prompt_tokens, conn_fd)
#define INFERPROBE_REQUEST_QUEUED(req_id, queue_depth) \
    INFERPROBE__FIRE2(request_queued, req_id, queue_depth)
#define INFERPROBE_REQUEST_SCHEDULED(req_id, batch_size) \
    INFERPROBE__FIRE2(request_scheduled, req_id, batch_size)
#define INFERPROBE_PREFILL_START(req_id, prompt_tokens) \
    INFERPROBE__FIRE2(prefill_start, req_id, prompt_tokens)
#define INFERPROBE_PREFILL_END(req_id, prompt_tokens) \
    INFERPROBE__FIRE2(prefill_end, req_id, prompt_tokens)
#define INFERPROBE_DECODE_STEP_START(step_id, batch_size, tokens_in_batch) \
    INFERPROBE__FIRE3(decode_step_start, step_id, batch_size, tokens_in_batch)
#define INFERPROBE_DECODE_STEP_END(step_id, batch_size, tokens_in_batch) \
    INFERPROBE__FIRE3(decode_step_end, step_id, batch_size, tokens_in_batch)
#define INFERPROBE_TOKEN_EMIT(req_id, token_index) \
    INFERPROBE__FIRE2(token_emit, req_id, token_index)
#define INFERPROBE_REQUEST_END(req_id, output_tokens, status) \
    INFERPROBE__FIRE3(request_end, req_id, output_tokens, status)
#define INFERPROBE_QUEUE_DEPTH(waiting, running) \
    INFERPROBE__FIRE2(queue_depth, waiting, running)
#define INFERPROBE_KV_USAGE(used, capacity) \
    INFERPROBE__FIRE2(kv_usage, used, capacity)

#endif /* INFERPROBE_USDT_H */

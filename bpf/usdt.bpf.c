/* usdt.bpf.c: the inferprobe USDT probes of an instrumented server.
 *
 * One handler per probe; collector/attach/probe_sets/usdt.py attaches each handler
 * to the probe of the same name in every target process that has it (found
 * in the ELF notes of the files it maps). A handler copies the probe's
 * integer arguments into a usdt_event: the probes carry ids and counts only,
 * never prompt or completion text. No target check: a USDT attach is per
 * process already.
 *
 * The handlers are written out one by one because bcc rewrites each
 * bpf_usdt_readarg() call for the function it sits in and refuses it inside
 * a macro; and a handler is compiled only when some target has its probe
 * (bcc cannot generate argument readers for an unattached function): the
 * loader passes -DUSDT_WANT_<probe> for each probe it found.
 */
#include "common.bpf.h"

static __always_inline void usdt_begin(struct usdt_event *ev, u32 probe, u32 nargs)
{
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, EVENT_USDT, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    ev->probe = probe;
    ev->nargs = nargs;
}

static __always_inline void check_read(int rc)
{
    if (rc != 0)
        count(COUNTER_USDT_BAD_ARGS);
}


#ifdef USDT_WANT_request_start
int usdt_request_start(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_REQUEST_START, 3);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    check_read(bpf_usdt_readarg(3, ctx, &ev.args[2]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_request_queued
int usdt_request_queued(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_REQUEST_QUEUED, 2);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_request_scheduled
int usdt_request_scheduled(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_REQUEST_SCHEDULED, 2);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_prefill_start
int usdt_prefill_start(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_PREFILL_START, 2);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_prefill_end
int usdt_prefill_end(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_PREFILL_END, 2);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_decode_step_start
int usdt_decode_step_start(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_DECODE_STEP_START, 3);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    check_read(bpf_usdt_readarg(3, ctx, &ev.args[2]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_decode_step_end
int usdt_decode_step_end(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_DECODE_STEP_END, 3);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    check_read(bpf_usdt_readarg(3, ctx, &ev.args[2]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_token_emit
int usdt_token_emit(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_TOKEN_EMIT, 2);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_request_end
int usdt_request_end(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_REQUEST_END, 3);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    check_read(bpf_usdt_readarg(3, ctx, &ev.args[2]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_queue_depth
int usdt_queue_depth(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_QUEUE_DEPTH, 2);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    return send_event(&ev, sizeof(ev));
}
#endif

#ifdef USDT_WANT_kv_usage
int usdt_kv_usage(struct pt_regs *ctx)
{
    struct usdt_event ev;
    usdt_begin(&ev, USDT_KV_USAGE, 2);
    check_read(bpf_usdt_readarg(1, ctx, &ev.args[0]));
    check_read(bpf_usdt_readarg(2, ctx, &ev.args[1]));
    return send_event(&ev, sizeof(ev));
}
#endif

/* usdt.bpf.c: the inferprobe USDT probes of an instrumented server.
 *
 * Built ahead of time (CO-RE, libbpf; common.bpf.h). One program serves
 * every probe: collector/attach/probe_sets/usdt.py attaches it to each
 * inferprobe probe in every target process that has one (found in the ELF
 * notes of the files it maps), with the probe's number (enum usdt_probe) as
 * the attachment's cookie. libbpf reads the probe's argument specification
 * from the note at attach time and bpf_usdt_arg() follows it, so a process
 * found later (an adopted server, a new worker) gets its probes without a
 * rebuild, which bcc's compiled-in argument readers could not do.
 *
 * The handler copies the probe's integer arguments into a usdt_event: the
 * probes carry ids and counts only, never prompt or completion text. No
 * target check: a USDT attach is per process already.
 */
#include "common.bpf.h"
#include <bpf/usdt.bpf.h>

SEC("usdt")
int usdt_probe(struct pt_regs *ctx)
{
    struct usdt_event ev;
    __builtin_memset(&ev, 0, sizeof(ev));
    fill_header(&ev.hdr, EVENT_USDT, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    ev.probe = (u32)bpf_usdt_cookie(ctx);

    int nargs = bpf_usdt_arg_cnt(ctx);
    if (nargs < 0) {
        count(COUNTER_USDT_BAD_ARGS);
        nargs = 0;
    }
    if (nargs > USDT_MAX_ARGS)
        nargs = USDT_MAX_ARGS;
    ev.nargs = nargs;
    for (int i = 0; i < USDT_MAX_ARGS; i++) {
        long value = 0;
        if (i >= nargs)
            break;
        if (bpf_usdt_arg(ctx, i, &value) != 0)
            count(COUNTER_USDT_BAD_ARGS);
        ev.args[i] = value;
    }
    return send_event(&ev, sizeof(ev));
}

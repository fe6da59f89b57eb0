/* trace_context.bpf.h: W3C trace context, a request's traceparent and
 * tracestate header values, wherever they stand in its header block.
 *
 * The classifier's head holds a request's first SCAN_HEAD_BYTES; a
 * traceparent behind a long header block (cookies, a proxy's X-Forwarded-*,
 * an SDK's x-stainless-* set) lies past it, and a header block may come in
 * several reads (a server reading what TCP delivered) or writes (a client
 * writing its headers line by line). So this scan has windows of its own:
 * the head first, then the syscall's further bytes SCAN_HEAD_BYTES at a time
 * (each window starting TRACE_WINDOW_OVERLAP before the last one ended, so
 * that a header name cut by a window's end is whole in the next), then the
 * request's following reads or writes while its header block is open, up to
 * TRACE_HEADER_BYTES in all. Vectored I/O: its first iovec when the head
 * came from it alone (Node's http client writes a request as one iovec),
 * else as far as the head gathered it (the iovecs past it are not walked).
 *
 * What leaves the kernel: the two values only, each from after its name's
 * colon to its line's end (never a byte of the next line), at most
 * TRACEPARENT_MAX_BYTES and TRACESTATE_MAX_BYTES; their shape is checked in
 * user space (collector/trace_context.py). Names are matched in any case.
 *
 * Needs struct scratch (scratch.bpf.h), the byte tools (scan_bytes.bpf.h)
 * and struct trace_scan below, which sock.bpf.c keeps in a per-CPU map of
 * its own (bcc rewrites map calls only there); the chain program
 * scan_trace_context in sock.bpf.c drives the windows.
 */
#ifndef INFERPROBE_TRACE_CONTEXT_BPF_H
#define INFERPROBE_TRACE_CONTEXT_BPF_H

#define TRACE_WINDOW_OVERLAP 16   /* > strlen("\ntraceparent:") */
#define MAX_TRACE_WINDOWS 16      /* per syscall: 16 tail calls, ~7.7 KB past the head */

/* A header block left open at the end of a read or write: the next read
 * (write) of the request side goes on with it. */
struct trace_open {
    u32 scanned;       /* bytes of the header block looked at so far */
    u32 ended_line;    /* the last byte seen was a '\n': the next bytes start a line */
};

/* The per-CPU state of one syscall's scan, from window to window. Offsets
 * are in the syscall's bytes; `start` is that of buf[0] (-1 for a later
 * syscall's first window, whose buf[0] stands for the last byte before it). */
struct trace_scan {
    u8 buf[SCRATCH_BYTES];
    struct trace_context_event ev;
    u64 io_exit_ns;     /* the syscall this state is about */
    u64 user_base;      /* where its bytes lie in user memory, 0: only the head (in buf) */
    u32 whole;          /* user_base (or the head) holds every byte the syscall moved */
    u32 pad_whole;
    s32 start;
    u32 n;              /* bytes in buf */
    u32 len;            /* bytes of the syscall the scan may look at */
    u32 windows;
    u32 scanned_before; /* header bytes seen in earlier syscalls */
    u32 ended;          /* the blank line was found */
    u32 parent_at, parent_end;  /* the traceparent value's bounds (+ 1; 0: not found / not yet) */
    u32 state_at, state_end;
};

/* v & mask, kept by the compiler: where it can prove v <= mask it drops the
 * AND, and the verifier, which tracks 32-bit bounds less well, then refuses
 * a helper's size argument. */
static __always_inline u64 trace_bounded(u64 v, u64 mask)
{
    asm volatile("" : "+r"(v));
    return v & mask;
}

/* A '\n' at q in buf: the blank line ending the headers (1), the end of a
 * value's line, or the start of a traceparent or tracestate line. */
static __always_inline int trace_newline(struct trace_scan *t, u32 q)
{
    u32 n = t->n;
    s32 at = t->start + (s32)q;   /* the newline's offset in the syscall */
    u8 before = q >= 1 ? t->buf[(q - 1) & SCRATCH_MASK] : 0;
    u32 cr = before == '\r';
    u32 end = (u32)(at - (s32)cr) + 1;
    if (t->parent_at && !t->parent_end && end > t->parent_at)
        t->parent_end = end;
    if (t->state_at && !t->state_end && end > t->state_at)
        t->state_end = end;
    if (before == '\n' || (cr && q >= 2 && t->buf[(q - 2) & SCRATCH_MASK] == '\n')) {
        t->ended = 1;
        return 1;
    }
    if (q + 13 > n)
        return 0;   /* the next window, which overlaps this one, sees the line whole */
    u64 first = load8(t->buf, q);
    if (MATCHES(first, "\ntracepa", 8) && MATCHES(load8(t->buf, q + 8), "rent:", 5)) {
        t->parent_at = (u32)(at + 13) + 1;
        t->parent_end = 0;
        t->ev.header_offset = t->scanned_before + (u32)(at + 1);
    } else if (MATCHES(first, "\ntracest", 8) && MATCHES(load8(t->buf, q + 8), "ate:", 4)) {
        t->state_at = (u32)(at + 12) + 1;
        t->state_end = 0;
    }
    return 0;
}

/* One window: every newline in buf[0, n). 1 when the headers ended. */
static __always_inline int trace_scan_window(struct trace_scan *t)
{
    u32 n = t->n;
    for (u32 base = 0; base < SCAN_HEAD_BYTES; base += 8) {
        if (base >= n)
            break;
        u64 found = newlines(t->buf, base, 0, n);
        if (!found)
            continue;
#pragma unroll
        for (u32 b = 0; b < 8; b++) {
            if ((found & (0x80ULL << (8 * b))) && trace_newline(t, base + b))
                return 1;
            stay_in_memory();
        }
    }
    return 0;
}

/* Copies a value found whole, [at, end) of the syscall's bytes (both + 1,
 * the optional blanks after the colon included: user space strips them),
 * from the user buffer (plain I/O) or from buf (vectored: the head only).
 * Returns its length; *cut when it was longer than max. */
static __always_inline u32 trace_value(struct trace_scan *t, char *dst, u32 max, u32 at, u32 end,
                                       u64 user_base, int *cut)
{
    if (!at || !end || end <= at)
        return 0;
    u32 from = at - 1, len = end - at;
    if (len > max) {
        len = max;
        *cut = 1;
    }
    /* max is a power of two: the mask changes nothing but lets the verifier see the bound */
    u64 size = trace_bounded(len, 2 * max - 1);   /* max is a power of two: == len */
    if (size == 0 || size > max)
        return 0;
    if (user_base)
        bpf_probe_read_user(dst, size, (void *)(user_base + from));
    else
        bpf_probe_read_kernel(dst, size, &t->buf[(u32)((s32)from - t->start) & (SCAN_HEAD_BYTES - 1)]);
    return (u32)size;
}

/* The event's values once the scan of a syscall is over: a value whose line
 * end was not seen is flagged cut and left empty. */
static __always_inline void trace_values(struct trace_scan *t, u64 user_base)
{
    struct trace_context_event *ev = &t->ev;
    int cut = 0;
    if (t->parent_at) {
        u32 got = trace_value(t, ev->traceparent, TRACEPARENT_MAX_BYTES, t->parent_at, t->parent_end,
                              user_base, &cut);
        ev->traceparent_len = got;
        if (got)
            ev->flags |= TRACE_CONTEXT_FLAG_TRACEPARENT;
        if (cut || !t->parent_end)
            ev->flags |= TRACE_CONTEXT_FLAG_TRACEPARENT_CUT;
    }
    cut = 0;
    if (t->state_at) {
        u32 got = trace_value(t, ev->tracestate, TRACESTATE_MAX_BYTES, t->state_at, t->state_end,
                              user_base, &cut);
        ev->tracestate_len = got;
        if (got)
            ev->flags |= TRACE_CONTEXT_FLAG_TRACESTATE;
        if (cut || !t->state_end)
            ev->flags |= TRACE_CONTEXT_FLAG_TRACESTATE_CUT;
    }
}

#endif /* INFERPROBE_TRACE_CONTEXT_BPF_H */

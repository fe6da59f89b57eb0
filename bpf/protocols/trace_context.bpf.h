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
 * user space (collector/ingest/trace_context.py). Names are matched in any case.
 *
 * Needs struct scratch (scratch.bpf.h), the byte tools (scan_bytes.bpf.h)
 * and struct trace_scan below, which sock.bpf.c keeps in a per-CPU map of
 * its own (the maps are all sock.bpf.c's); the chain program
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
    u32 continues;     /* TRACE_CONTINUES_*: a value the last syscall ended inside (trace_values_open) */
    u32 parent_have;   /* how many of its bytes were seen */
    u32 state_have;
    u32 parent_line_at; /* where the traceparent line starts in the request */
};
#define TRACE_CONTINUES_PARENT 1
#define TRACE_CONTINUES_STATE 2

/* The bytes of the values a syscall ended inside, for the next one to finish
 * (sock.bpf.c keeps them per connection in trace_values_open). */
struct trace_partial {
    u8 parent[TRACEPARENT_MAX_BYTES];
    u8 state[TRACESTATE_MAX_BYTES];
};

/* The per-CPU state of one syscall's scan, from window to window. Offsets
 * are in the syscall's bytes; `start` is that of buf[0] (-1 for a later
 * syscall's first window, whose buf[0] stands for the last byte before it). */
struct trace_scan {
    u8 buf[SCRATCH_BYTES];
    u8 value[4 * TRACESTATE_MAX_BYTES];   /* where a value is put together from its parts (trace_value) */
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
    u32 continues;      /* TRACE_CONTINUES_*: values begun in an earlier syscall (at offset 0 here) */
    u32 parent_have, state_have;   /* ... and how many of their bytes it saw */
};

/* A '\n' at q in buf: the blank line ending the headers (1), the end of a
 * value's line, or the start of a traceparent or tracestate line. */
static __always_inline int trace_newline(struct trace_scan *t, u32 q)
{
    u32 n = t->n;
    s32 at = t->start + (s32)q;   /* the newline's offset in the syscall */
    u8 before = q >= 1 ? t->buf[(q - 1) & SCRATCH_MASK] : 0;
    u32 cr = before == '\r';
    u32 end = (u32)(at - (s32)cr) + 1;
    /* >=: an empty value's line ends right at its start (not at the next line's end) */
    if (t->parent_at && !t->parent_end && end >= t->parent_at)
        t->parent_end = end;
    if (t->state_at && !t->state_end && end >= t->state_at)
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

struct trace_walk {
    struct trace_scan *t;
    u32 ended;
};

/* One word of the window: 1 when the headers ended in it. */
SCAN_CALLBACK(trace_word)
{
    struct trace_walk *walk = context;
    struct trace_scan *t = walk->t;
    u32 base = index * 8;
    if (base >= t->n)
        return 1;
    u64 found = newlines(t->buf, base, 0, t->n);
    if (!found)
        return 0;
#pragma unroll
    for (u32 b = 0; b < 8; b++) {
        if ((found & (0x80ULL << (8 * b))) && trace_newline(t, base + b)) {
            walk->ended = 1;
            return 1;
        }
        stay_in_memory();
    }
    return 0;
}

/* One window: every newline in buf[0, n). 1 when the headers ended. */
static __always_inline int trace_scan_window(struct trace_scan *t)
{
    struct trace_walk walk = {.t = t};
    SCAN_LOOP(words_to(0, t->n), SCAN_HEAD_BYTES / 8, trace_word, &walk);
    return walk.ended;
}

/* Copies a value, [at, end) of the syscall's bytes (both + 1, the optional
 * blanks after the colon included: user space strips them), after the
 * `carried` bytes an earlier syscall saw of it (a value cut by that
 * syscall's end), into dst. This syscall's part comes from the user buffer
 * (plain I/O) or from buf (vectored: the head only); a part that lies in
 * pieces held before this syscall (its first `held` bytes, which are the
 * head's: join_open_head in sock.bpf.c) comes from the head. The parts are
 * put together in t->value first. Returns the length; *cut when the value
 * was longer than max. */
static __always_inline u32 trace_value(struct trace_scan *t, char *dst, u32 max, u32 at, u32 end,
                                       u64 user_base, const u8 *head, u32 held,
                                       const u8 *carried, u32 carried_len, int *cut)
{
    if (!at || !end || end < at || carried_len > max || (carried_len && !carried))
        return 0;
    u32 from = at - 1, total = carried_len + (end - at);
    if (total > max) {
        total = max;
        *cut = 1;
    }
    /* max is a power of two: each mask changes nothing but lets the verifier see the bound */
    u64 size = bounded(total, 2 * max - 1);
    u64 c = bounded(carried_len, 2 * max - 1);
    if (size == 0 || size > max || c > size)
        return 0;
    if (c > 0)
        bpf_probe_read_kernel(t->value, c, carried);
    u64 rest = bounded(size - c, 2 * max - 1);
    u8 *to = &t->value[c & (2 * max - 1)];
    if (rest > 0 && rest <= max) {
        if (user_base && from < held) {
            u64 in_head = bounded(held - from < rest ? held - from : rest, 2 * max - 1);
            if (in_head > 0 && in_head <= max)
                bpf_probe_read_kernel(to, in_head, &head[from & (SCAN_HEAD_BYTES - 1)]);
            u64 after = bounded(rest - in_head, 2 * max - 1);
            if (after > 0 && after <= max)
                bpf_probe_read_user(&t->value[(c + in_head) & (2 * max - 1)], after,
                                    (void *)(user_base + held));
        } else if (user_base) {
            bpf_probe_read_user(to, rest, (void *)(user_base + from));
        } else {
            bpf_probe_read_kernel(to, rest, &t->buf[(u32)((s32)from - t->start) & (SCAN_HEAD_BYTES - 1)]);
        }
    }
    /* a line cut between its '\r' and '\n': the '\r' came with the carried part */
    if (t->value[(size - 1) & (2 * max - 1)] == '\r')
        size = bounded(size - 1, 2 * max - 1);
    if (size > 0 && size <= max)
        bpf_probe_read_kernel(dst, size, t->value);
    return (u32)size;
}

/* One of the event's values (traceparent or tracestate) from its bounds,
 * after the `have` bytes an earlier syscall saw of it: its length, and its
 * flags in *flags (found; cut: too long, or its line end not seen). */
static __always_inline u32 trace_event_value(struct trace_scan *t, char *dst, u32 max, u32 at, u32 end,
                                             u32 have, const u8 *carried, u64 user_base, const u8 *head,
                                             u32 held, u16 *flags, u16 found_flag, u16 cut_flag)
{
    if (!at)
        return 0;
    int cut = 0;
    u32 got = trace_value(t, dst, max, at, end, user_base, head, held, carried, have, &cut);
    if (got)
        *flags |= found_flag;
    if (cut || !end)
        *flags |= cut_flag;
    return got;
}

/* The event's values once the scan of a syscall is over: a value whose line
 * end was not seen is flagged cut and left empty. `partial` holds the bytes
 * of values an earlier syscall ended inside (t->continues). */
static __always_inline void trace_values(struct trace_scan *t, u64 user_base, const u8 *head, u32 held,
                                         const struct trace_partial *partial)
{
    struct trace_context_event *ev = &t->ev;
    ev->traceparent_len = trace_event_value(
        t, ev->traceparent, TRACEPARENT_MAX_BYTES, t->parent_at, t->parent_end,
        t->continues & TRACE_CONTINUES_PARENT ? t->parent_have : 0, partial ? partial->parent : 0,
        user_base, head, held, &ev->flags, TRACE_CONTEXT_FLAG_TRACEPARENT, TRACE_CONTEXT_FLAG_TRACEPARENT_CUT);
    ev->tracestate_len = trace_event_value(
        t, ev->tracestate, TRACESTATE_MAX_BYTES, t->state_at, t->state_end,
        t->continues & TRACE_CONTINUES_STATE ? t->state_have : 0, partial ? partial->state : 0,
        user_base, head, held, &ev->flags, TRACE_CONTEXT_FLAG_TRACESTATE, TRACE_CONTEXT_FLAG_TRACESTATE_CUT);
}

/* A value the syscall ended inside (at set, its line end not seen): its bytes
 * so far, after the `have` an earlier syscall saw, into keep and *kept; 1 if
 * kept, 0 when too long already (then it is flagged cut on the event). */
static __always_inline int trace_keep_value(struct trace_scan *t, u8 *keep, u32 max, u32 at, s32 seen,
                                            u32 have, const u8 *carried, u64 user_base, const u8 *head,
                                            u32 held, u32 *kept)
{
    if (!at || seen < 0)
        return 0;
    int cut = 0;
    *kept = trace_value(t, (char *)keep, max, at, (u32)seen + 1, user_base, head, held, carried, have, &cut);
    return !cut;
}

/* A syscall that ends inside a value whose line goes on in the next one:
 * its bytes so far into `keep` and `open`, and the value is taken off this
 * syscall's event. */
static __always_inline void trace_keep_partial(struct trace_scan *t, struct trace_open *open,
                                               struct trace_partial *keep, s32 seen, u64 user_base,
                                               const u8 *head, u32 held, const struct trace_partial *partial)
{
    if (!t->parent_end &&
        trace_keep_value(t, keep->parent, TRACEPARENT_MAX_BYTES, t->parent_at, seen,
                         t->continues & TRACE_CONTINUES_PARENT ? t->parent_have : 0,
                         partial ? partial->parent : 0, user_base, head, held, &open->parent_have)) {
        open->continues |= TRACE_CONTINUES_PARENT;
        open->parent_line_at = t->ev.header_offset;
        t->parent_at = 0;
    }
    if (!t->state_end &&
        trace_keep_value(t, keep->state, TRACESTATE_MAX_BYTES, t->state_at, seen,
                         t->continues & TRACE_CONTINUES_STATE ? t->state_have : 0,
                         partial ? partial->state : 0, user_base, head, held, &open->state_have)) {
        open->continues |= TRACE_CONTINUES_STATE;
        t->state_at = 0;
    }
}

#endif /* INFERPROBE_TRACE_CONTEXT_BPF_H */

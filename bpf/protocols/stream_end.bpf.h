/* stream_end.bpf.h: how a write ends, from its last bytes.
 *
 * Holds scan_tail: the chunked body's terminator (CHUNKED_END), the line
 * ends that close a chunked body sent in pieces (end_lines), a [DONE]
 * beyond the windows scanned, and an NDJSON line ending the write
 * (json_line_at_end). Reads the head when the write's last buffer is all in
 * it, else copies the last SCAN_TAIL_BYTES into the scratch tail. Needs
 * struct scratch (scratch.bpf.h) and the byte tools (scan_bytes.bpf.h);
 * the last buffer is found by find_last_iovec (gather.bpf.h). Run once per
 * body write, by finish_body (sock.bpf.c).
 */
#ifndef INFERPROBE_STREAM_END_BPF_H
#define INFERPROBE_STREAM_END_BPF_H

#define CHUNKED_END "\r\n0\r\n\r\n"   /* the empty last chunk after the previous one's CRLF */

/* How a write ends, for a chunked body whose end comes in pieces (cpp-httplib,
 * llama.cpp's server: the last data chunk, then "0\r\n", then "\r\n"; or the
 * last data chunk and "0\r\n" in one write, then trailers and the blank line):
 * "\r\n0\r\n" is the last chunk's line after a chunk, "\r\n\r\n" an empty line.
 * The session decides with the response's state (collector/ingest/sessionizer.py).
 * `mask` bounds the reads inside `buf` for the verifier. */
static __always_inline void end_lines(struct scratch *s, const u8 *buf, u32 len, u32 mask)
{
    if (len < 4)
        return;
    /* Hide len's range from the compiler, so that it keeps the masks the
     * verifier needs (it would drop them as no-ops). */
    asm volatile("" : "+r"(len));
    u8 c1 = buf[(len - 1) & mask], c2 = buf[(len - 2) & mask], c3 = buf[(len - 3) & mask],
       c4 = buf[(len - 4) & mask];
    if (c1 != '\n' || c2 != '\r')
        return;
    if (c3 == '\n' && c4 == '\r')
        s->ev.flags |= HTTP_FLAG_BLANK_LINE_END;
    else if (c3 == '0' && c4 == '\n' && len >= 5 && buf[(len - 5) & mask] == '\r')
        s->ev.flags |= HTTP_FLAG_LAST_CHUNK;
}

/* 1 when the tail ends an NDJSON line: '}' or ']', the line end ("\n" or
 * "\r\n"), and maybe the CRLF that closes its chunk. For a write longer than
 * the windows scanned, whose end only the tail sees. */
static __always_inline u32 json_line_at_end(struct scratch *s, const u8 *tail, u32 t)
{
    u32 e = t;
    asm volatile("" : "+r"(e));   /* keep the masks: see end_lines() */
    if (s->ev.flags & HTTP_FLAG_CHUNKED_END && e >= 5)
        e -= 5;   /* "0\r\n\r\n" after the line's chunk */
    if (e >= 3 && tail[(e - 1) & (SCAN_TAIL_BYTES - 1)] == '\n' && tail[(e - 2) & (SCAN_TAIL_BYTES - 1)] == '\r' &&
        tail[(e - 3) & (SCAN_TAIL_BYTES - 1)] == '\n')
        e -= 2;   /* the chunk's CRLF after the line's own '\n' */
    if (e < 2 || tail[(e - 1) & (SCAN_TAIL_BYTES - 1)] != '\n')
        return 0;
    e--;
    if (tail[(e - 1) & (SCAN_TAIL_BYTES - 1)] == '\r')
        e--;
    if (e < 1)
        return 0;
    u8 c = tail[(e - 1) & (SCAN_TAIL_BYTES - 1)];
    return c == '}' || c == ']';
}

struct tail_walk {
    struct scratch *s;
    u32 len, done;
};

/* Word `index` of the tail: 1 (and done) at a "[DONE]" that starts in it and
 * lies whole within the tail's len bytes. */
SCAN_CALLBACK(tail_done_word)
{
    struct tail_walk *walk = context;
    struct scratch *s = walk->s;
    u32 base = index * 8, len = walk->len;
    if (base + 6 > len)
        return 1;
    u64 found = within(bytes_equal(load8_tail(s->tail, base), '['), base, 0, len - 5);
#pragma unroll
    for (u32 b = 0; b < 8; b++) {
        if ((found & (0x80ULL << (8 * b))) && MATCHES(load8_tail(s->tail, base + b), "[done]", 6)) {
            walk->done = 1;
            return 1;
        }
    }
    return 0;
}

/* The last bytes of a write: the chunked terminator and [DONE] trail the
 * final token chunk when a server coalesces the end of a stream. */
static __always_inline void scan_tail(struct scratch *s)
{
    u64 len = s->last_len;
    if (!len)
        return;
    if (s->tail_in_head) {
        /* The last buffer is all in the head (most token chunks): its end is
         * there, also across iovecs, so "\r\n0\r\n\r\n" split between two is
         * seen; its [DONE] was looked for by scan_sse. */
        u32 n = s->n;
        if (n >= 7 && MATCHES(load8(s->head, n - 7), CHUNKED_END, 7))
            s->ev.flags |= HTTP_FLAG_CHUNKED_END;
        if (s->body_start < n)   /* not the blank line that ends the headers */
            end_lines(s, s->head, n, SCRATCH_MASK);
        return;
    }
    u32 t = len > SCAN_TAIL_BYTES ? SCAN_TAIL_BYTES : (u32)len;
    if (t < 5 || t > SCAN_TAIL_BYTES)
        return;
    bpf_probe_read_user(s->tail, t, (void *)(s->last_base + len - t));
    s->tail_read = t;
    end_lines(s, s->tail, t, SCAN_TAIL_BYTES - 1);
    /* [DONE] beyond the windows scanned is only looked for in the tail. */
    u32 tail_is_new = (u64)s->ev.bytes > s->window_start + s->n;
    struct tail_walk walk = {.s = s, .len = t};
    SCAN_LOOP(SCAN_TAIL_BYTES / 8, SCAN_TAIL_BYTES / 8, tail_done_word, &walk);
    if (walk.done)
        s->done |= tail_is_new << 1;   /* bit 1: seen in the tail only */
    if (t >= 7 && MATCHES(load8_tail(s->tail, t - 7), CHUNKED_END, 7))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
    /* The last chunk as a buffer of its own at the end of a vectored write
     * (Node.js writes it so): its CRLF before is in another iovec. */
    if (len == 5 && MATCHES(load8_tail(s->tail, 0), "0\r\n\r\n", 5))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
    if (tail_is_new)
        s->json_lines += json_line_at_end(s, s->tail, t);
}

#endif /* INFERPROBE_STREAM_END_BPF_H */

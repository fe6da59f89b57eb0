/* sse.bpf.h: Server-Sent Events, the token stream of most inference servers.
 *
 * Holds the body scan for SSE lines (scan_sse, sse_line): "data:" fields,
 * "data: [DONE]", and "event:" names that make an event no token
 * (named_event); and finish_sse, which turns the counts into the io_event's
 * sse_events, json_lines and named_events. Needs struct scratch
 * (scratch.bpf.h) and the byte tools (scan_bytes.bpf.h). Run by scan_body
 * (sock.bpf.c) over each window of a body (body_windows.bpf.h); the JSON
 * fields of the same windows are scan_fields' (stream_fields.bpf.h).
 */
#ifndef INFERPROBE_SSE_BPF_H
#define INFERPROBE_SSE_BPF_H

/* The data line at p of an event whose "event:" line came just before it:
 * returns 1 when that name makes the event no token. A name ending in
 * "delta" streams content (Anthropic's content_block_delta, OpenAI's
 * response.output_text.delta), except message_delta; an empty one is the
 * default type, "message". Anything else (message_start, ping, response.completed) is a
 * stream event, counted and its first name kept. Decided here, at the data
 * line, rather than at each line end: the scan loop has a budget of
 * branches per position that the verifier can follow. */
static __always_inline int named_event(struct scratch *s, u32 p)
{
    u32 start = s->event_name_at - 1, end = p - 1;   /* p - 1: the event line's '\n' */
    s->event_name_at = 0;
    if (s->head[(end - 1) & SCRATCH_MASK] == '\r')
        end--;
    if (s->head[start & SCRATCH_MASK] == ' ')
        start++;
    u32 len = end - start;
    /* Anthropic's message_delta is the exception: it carries the stop reason
     * and the usage, never content. */
    if (end <= start || (len >= 5 && EQUALS(load8(s->head, end - 5), "delta", 5) &&
                         !(len == 13 && EQUALS(load8(s->head, start), "message_", 8))))
        return 0;
    s->named_events++;
    if (!s->first_name_at) {
        s->first_name_at = start + 1;
        s->first_name_len = end - start;
    }
    return 1;
}

/* A body line starting at p: an SSE "data:" field, and whether it is
 * "data: [DONE]"; an "event:" field naming the event; a blank line ending
 * it. Counts live in the scratch map, not in registers, so that paths
 * through the scan differ in nothing the verifier tracks. */
static __always_inline void sse_line(struct scratch *s, u32 p)
{
    u32 n = s->n;
    if (p >= n)
        return;
    u64 word = load8(s->head, p);
    /* A window another one follows leaves a line it cannot see whole, up to
     * "data: [DONE]", to that one (line_room); the last sees up to the end
     * of the write. Field names are case-sensitive in SSE: "data:" and
     * "event:" exactly; [DONE] in any case. */
    if (EQUALS(word, "event:", 6)) {
        s->event_name_at = p + s->line_room <= n ? p + 7 : 0;
        return;
    }
    if (!EQUALS(word, "data:", 5)) {
        s->event_name_at = 0;   /* only an event line just before its data names it */
        return;
    }
    if (p + s->line_room > n) {
        s->deferred = 1;
        return;
    }
    if (s->event_name_at && named_event(s, p))
        return;   /* the data of a named event that is not a token */
    s->data_lines++;
    if ((p + 11 <= n && MATCHES(load8(s->head, p + 5), "[done]", 6)) ||
        (p + 12 <= n && MATCHES(load8(s->head, p + 5), " [done]", 7)))
        s->done |= 1;   /* bit 0: seen in the head, its "data:" was counted */
}

/* The next word of the body with a newline: an SSE line starts after each. */
SCAN_CALLBACK(sse_word)
{
    struct line_walk *walk = context;
    struct scratch *s = walk->s;
    int stopped = next_match(s, walk->from, WORD_NEWLINES);
    if (stopped != 1)
        return stopped == 2;
    stay_in_memory();
    u32 base = s->scan_at - 8;
    u64 found = s->scan_found;
#pragma unroll
    for (u32 b = 0; b < 8; b++) {
        if (found & (0x80ULL << (8 * b)))
            sse_line(s, base + b + 1);
        stay_in_memory();
    }
    return 0;
}

/* Body: SSE "data:" fields at the start of a line, and "data: [DONE]". In a
 * window after the first, body_start only bounds the newlines looked at: the
 * lines starting before it were the previous window's. */
static __always_inline void scan_sse(struct scratch *s)
{
    u32 n = s->n, start = s->body_start;
    if (!s->windows) {
        s->data_lines = 0;
        s->done = 0;
        s->deferred = 0;
        s->named_events = 0;
        s->event_name_at = 0;
    }
    s->line_room = s->more ? 12 : 5;
    s->first_name_at = 0;
    if (start >= n || start >= SCAN_HEAD_BYTES)
        return;
    if (!s->windows)
        sse_line(s, start);   /* a line begins where the body does */
    struct line_walk walk = {.s = s, .first = start & ~7U, .from = start};
    s->scan_at = walk.first;
    SCAN_LOOP(words_to(walk.first, n), SCAN_HEAD_BYTES / 8, sse_word, &walk);
}

static __always_inline void finish_sse(struct scratch *s)
{
    u32 data_lines = s->data_lines;
    if (s->done)
        s->ev.flags |= HTTP_FLAG_SSE_DONE;
    if ((s->done & 1) && data_lines)
        data_lines--;   /* the [DONE] line is the end marker, not a token */
    /* Events whose choices or delta are empty hold no token. */
    data_lines = s->empty_events < data_lines ? data_lines - s->empty_events : 0;
    s->ev.sse_events = data_lines > 0xffff ? 0xffff : data_lines;
    s->ev.json_lines = s->json_lines > 0xffff ? 0xffff : s->json_lines;
    s->ev.named_events = s->named_events > 0xffff ? 0xffff : s->named_events;
}

#endif /* INFERPROBE_SSE_BPF_H */

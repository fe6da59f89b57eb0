/* event_stream.bpf.h: AWS event streams, the binary stream shape of Bedrock.
 *
 * Holds scan_event_stream_window: the token messages, the other events, an
 * exception and the stated usage of a body window whose connection's
 * response said Content-Type: application/vnd.amazon.eventstream
 * (BODY_AWS_EVENTS, remember_body in sock.bpf.c). Needs struct scratch
 * (scratch.bpf.h), the byte tools (scan_bytes.bpf.h) and take_stated_counts
 * (stream_fields.bpf.h). Run by the scan_event_stream program (sock.bpf.c)
 * in place of the SSE and JSON scans, on either side (a server's writes,
 * a client's reads), over each window of a body (body_windows.bpf.h).
 *
 * A message is a prelude (total length and headers length, big-endian
 * u32s, and the prelude's CRC), headers, a payload and a CRC. A header is
 * its name's length (one byte), the name, a value type (7: a string), and
 * a string's length (big-endian u16) and bytes. Bedrock's messages:
 *   invoke-with-response-stream: :event-type "chunk", whose JSON payload
 *     {"bytes":"<base64>"} holds the model's own event (Anthropic's
 *     message_start, content_block_delta, ...);
 *   converse-stream: :event-type messageStart, contentBlockDelta, ...,
 *     messageStop and metadata, whose payload states the usage as JSON;
 *   either: :message-type "exception" with :exception-type
 *     (throttlingException, modelStreamErrorException, ...).
 *
 * Why look for the header names rather than walk the preludes: a read
 * starts anywhere in a message (a client reads what has arrived, 8 KiB at
 * a time, and chunked framing may sit between messages), and a walk lost
 * at one read's start would stay lost. The byte before ":event-type" is
 * 0x0b (its length), before ":exception-type" 0x0f: control bytes that
 * JSON text (where they must be escaped), base64 and chunk framing never
 * hold, so the scan tests only the prelude's and the CRCs' bytes beside
 * the headers. The prelude is read where it is known to be (the
 * :event-type header first, as Bedrock writes it) to find a chunk's
 * payload. Nothing of a payload leaves the kernel: a base64 prefix is
 * compared, and a usage count read as a number.
 */
#ifndef INFERPROBE_EVENT_STREAM_BPF_H
#define INFERPROBE_EVENT_STREAM_BPF_H

#define AWS_STRING_VALUE 7
/* The bytes a header needs in view to be read: the longest name looked at
 * (":exception-type", after its length byte) and its value's type and
 * length, and the longest value compared ("contentBlockDelta"). Shorter
 * than WINDOW_OVERLAP, so a header cut by a window's end is whole in the
 * next window, which alone counts it. */
#define AWS_HEADER_ROOM 32
/* {"bytes":" and the base64 of {"type":"content_block_delt: a chunk of
 * Anthropic's Messages API (base64 of its compact JSON, "type" first) is a
 * token only as a content_block_delta. */
#define AWS_CHUNK_PREFIX 46
/* Length bytes looked at per window: a 512-byte window holds four or five
 * of Bedrock's messages (one header each that matters; its smallest, an
 * empty ping, is 80 bytes), and a prelude's or CRC's byte is 0x0b or 0x0f
 * once in 128, so 16 leave room; any past them are not read. */
#define AWS_MAX_HEADERS AWS_MAX_HEADERS_SLOTS

/* len bytes (8 or AWS_CHUNK_PREFIX) of the body at pos, relative to the
 * head, into s->es_peek: from the head where it holds them, else from the
 * plain buffer the head was copied from (a message cut by a window's edge,
 * its prelude in the window before). 0 where neither has them (iovecs). */
static __always_inline int peek(struct scratch *s, s32 pos, u32 len)
{
    if (pos >= 0 && pos + len <= s->n) {
        bpf_probe_read_kernel(s->es_peek, len, &s->head[pos & (SCAN_HEAD_BYTES - 1)]);
        return 1;
    }
    if (s->ev.flags & HTTP_FLAG_VECTORED || s->h2_scan_len)
        return 0;   /* the head came from iovecs, or from an HTTP/2 frame's payload */
    s64 at = (s64)s->window_start + pos;
    if (at < 0 || (u64)at + len > s->last_len)
        return 0;
    return bpf_probe_read_user(s->es_peek, len, (void *)(s->last_base + at)) == 0;
}

/* Whether the chunk message whose :event-type header is at p has its
 * payload's first AWS_CHUNK_PREFIX bytes in s->es_peek: its prelude 12
 * bytes before the header (the header is first, as Bedrock writes it), the
 * payload after the headers it states. */
static __always_inline int chunk_payload(struct scratch *s, u32 p)
{
    if (!s->windows && p < s->body_start + 12)
        return 0;   /* the prelude would be in the response's headers */
    if (!peek(s, (s32)p - 12, 8))
        return 0;
    u64 lengths = *(u64 *)s->es_peek;   /* total and headers length, big-endian */
    u32 total = __builtin_bswap32((u32)lengths), headers = __builtin_bswap32((u32)(lengths >> 32));
    if (headers < 20 || headers > 256 || total < headers + 16 + AWS_CHUNK_PREFIX)
        return 0;
    return peek(s, (s32)(p + headers), AWS_CHUNK_PREFIX);
}

/* 1 when a chunk's payload (s->es_peek) is one of Anthropic's events other
 * than a content_block_delta (message_start, ping, content_block_start and
 * _stop, message_delta, message_stop): an event of the stream, not a token.
 * Any other model's chunk (Llama's {"generation":...}, Titan's, a legacy
 * {"completion":...}) is a token. */
static __always_inline int anthropic_non_token(struct scratch *s)
{
    const u8 *q = s->es_peek;
    if (!EQUALS(load8(q, 0), "{\"bytes\"", 8) || !EQUALS(load8(q, 8), ":\"eyJ0eX", 8) ||
        !EQUALS(load8(q, 16), "BlIjoi", 6))
        return 0;   /* not {"bytes":"<base64 of {"type":">: no Messages API event */
    return !(EQUALS(load8(q, 22), "Y29udGVu", 8) && EQUALS(load8(q, 30), "dF9ibG9j", 8) &&
             EQUALS(load8(q, 38), "a19kZWx0", 8));
}

/* A string header's value length at p (its big-endian u16 length's first byte). */
static __always_inline u32 value_len(struct scratch *s, u32 p)
{
    return (u32)s->head[p & SCRATCH_MASK] << 8 | s->head[(p + 1) & SCRATCH_MASK];
}

/* :event-type at p (its length byte): what the message is. */
static __always_inline void event_type_header(struct scratch *s, u32 p)
{
    if (!EQUALS(load8(s->head, p + 1), ":event-t", 8) || !EQUALS(load8(s->head, p + 9), "ype\x07", 4))
        return;
    u32 len = value_len(s, p + 13), v = p + 15;
    if (v + len > s->n)
        return;
    u64 w = load8(s->head, v);
    if (len == 5 && EQUALS(w, "chunk", 5)) {
        if (chunk_payload(s, p) && anthropic_non_token(s))
            s->named_events++;
        else
            s->data_lines++;
    } else if (len == 17 && EQUALS(w, "contentB", 8) && EQUALS(load8(s->head, v + 8), "lockDelt", 8)) {
        s->data_lines++;   /* converse-stream's text (or tool input) delta */
    } else {
        s->named_events++;   /* messageStart, contentBlockStart and Stop, messageStop, metadata */
        if (len == 8 && EQUALS(w, "metadata", 8))
            s->es_usage_from = v + 8 + 1;   /* its payload, after the last headers, states the usage */
    }
}

/* :exception-type at p: the stream ended in an error, named (an AWS error
 * code such as throttlingException, never a message). */
static __always_inline void exception_type_header(struct scratch *s, u32 p)
{
    if (!EQUALS(load8(s->head, p + 1), ":excepti", 8) || !EQUALS(load8(s->head, p + 9), "on-type\x07", 8))
        return;
    u32 len = value_len(s, p + 17), v = p + 19;
    s->ev.stream_flags |= STREAM_FLAG_EXCEPTION;
    /* Copied as an SSE event's name is (stream_fields.bpf.h), within the bytes in view. */
    s->first_name_at = v + 1;
    s->first_name_len = v + len <= s->n ? len : v < s->n ? s->n - v : 0;
    take_event_name(s);
}

/* The next word of the window: where it holds a header's length byte
 * (0x0b, 0x0f), noted for header_at. Two loops rather than one: the header
 * reads, inlined at each of a word's eight bytes, made a program the
 * verifier took 160 ms over, and one it refused without bpf_loop. */
SCAN_CALLBACK(event_stream_word)
{
    struct line_walk *walk = context;
    struct scratch *s = walk->s;
    u32 base = walk->first + index * 8;
    if (base >= s->es_limit)
        return 1;
    u64 w = load8(s->head, base);
    u64 found = within(bytes_equal(w, 0x0b) | bytes_equal(w, 0x0f), base, walk->from, s->es_limit);
    if (!found)
        return 0;
#pragma unroll
    for (u32 b = 0; b < 8; b++) {
        if (found & (0x80ULL << (8 * b))) {
            u32 k = s->es_hits;
            if (k < AWS_MAX_HEADERS)
                s->es_hit_at[k & (AWS_MAX_HEADERS - 1)] = base + b;
            s->es_hits = k + 1;
        }
        stay_in_memory();
    }
    return 0;
}

/* The index-th length byte noted: the header it may start. */
SCAN_CALLBACK(header_at)
{
    struct scratch *s = ((struct line_walk *)context)->s;
    u32 p = s->es_hit_at[index & (AWS_MAX_HEADERS - 1)];
    if (s->head[p & SCRATCH_MASK] == 0x0b)
        event_type_header(s, p);
    else
        exception_type_header(s, p);
    return 0;
}

/* converse-stream's metadata payload: "inputTokens" and "outputTokens", as
 * numbers (stream_fields.bpf.h's take_stated_counts), found by their 'T'. */
SCAN_CALLBACK(usage_word)
{
    struct line_walk *walk = context;
    struct scratch *s = walk->s;
    u32 base = walk->first + index * 8;
    if (base >= s->n)
        return 1;
    u64 found = within(bytes_equal(load8(s->head, base), 'T'), base, walk->from, s->n);
#pragma unroll
    for (u32 b = 0; b < 8; b++) {
        if (found & (0x80ULL << (8 * b))) {
            u32 u = base + b;
            if (EQUALS(load8(s->head, u), "Tokens\"", 7)) {
                if (EQUALS(load8(s->head, u - 7), "\"output", 7))
                    s->output_at = u + 8;
                else if (EQUALS(load8(s->head, u - 6), "\"input", 6))
                    s->input_at = u + 8;
            }
        }
        stay_in_memory();
    }
    return 0;
}

static __always_inline void take_usage(struct scratch *s)
{
    u32 from = s->es_usage_from;
    s->es_usage_from = 0;
    /* A metadata message cut by this window's end: the next reads on from its start. */
    s->es_usage_next = from && s->more;
    if (!from || from - 1 >= s->n)
        return;
    from--;
    struct line_walk walk = {.s = s, .first = from & ~7U, .from = from};
    SCAN_LOOP(words_to(walk.first, s->n), SCAN_HEAD_BYTES / 8, usage_word, &walk);
    take_stated_counts(s);
}

/* The window's headers: those starting in [from, es_limit), where from is
 * the body's start in the first window and 0 in later ones (which begin
 * with the last AWS_HEADER_ROOM or more bytes of the one before, and count
 * what it left), and es_limit leaves AWS_HEADER_ROOM for a window to follow. */
static __always_inline void scan_event_stream_window(struct scratch *s)
{
    u32 n = s->n, from = s->windows ? 0 : s->body_start;
    if (!s->windows) {
        s->data_lines = 0;
        s->named_events = 0;
        s->done = 0;
        s->deferred = 0;
        s->event_name_at = 0;
        s->first_name_at = 0;
        s->es_usage_next = 0;
    }
    s->es_limit = s->more && n > AWS_HEADER_ROOM ? n - AWS_HEADER_ROOM : n;
    s->es_usage_from = s->es_usage_next ? 1 : 0;   /* position + 1; 0: no metadata payload */
    if (from >= s->es_limit || from >= SCAN_HEAD_BYTES) {
        take_usage(s);
        return;
    }
    struct line_walk walk = {.s = s, .first = from & ~7U, .from = from};
    s->scan_at = walk.first;
    s->es_hits = 0;
    SCAN_LOOP(words_to(walk.first, s->es_limit), SCAN_HEAD_BYTES / 8, event_stream_word, &walk);
    SCAN_LOOP(s->es_hits, AWS_MAX_HEADERS, header_at, &walk);
    take_usage(s);
}

#endif /* INFERPROBE_EVENT_STREAM_BPF_H */

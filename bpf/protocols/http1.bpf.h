/* http1.bpf.h: HTTP/1.x, the request line and the header block.
 *
 * Holds the request line (parse_method, request_line, copy_path), the
 * status line (status_line), the header block's scan (scan_headers: its
 * end, chunked, Connection: close, and where Content-Length and
 * Content-Type start), the two values read from it (parse_content_length,
 * content_type: an SSE or NDJSON stream), and the pieces of a chunked
 * body's end written on their own (chunked_end_piece). Needs struct scratch
 * (scratch.bpf.h) and the byte tools (scan_bytes.bpf.h).
 *
 * Where it plugs in: classify_request and classify_response in sock.bpf.c look at
 * a syscall's first bytes (first_bytes) and send an HTTP/1 request or
 * response down scan_header_block, which calls the scans here; bodies go to
 * scan_body (sse.bpf.h) and scan_fields (stream_fields.bpf.h). Another
 * protocol (TLS plaintext fed to the same chain, HTTP/2) is a header like
 * this one, recognising its own first bytes, plus one branch in those two
 * dispatchers.
 */
#ifndef INFERPROBE_HTTP1_BPF_H
#define INFERPROBE_HTTP1_BPF_H

/* The method a request line opens with, from its first 8 bytes (first_bytes),
 * and in *after where its path starts. */
static __always_inline u8 parse_method(u64 first8, u32 *after)
{
    if (STARTS(first8, "GET ")) { *after = 4; return HTTP_METHOD_GET; }
    if (STARTS(first8, "POST ")) { *after = 5; return HTTP_METHOD_POST; }
    if (STARTS(first8, "PUT ")) { *after = 4; return HTTP_METHOD_PUT; }
    if (STARTS(first8, "DELETE ")) { *after = 7; return HTTP_METHOD_DELETE; }
    if (STARTS(first8, "HEAD ")) { *after = 5; return HTTP_METHOD_HEAD; }
    if (STARTS(first8, "OPTIONS ")) { *after = 8; return HTTP_METHOD_OPTIONS; }
    if (STARTS(first8, "PATCH ")) { *after = 6; return HTTP_METHOD_PATCH; }
    return HTTP_METHOD_UNKNOWN;
}

static __always_inline int path_ends_at(u8 c)
{
    return c == ' ' || c == '?' || c == '#' || c == '\r' || c == '\n';
}

/* The path from `start`: `len` counts the bytes walked before its end. */
struct path_walk {
    struct scratch *s;
    u32 start, len;
};

/* Byte k of the path: copied into the event, or 1 where the path ends. */
SCAN_CALLBACK(path_byte)
{
    struct path_walk *walk = context;
    struct scratch *s = walk->s;
    u32 pos = walk->start + index;
    if (pos >= s->n)
        return 1;
    u8 c = s->head[pos & SCRATCH_MASK];
    if (path_ends_at(c))
        return 1;
    s->ev.path[bounded(index, PATH_MAX_BYTES - 1)] = c;
    walk->len = index + 1;
    return 0;
}

/* Byte k past the first PATH_MAX_BYTES of a long path: 1 at its end (len
 * then says where, counted from `start`; 0 when the bytes in view ran out). */
SCAN_CALLBACK(path_end_byte)
{
    struct path_walk *walk = context;
    struct scratch *s = walk->s;
    u32 pos = walk->start + index;
    if (pos >= s->n)
        return 1;   /* the path runs past the bytes in view */
    if (path_ends_at(s->head[pos & SCRATCH_MASK])) {
        walk->len = index;
        return 1;
    }
    return 0;
}

/* A path longer than PATH_MAX_BYTES: its end found within PATH_SCAN_BYTES,
 * its last bytes go after its first PATH_HEAD_BYTES and path_len says how
 * long it was (bpf/inferprobe.h). */
static __always_inline void keep_path_end(struct scratch *s, u32 start)
{
    struct path_walk walk = {.s = s, .start = start + PATH_MAX_BYTES};
    SCAN_LOOP(PATH_SCAN_BYTES - PATH_MAX_BYTES, PATH_SCAN_BYTES - PATH_MAX_BYTES, path_end_byte, &walk);
    u32 end = walk.len ? walk.len + PATH_MAX_BYTES : 0;
    if (end <= PATH_MAX_BYTES)
        return;   /* exactly PATH_MAX_BYTES long, or longer than PATH_SCAN_BYTES */
    u32 tail_from = start + end - (PATH_MAX_BYTES - PATH_HEAD_BYTES);
#pragma unroll
    for (u32 k = 0; k < PATH_MAX_BYTES - PATH_HEAD_BYTES; k++)
        s->ev.path[PATH_HEAD_BYTES + k] = s->head[(tail_from + k) & SCRATCH_MASK];
    s->ev.path_len = end;
}

/* Copies the path of a request line up to a space or '?': the query string
 * can carry user data, so it is never copied. */
static __always_inline void copy_path(struct scratch *s, u32 start)
{
    struct path_walk walk = {.s = s, .start = start};
    SCAN_LOOP(PATH_MAX_BYTES, PATH_MAX_BYTES, path_byte, &walk);
    u32 len = walk.len;
    s->ev.path_len = len;
    if (len == PATH_MAX_BYTES)
        keep_path_end(s, start);
}

/* A request line: a method parse_method() knew, then a path from '/'. Sets
 * the event's kind, method and path; 1 when it is one. */
static __always_inline int request_line(struct scratch *s, u8 method, u32 after)
{
    if (method == HTTP_METHOD_UNKNOWN || after >= s->n || s->head[after & SCRATCH_MASK] != '/')
        return 0;
    s->ev.kind = HTTP_KIND_REQUEST;
    s->ev.method = method;
    copy_path(s, after);
    return 1;
}

/* A status line, "HTTP/1.x NNN": sets the event's kind and status; 1 when it
 * is one. */
static __always_inline int status_line(struct scratch *s, u64 first8)
{
    if (!STARTS(first8, "HTTP/1.") || s->n < 12 || s->head[8] != ' ')
        return 0;
    u8 d0 = s->head[9], d1 = s->head[10], d2 = s->head[11];
    if (!(d0 >= '1' && d0 <= '5' && d1 >= '0' && d1 <= '9' && d2 >= '0' && d2 <= '9'))
        return 0;
    s->ev.kind = HTTP_KIND_RESPONSE;
    s->ev.status = (d0 - '0') * 100 + (d1 - '0') * 10 + (d2 - '0');
    return 1;
}

/* A Content-Type value starting at v: text/event-stream, with or without
 * parameters ("; charset=utf-8"); NDJSON; AWS's event stream. */
static __always_inline void content_type(struct scratch *s, u32 v)
{
    u32 n = s->n;
    if (v < n && s->head[v & SCRATCH_MASK] == ' ')
        v++;
    if (v + 17 <= n && MATCHES(load8(s->head, v), "text/eve", 8) &&
        MATCHES(load8(s->head, v + 8), "nt-strea", 8) && (s->head[(v + 16) & SCRATCH_MASK] | 0x20) == 'm') {
        s->ev.flags |= HTTP_FLAG_EVENT_STREAM;
        return;
    }
    /* NDJSON / JSON Lines: application/x-ndjson, application/ndjson,
     * application/jsonl, application/x-jsonlines (and x-jsonl, jsonlines). */
    if (v + 17 > n || !MATCHES(load8(s->head, v), "applicat", 8) || !MATCHES(load8(s->head, v + 8), "ion/", 4))
        return;
    u32 t = v + 12;
    /* AWS's binary event stream (Bedrock's invoke-with-response-stream and
     * converse-stream): application/vnd.amazon.eventstream. */
    if (t + 22 <= n && MATCHES(load8(s->head, t), "vnd.amaz", 8) && MATCHES(load8(s->head, t + 8), "on.event", 8) &&
        MATCHES(load8(s->head, t + 16), "stream", 6)) {
        s->ev.stream_flags |= STREAM_FLAG_AWS_EVENTS;
        return;
    }
    if (t + 2 <= n && (s->head[t & SCRATCH_MASK] | 0x20) == 'x' && s->head[(t + 1) & SCRATCH_MASK] == '-')
        t += 2;
    if ((t + 6 <= n && MATCHES(load8(s->head, t), "ndjson", 6)) ||
        (t + 5 <= n && MATCHES(load8(s->head, t), "jsonl", 5)))
        s->ev.flags |= HTTP_FLAG_NDJSON_STREAM;
}

/* A '\n' at q inside the header block: the blank line ending it, or the end
 * of a header line whose value we care about, or the start of the next line
 * naming Content-Length. Returns 1 at the blank line. */
static __always_inline int header_newline(struct scratch *s, u32 q)
{
    u32 n = s->n;
    if ((q >= 1 && s->head[(q - 1) & SCRATCH_MASK] == '\n') ||
        (q >= 2 && s->head[(q - 1) & SCRATCH_MASK] == '\r' && s->head[(q - 2) & SCRATCH_MASK] == '\n')) {
        s->body_start = q + 1;
        s->ev.header_bytes = q + 1;
        s->ev.flags |= HTTP_FLAG_HEADERS_END;
        return 1;
    }
    if (q >= 8) {
        u64 end = load8(s->head, q - 8);   /* the line's last 8 bytes, "\r" included */
        if (MATCHES(end, "chunked\r", 8))
            s->ev.flags |= HTTP_FLAG_CHUNKED;
        else if (MATCHES(end, ": close\r", 8))
            s->ev.flags |= HTTP_FLAG_CONN_CLOSE;
    }
    u64 first = q + 16 <= n ? load8(s->head, q) : 0;
    if (MATCHES(first, "\ncontent", 8)) {
        u64 rest = load8(s->head, q + 8);
        if (MATCHES(rest, "-length:", 8))
            s->length_at = q + 16;
        else if (MATCHES(rest, "-type:", 6))
            s->type_at = q + 14;   /* read once after the scan: fewer branches per line */
    } else if (MATCHES(first, "\nhost:", 6)) {
        s->host_at = q + 6;   /* a request's host name: which cloud endpoint and region a client called */
    } else if (MATCHES(first, "\nx-stain", 8) && q + 25 <= n && MATCHES(load8(s->head, q + 8), "less-ret", 8) &&
               MATCHES(load8(s->head, q + 16), "ry-count", 8)) {
        /* The Stainless SDKs' (openai, anthropic) attempt number: only its digits are read. */
        s->retry_at = q + 25;
    }
    return 0;
}

/* One word of the header block: 1 when the blank line ending it is here. */
SCAN_CALLBACK(header_word)
{
    struct line_walk *walk = context;
    struct scratch *s = walk->s;
    u32 base = index * 8;
    if (base >= s->n)
        return 1;
    u64 found = newlines(s->head, base, 0, s->n);
    if (!found)
        return 0;
#pragma unroll
    for (u32 b = 0; b < 8; b++) {
        if ((found & (0x80ULL << (8 * b))) && header_newline(s, base + b))
            return 1;
        stay_in_memory();
    }
    return 0;
}

/* Header block: sets s->body_start (0 when the headers run past the
 * window), the header flags and where a Content-Length value starts. */
static __always_inline void scan_headers(struct scratch *s)
{
    struct line_walk walk = {.s = s};
    SCAN_LOOP(words_to(0, s->n), SCAN_HEAD_BYTES / 8, header_word, &walk);
}

/* The Content-Length value noted by scan_headers(). Runs in its own program:
 * see the chain above classify_request() in sock.bpf.c. */
/* A decimal number at `at` in the head, spaces before it skipped: its value,
 * and how many digits it had (0: no number). Up to 16 characters looked at. */
static __always_inline u64 read_decimal(struct scratch *s, u32 at, u32 *digits)
{
    u32 n = s->n, count = 0;
    u64 value = 0;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        u32 pos = at + k;
        if (pos >= n)
            break;
        u8 c = s->head[pos & SCRATCH_MASK];
        if (c == ' ' && !count)
            continue;
        if (c < '0' || c > '9')
            break;
        value = value * 10 + (c - '0');
        count++;
    }
    *digits = count;
    return value;
}

static __always_inline void parse_content_length(struct scratch *s)
{
    u32 digits = 0;
    if (s->retry_at) {
        u64 attempt = read_decimal(s, s->retry_at, &digits);
        if (digits)
            s->ev.retry_count = attempt < 254 ? (u8)attempt + 1 : 255;
    }
    if (!s->length_at)
        return;
    u64 value = read_decimal(s, s->length_at, &digits);
    if (digits) {
        s->ev.content_length = (s64)value;
        s->ev.flags |= HTTP_FLAG_HAS_LENGTH;
    }
}

/* A request's Host value (noted by scan_headers) into ev.event_name, which a
 * request has no other use for: the name only, up to its port or its end, at
 * most EVENT_NAME_MAX_BYTES of host-name characters (bedrock-runtime.us-east-1.
 * amazon..., us-central1-aiplatform.googleapi...: enough for the provider and
 * the region). */
static __always_inline void copy_host(struct scratch *s)
{
    u32 at = s->host_at, copied = 0;
    if (!at || s->ev.kind != HTTP_KIND_REQUEST)
        return;
    if (at < s->n && s->head[at & SCRATCH_MASK] == ' ')
        at++;
#pragma unroll
    for (u32 k = 0; k < EVENT_NAME_MAX_BYTES; k++) {
        if (at + k >= s->n)
            break;
        u8 c = s->head[(at + k) & SCRATCH_MASK];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
            break;
        s->ev.event_name[k] = c;
        copied++;
    }
    s->ev.event_name_len = copied;
}

/* A write that is no status line may still end a chunked body: */
static __always_inline void chunked_end_piece(struct scratch *s, u64 first8)
{
    /* The last chunk "0\r\n\r\n" written on its own; or its "0\r\n" opening
     * a write, with trailers and the blank line here or in writes of their
     * own (end_lines); or the blank line alone. */
    if (s->n == 5 && STARTS(first8, "0\r\n\r\n"))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
    else if (STARTS(first8, "0\r\n"))
        s->ev.flags |= HTTP_FLAG_LAST_CHUNK;
    if (s->n == 2 && STARTS(first8, "\r\n"))
        s->ev.flags |= HTTP_FLAG_BLANK_LINE_END;
}

#endif /* INFERPROBE_HTTP1_BPF_H */

/* stream_fields.bpf.h: the few JSON fields a stream states about itself.
 *
 * Included by sock.bpf.c after the SSE scan (it uses struct scratch from
 * scratch.bpf.h; load8, bytes_equal, within and EQUALS from scan_bytes.bpf.h)
 * and run by its scan_fields program. What is read, and nothing else:
 *   - token counts, numbers only: "completion_tokens" and "prompt_tokens"
 *     (OpenAI usage), "output_tokens" and "input_tokens" (Anthropic, OpenAI
 *     Responses), "eval_count" and "prompt_eval_count" (Ollama),
 *     "predicted_n" (llama.cpp timings), "candidatesTokenCount" (Gemini's
 *     usageMetadata, found by the 'd' of "candidates");
 *   - "done": true, the end marker of an Ollama NDJSON stream;
 *   - the structural empties of OpenAI-style chunks that carry no token:
 *     "choices":[] (the usage chunk, whose choices are always empty) and
 *     "delta":{} (the finish chunk; llama.cpp's last chunk with its timings);
 *   - the request body's "model" value, at most MODEL_MAX_BYTES of
 *     printable ASCII (its 'd' finds it);
 *   - the name of an SSE event that is not a token (sse_line).
 * Every key is matched with its quotes, so a key written inside a string
 * (where its quotes would be escaped) does not match; text is never copied.
 *
 * Why the underscore: every count key has one and token chunks have few
 * ("finish_reason", "system_fingerprint"), so the scan tests a handful of
 * positions per write instead of every quote (a token chunk has dozens).
 * "done" has none: its 'd' is the second trigger byte.
 */
#ifndef INFERPROBE_STREAM_FIELDS_BPF_H
#define INFERPROBE_STREAM_FIELDS_BPF_H

/* Past a key's closing quote at v: optional space, ':', optional space.
 * Returns where the value starts, or 0. */
static __always_inline u32 after_colon(struct scratch *s, u32 v)
{
    u32 n = s->n;
    if (v < n && s->head[v & SCRATCH_MASK] == ' ')
        v++;
    if (v >= n || s->head[v & SCRATCH_MASK] != ':')
        return 0;
    v++;
    if (v < n && s->head[v & SCRATCH_MASK] == ' ')
        v++;
    return v < n ? v : 0;
}

/* The '"' at q opening the key "model" in a request body: where its string
 * value starts (+ 1). The first one wins. */
static __always_inline void model_key_at(struct scratch *s, u32 q)
{
    if (s->model_at || s->head[(q - 1) & SCRATCH_MASK] == '\\')
        return;   /* inside a string: \"model\" */
    u32 v = after_colon(s, q + 7);
    if (v && s->head[v & SCRATCH_MASK] == '"')
        s->model_at = v + 2;
}

struct model_copy {
    struct scratch *s;
    u32 from, len, closed;
};

/* Byte k of the "model" value: copied while printable ASCII; 1 at its
 * closing quote, or where it stops being one that is taken. */
SCAN_CALLBACK(model_byte)
{
    struct model_copy *copy = context;
    struct scratch *s = copy->s;
    u32 k = index, pos = copy->from + k;
    if (pos >= s->n)
        return 1;
    u8 c = s->head[pos & SCRATCH_MASK];
    if (c == '"') {
        copy->closed = 1;
        return 1;
    }
    if (c < 0x20 || c > 0x7e || c == '\\' || k >= MODEL_MAX_BYTES)
        return 1;
    s->ev.model[bounded(k, MODEL_MAX_BYTES - 1)] = c;
    copy->len = k + 1;
    return 0;
}

/* The "model" value model_key_at() found: printable ASCII up to its closing
 * quote, which must be in view (a value cut short, escaped or longer than
 * MODEL_MAX_BYTES is not taken). Returns 1 when taken. */
static __always_inline int take_model(struct scratch *s)
{
    u32 at = s->model_at;
    s->model_at = 0;
    if (!at)
        return 0;
    struct model_copy copy = {.s = s, .from = at - 1};
    SCAN_LOOP(MODEL_MAX_BYTES + 1, MODEL_MAX_BYTES + 1, model_byte, &copy);   /* unrolled, it would not fit */
    u32 len = copy.len;
    if (!copy.closed || !len) {
        __builtin_memset(s->ev.model, 0, MODEL_MAX_BYTES);
        return 0;
    }
    s->ev.model_len = len;
    s->ev.flags |= HTTP_FLAG_MODEL;
    return 1;
}

/* A '_', 'd' or '[' at u: the count keys around their first underscore,
 * "done", and the empty "delta" and "choices". Records where a count's value follows (+ 1); take_counts() reads
 * the numbers once per window. */
static __always_inline void json_key_at(struct scratch *s, u32 u)
{
    /* Bytes before the window read as what the scratch area held: never a
     * key's quote in practice, and the bounds checks would cost the scan
     * loop branches it cannot spare. */
    u32 n = s->n;
    u64 w = load8(s->head, u);
    u8 c = s->head[u & SCRATCH_MASK];
    if (c == '[') {
        /* "choices":[] or "choices": [] */
        u32 k = s->head[(u - 1) & SCRATCH_MASK] == ' ' ? u - 1 : u;
        if (u + 2 <= n && u + 1 >= s->fields_fresh_from && s->head[(u + 1) & SCRATCH_MASK] == ']' &&
            EQUALS(load8(s->head, k - 10), "\"choices", 8) && EQUALS(load8(s->head, k - 2), "\":", 2))
            s->empty_events++;
        return;
    }
    if (c == 'd') {
        /* "model" matters in a request body (take_model), "done" and "delta" in
         * a response; one test for each, whichever half this is: a branch on
         * the half here made the loop too complex for the verifier. */
        if (EQUALS(load8(s->head, u - 3), "\"model\"", 7)) {
            model_key_at(s, u - 3);
        } else if (EQUALS(load8(s->head, u - 1), "\"done\"", 6) && s->head[(u - 2) & SCRATCH_MASK] != '\\') {
            u32 v = after_colon(s, u + 5);
            if (v && s->head[v & SCRATCH_MASK] == 't')
                s->json_done = 1;
        } else if (EQUALS(load8(s->head, u - 6), "\"candid", 7) &&
                   EQUALS(load8(s->head, u + 1), "atesToke", 8) && EQUALS(load8(s->head, u + 9), "nCount\"", 7)) {
            s->output_at = u + 17;
        } else if (EQUALS(load8(s->head, u - 1), "\"delta\":", 8)) {
            u32 v = s->head[(u + 7) & SCRATCH_MASK] == ' ' ? u + 8 : u + 7;
            if (v + 2 <= n && v + 1 >= s->fields_fresh_from && s->head[v & SCRATCH_MASK] == '{' &&
                s->head[(v + 1) & SCRATCH_MASK] == '}')
                s->empty_events++;
        }
        return;
    }
    if (u + 8 <= n && EQUALS(w, "_tokens\"", 8)) {
        if (EQUALS(load8(s->head, u - 11), "\"complet", 8) && EQUALS(load8(s->head, u - 3), "ion", 3))
            s->output_at = u + 9;
        else if (EQUALS(load8(s->head, u - 7), "\"output", 7))
            s->output_at = u + 9;
        else if (EQUALS(load8(s->head, u - 7), "\"prompt", 7))
            s->input_at = u + 9;
        else if (EQUALS(load8(s->head, u - 6), "\"input", 6))
            s->input_at = u + 9;
    } else if (u + 7 <= n && EQUALS(w, "_count\"", 7)) {
        if (EQUALS(load8(s->head, u - 5), "\"eval", 5))
            s->output_at = u + 8;
        else if (EQUALS(load8(s->head, u - 12), "\"prompt_", 8) &&
                 EQUALS(load8(s->head, u - 5), "_eval", 5))
            s->input_at = u + 8;
    } else if (u + 3 <= n && EQUALS(w, "_n\"", 3)) {
        if (EQUALS(load8(s->head, u - 10), "\"predict", 8) && EQUALS(load8(s->head, u - 2), "ed", 2))
            s->output_at = u + 4;
    }
}

/* The number after the key whose closing quote ended at at - 1; 1 if one
 * was there. */
static __always_inline int read_count(struct scratch *s, u32 at, u32 *out)
{
    u32 v = at ? after_colon(s, at - 1) : 0, digits = 0;
    if (!v)
        return 0;
    u64 value = read_decimal(s, v, &digits);
    *out = value > 0xffffffffULL ? 0xffffffffU : (u32)value;
    return digits > 0;
}

/* The last count of each kind this window states wins over earlier ones:
 * Anthropic's message_start says output_tokens 1, its message_delta the total. */
static __always_inline void take_stated_counts(struct scratch *s)
{
    u32 value = 0;
    if (read_count(s, s->output_at, &value)) {
        s->ev.output_tokens = value;
        s->ev.flags |= HTTP_FLAG_OUTPUT_TOKENS;
    }
    if (read_count(s, s->input_at, &value)) {
        s->ev.input_tokens = value;
        s->ev.flags |= HTTP_FLAG_INPUT_TOKENS;
    }
    s->output_at = 0;
    s->input_at = 0;
}

static __always_inline void take_counts(struct scratch *s)
{
    take_stated_counts(s);
    if (s->json_done)
        s->ev.flags |= HTTP_FLAG_JSON_DONE;
}

/* The '\n' at q ends an NDJSON line when '}' or ']' comes just before it
 * (or before its '\r'): JSON text holds no raw newline, so that is one whole
 * value, whatever the value says. Split between windows as sse_line's
 * lines are: the next window sees a line end at 4 or later. */
static __always_inline void json_line_end(struct scratch *s, u32 q)
{
    if (q < s->body_start)
        return;   /* in the overlap: the window before counted it */
    u8 c = s->head[(q - 1) & SCRATCH_MASK];
    if (c == '\r')
        c = s->head[(q - 2) & SCRATCH_MASK];
    if (c != '}' && c != ']')
        return;
    if (s->more && q + 13 > s->n) {
        s->json_deferred = 1;
        return;
    }
    s->json_lines++;
}

/* The next word of the head with a line end or key trigger ('_', 'd', '['). */
SCAN_CALLBACK(fields_word)
{
    struct line_walk *walk = context;
    struct scratch *s = walk->s;
    int stopped = next_match(s, walk->from, WORD_FIELD_TRIGGERS);
    if (stopped != 1)
        return stopped == 2;
    stay_in_memory();
    u32 base = s->scan_at - 8;
    u64 found = s->scan_found;
#pragma unroll
    for (u32 b = 0; b < 8; b++) {
        if (found & (0x80ULL << (8 * b))) {
            if (s->head[(base + b) & SCRATCH_MASK] == '\n')
                json_line_end(s, base + b);
            else
                json_key_at(s, base + b);
        }
        stay_in_memory();
    }
    return 0;
}

/* NDJSON line ends, token counts and "done" in [start, n) of the head,
 * then the counts' values. */
static __always_inline void scan_json_fields(struct scratch *s, u32 start)
{
    u32 n = s->n;
    if (start < n && start < SCAN_HEAD_BYTES) {
        struct line_walk walk = {.s = s, .first = start & ~7U, .from = start};
        s->scan_at = walk.first;
        SCAN_LOOP(words_to(walk.first, n), SCAN_HEAD_BYTES / 8, fields_word, &walk);
    }
    take_counts(s);
}

static __always_inline int name_char(u8 c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-' || c == ':' || c == '/';
}

/* Copies the window's first non-token event name (event_line_end) into the
 * event, once per write: up to EVENT_NAME_MAX_BYTES of name characters. */
static __always_inline void take_event_name(struct scratch *s)
{
    u32 at = s->first_name_at, len = s->first_name_len;
    s->first_name_at = 0;
    if (!at || s->ev.event_name_len)
        return;
    u32 copied = 0;
#pragma unroll
    for (u32 k = 0; k < EVENT_NAME_MAX_BYTES; k++) {
        if (k >= len)
            break;
        u8 c = s->head[(at - 1 + k) & SCRATCH_MASK];
        if (!name_char(c))
            break;
        s->ev.event_name[k] = c;
        copied++;
    }
    s->ev.event_name_len = copied;
}

#endif /* INFERPROBE_STREAM_FIELDS_BPF_H */

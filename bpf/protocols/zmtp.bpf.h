/* zmtp.bpf.h: what crosses an inference engine's ZeroMQ connections between
 * its own processes (vLLM V1: the API server and EngineCore).
 *
 * Included by sock.bpf.c and run by its scan_zmtp program, on kernels with
 * bpf_loop (HAVE_BPF_LOOP): the walk is one callback that takes one unit per
 * call (a frame header, a run of bytes to skip, or one msgpack value's
 * header), so its state can stop at any byte where a syscall ends and go on
 * in the next one. Each unit moves `at` forward by at least one byte, so a
 * walk of n bytes takes at most n + 1 calls.
 *
 * ZMTP 3 (rfc.zeromq.org/spec/23): a 64-byte greeting, then frames of a
 * flags byte (MORE 0x01, LONG 0x02, COMMAND 0x04) and a size (one byte, or
 * eight big-endian with LONG). A message is the frames up to one without
 * MORE; command frames (READY, PING) are not part of messages.
 *
 * vLLM's messages (vllm/v1/engine/__init__.py, core_client.py, core.py; the
 * layout of vLLM 0.32 that engine_ipc_view.py names):
 *   - requests, API server -> EngineCore: frame 0 is one byte, the request
 *     type (0x00 ADD), frame 1 a msgpack EngineCoreRequest, an array whose
 *     field 0 is the request id and field 1 the prompt's token ids;
 *   - outputs, EngineCore -> API server: one frame, a msgpack
 *     EngineCoreOutputs array [engine_index, outputs, ...], each output an
 *     array [request_id, new_token_ids, ..., finish_reason (field 5), ...,
 *     events (field 7): [{type, timestamp}, ...], ...].
 * What is read of them, and nothing else: ids, counts, whether a finish
 * reason is set, and the events' types and timestamps. Token ids, text and
 * everything else are skipped over where they lie in user memory, never
 * copied. */
#ifndef INFERPROBE_ZMTP_BPF_H
#define INFERPROBE_ZMTP_BPF_H

#define ZMTP_MORE 0x01
#define ZMTP_LONG 0x02
#define ZMTP_COMMAND 0x04
#define ZMTP_GREETING_BYTES 64

/* conn_state.zmtp: how far the connection is known to be ZMTP. A connection
 * is probed while it carried nothing else (no HTTP) and its syscalls start
 * like frames; after ZMTP_PROBES_MAX probes that failed it is left alone. */
#define ZMTP_PROBES_MAX 8
#define ZMTP_FOLLOWED 255

enum zmtp_mode {
    ZM_SKIP = 0,       /* the rest of the frame is of no interest */
    ZM_REQTYPE,        /* a request's one-byte type frame */
    ZM_ADD_ARRAY,      /* an ADD's EngineCoreRequest: its array header */
    ZM_ADD_ID,
    ZM_ADD_TOKENS,
    ZM_OUT_ARRAY,      /* a one-frame message: EngineCoreOutputs' array header, if it is one */
    ZM_OUT_ENGINE,
    ZM_OUT_LIST,
    ZM_ENTRY,          /* one EngineCoreOutput */
    ZM_ENTRY_ID,
    ZM_ENTRY_TOKENS,
    ZM_ENTRY_REST,     /* its other fields, skipped value by value (pending) */
    ZM_EVENT_MAP,      /* field 7: its events, map by map */
    ZM_EVENT_KEY,
    ZM_EVENT_VALUE,
    ZM_LOST,           /* the frames could no longer be followed: resynchronised at a syscall that tiles */
};

enum mp_class { MP_INT, MP_NIL, MP_SCALAR, MP_BYTES, MP_ARRAY, MP_MAP, MP_F64 };

struct zmtp_key {
    u64 conn_id;
    u32 dir;
    u32 pad;
};

/* One direction of one followed connection: where its walk stands. */
struct zmtp_stream {
    u64 frame_left;    /* bytes of the current frame's payload not yet walked (0: a frame header is next) */
    u64 skip;          /* bytes to pass over before the next unit */
    u32 pending;       /* ZM_ENTRY_REST: values nested in the entry's fields still to pass over */
    u32 entries_left;  /* outputs of the current message not yet walked */
    u32 events_left;   /* ZM_EVENT_*: events of the entry not yet walked */
    u32 map_left;      /* ZM_EVENT_*: pairs of the current event map not yet walked */
    u16 mode;          /* enum zmtp_mode */
    u16 field;         /* the entry's next top-level field */
    u16 fields;        /* the entry's number of fields */
    u8 frame_more;     /* the current frame has MORE: the next frame is the same message's */
    u8 frame_index;    /* the current frame's place in its message */
    u8 reqtype_add;    /* the message's type frame said ADD */
    u8 hdr_len;        /* bytes of the unit's header taken so far (one cut by a syscall's end) */
    u8 key_len;        /* ZM_EVENT_VALUE: the length of the key it is the value of */
    u8 event_type;     /* ZM_EVENT_*: the current event's type */
    u64 event_bits;    /* ... and its timestamp's bits */
    u8 id_more;        /* bytes of the id still to copy: the syscall ended inside it */
    u8 started;        /* a byte of this direction was looked at: a greeting can only come first */
    u64 buf;           /* the syscall being walked: its buffer, */
    u32 at;            /* the walk's position in it, */
    u32 len;           /* and its length */
    u8 hdr[32];        /* the unit's header: at most 9 bytes are used; the rest bounds masked offsets */
    struct engine_ipc_event ev;   /* the event being filled: its id last, ... */
    u8 id_room[80];    /* ... then room that bounds a masked offset into the id for the verifier */
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, struct zmtp_key);
    __type(value, struct zmtp_stream);
} zmtp_streams SEC(".maps");

/* All zeroes: a new stream's state, copied in (too big for the stack). */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct zmtp_stream);
} zmtp_blank SEC(".maps");

/* The bpf_loop context of a walk (zmtp_unit): the stream holds the rest. */
struct zmtp_walk {
    struct zmtp_stream *st;
};

/* ... and of the tiling probe (zmtp_tile). */
struct zmtp_tiling {
    u64 buf;
    u32 at, len;
    u32 ok;            /* frames seen so far */
    u32 failed;
};

/* The header bytes of the msgpack value whose first byte is b. */
static __always_inline u32 mp_header_bytes(u8 b)
{
    if (b <= 0xc3 || b >= 0xe0)
        return 1;   /* fixint, fixmap, fixarray, fixstr, nil, bool: the byte is the header */
    switch (b) {
    case 0xc4: case 0xcc: case 0xd0: case 0xd9:
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        return 2;
    case 0xc5: case 0xcd: case 0xd1: case 0xda: case 0xdc: case 0xde: case 0xc7:
        return 3;
    case 0xc8:
        return 4;
    case 0xc9:
        return 6;
    case 0xcb: case 0xcf: case 0xd3:
        return 9;
    default:   /* c6 ca ce d2 db dd df */
        return 5;
    }
}

static __always_inline u32 be16_at(u8 *h) { return ((u32)h[1] << 8) | h[2]; }
static __always_inline u32 be32_at(u8 *h)
{
    return ((u32)h[1] << 24) | ((u32)h[2] << 16) | ((u32)h[3] << 8) | h[4];
}
static __always_inline u64 be64_at(u8 *h)
{
    return ((u64)be32_at(h) << 32) | be32_at(h + 4);
}

/* A ZMTP frame header, h[0] its flags: its length, whether the flags are
 * ZMTP's (a command never has MORE), and the payload size it states. */
static __always_inline u32 zmtp_header_bytes(u8 flags)
{
    return flags & ZMTP_LONG ? 9 : 2;
}

static __always_inline int zmtp_flags_valid(u8 flags)
{
    return flags <= 0x07 && (flags & (ZMTP_COMMAND | ZMTP_MORE)) != (ZMTP_COMMAND | ZMTP_MORE);
}

static __always_inline u64 zmtp_frame_size(u8 *h)
{
    return h[0] & ZMTP_LONG ? be64_at(h) : h[1];
}

/* The value whose header is in h: its class and n (an int's value, a
 * container's count, a str/bin/ext body's length, a float64's bits). */
static __always_inline u32 mp_parse(u8 *h, u64 *n)
{
    u8 b = h[0];
    *n = 0;
    if (b <= 0x7f) {
        *n = b;
        return MP_INT;
    }
    if (b <= 0x8f) {
        *n = b & 0x0f;
        return MP_MAP;
    }
    if (b <= 0x9f) {
        *n = b & 0x0f;
        return MP_ARRAY;
    }
    if (b <= 0xbf) {
        *n = b & 0x1f;
        return MP_BYTES;
    }
    if (b >= 0xe0)
        return MP_SCALAR;
    switch (b) {
    case 0xc0: return MP_NIL;
    case 0xc4: case 0xd9: case 0xc7: *n = h[1]; return MP_BYTES;
    case 0xc5: case 0xda: case 0xc8: *n = be16_at(h); return MP_BYTES;
    case 0xc6: case 0xdb: case 0xc9: *n = be32_at(h); return MP_BYTES;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: *n = 1U << (b - 0xd4); return MP_BYTES;
    case 0xcb: *n = be64_at(h); return MP_F64;
    case 0xcc: *n = h[1]; return MP_INT;
    case 0xcd: *n = be16_at(h); return MP_INT;
    case 0xce: *n = be32_at(h); return MP_INT;
    case 0xcf: *n = be64_at(h); return MP_INT;
    case 0xdc: *n = be16_at(h); return MP_ARRAY;
    case 0xdd: *n = be32_at(h); return MP_ARRAY;
    case 0xde: *n = be16_at(h); return MP_MAP;
    case 0xdf: *n = be32_at(h); return MP_MAP;
    default: return MP_SCALAR;   /* c1 c2 c3 ca d0-d3 */
    }
}

/* Takes the unit's header bytes up to `need` into st->hdr: 1 once it holds
 * them all, 0 when the syscall's bytes ran out first (the rest comes with the
 * next one). In a frame's payload the bytes count against the frame. */
static __always_inline int zmtp_take(struct zmtp_stream *st, u32 need, int in_payload)
{
    u32 have = st->hdr_len;
    if (have >= need)
        return 1;
    u32 avail = st->len - st->at, take = need - have;
    if (take > avail)
        take = avail;
    if (!take)
        return 0;
    bpf_probe_read_user(&st->hdr[have & 15], take & 15, (void *)(st->buf + st->at));
    st->at += take;
    st->hdr_len = have + take;
    if (in_payload)
        st->frame_left -= take < st->frame_left ? take : st->frame_left;
    return st->hdr_len >= need;
}

/* An id string of n bytes at the walk's position: its first
 * ENGINE_ID_MAX_BYTES go into the event (zmtp_copy_id, across syscalls if it
 * is cut), and the walk skips all of it. */
static __always_inline void zmtp_take_id(struct zmtp_stream *st, u64 n)
{
    if (n > ENGINE_ID_MAX_BYTES)
        st->ev.flags |= ENGINE_IPC_FLAG_ID_CUT;
    st->ev.id_len = 0;
    st->id_more = n < ENGINE_ID_MAX_BYTES ? (u8)n : ENGINE_ID_MAX_BYTES;
    st->skip = n;
}

/* Copies what this syscall holds of the id still to copy, from the walk's
 * position (the skip over the id then moves past it). */
static __always_inline void zmtp_copy_id(struct zmtp_stream *st)
{
    u32 avail = st->len - st->at, copy = st->id_more, have = st->ev.id_len;
    if (copy > avail)
        copy = avail;
    if (have >= ENGINE_ID_MAX_BYTES)
        return;
    bpf_probe_read_user(&st->ev.id[have & 63], copy & 63, (void *)(st->buf + st->at));
    st->ev.id_len = have + copy;
    st->id_more -= copy;
}

static __always_inline void zmtp_send(struct zmtp_stream *st, u16 kind, u32 count_)
{
    st->ev.kind = kind;
    st->ev.count = count_;
    send_event(&st->ev, sizeof(st->ev));
}

/* Passes over a value nested in an entry's field: its contents join pending,
 * or its body the bytes to skip. */
static __always_inline void zmtp_nested(struct zmtp_stream *st, u32 cls, u64 n)
{
    if (cls == MP_ARRAY)
        st->pending += (u32)n;
    else if (cls == MP_MAP)
        st->pending += 2 * (u32)n;
    else if (cls == MP_BYTES)
        st->skip = n;
}

/* The events could not be read as {type, timestamp} maps: the rest of them
 * is passed over like any other field. */
static __always_inline void zmtp_events_unread(struct zmtp_stream *st, u32 cls, u64 n, u32 values_left)
{
    st->pending += values_left;
    zmtp_nested(st, cls, n);
    st->mode = ZM_ENTRY_REST;
}

/* An event starts empty: no id, flags or engine times. */
static __always_inline void zmtp_event_begins(struct zmtp_stream *st)
{
    st->ev.flags = 0;
    st->ev.id_len = 0;
    st->ev.queued_bits = 0;
    st->ev.scheduled_bits = 0;
}

/* An entry whose fields were all walked: its OUTPUT event, and after the
 * message's last entry the STEP event. */
static __always_inline void zmtp_entry_done(struct zmtp_stream *st)
{
    if (st->mode != ZM_ENTRY_REST || st->skip || st->pending || st->field < st->fields)
        return;
    zmtp_send(st, ENGINE_IPC_OUTPUT, st->ev.count);
    st->ev.index++;
    if (st->entries_left)
        st->entries_left--;
    if (st->entries_left) {
        st->mode = ZM_ENTRY;
        return;
    }
    zmtp_event_begins(st);   /* a STEP names no request */
    zmtp_send(st, ENGINE_IPC_STEP, st->ev.index);
    st->mode = ZM_SKIP;
}

/* A frame header was taken: which part of which message its payload is. */
static __always_inline int zmtp_frame_begins(struct zmtp_stream *st)
{
    u8 flags = st->hdr[0];
    u64 size = zmtp_frame_size(st->hdr);
    st->hdr_len = 0;
    if (!zmtp_flags_valid(flags) || size > 0xffffffffULL) {
        st->mode = ZM_LOST;
        count(COUNTER_ENGINE_IPC_LOST_SYNC);
        return 1;
    }
    st->frame_left = size;
    if (flags & ZMTP_COMMAND) {
        st->mode = ZM_SKIP;   /* READY, PING...: between messages, not in them */
        return 0;
    }
    if (st->frame_more) {
        st->frame_index++;
        st->mode = st->frame_index == 1 && st->reqtype_add ? ZM_ADD_ARRAY : ZM_SKIP;
    } else {
        st->frame_index = 0;
        st->reqtype_add = 0;
        st->ev.message++;
        st->mode = flags & ZMTP_MORE ? (size == 1 ? ZM_REQTYPE : ZM_SKIP) : ZM_OUT_ARRAY;
    }
    st->frame_more = flags & ZMTP_MORE;
    return 0;
}

/* The value where a request id belongs: a string, taken, then the walk goes
 * on to `next`; anything else is a layout this walk does not know. */
static __always_inline void zmtp_id_value(struct zmtp_stream *st, u32 cls, u64 n, u16 next)
{
    if (cls != MP_BYTES) {
        st->mode = ZM_SKIP;
        count(COUNTER_ENGINE_IPC_UNREAD);
        return;
    }
    zmtp_take_id(st, n);
    st->mode = next;
}

/* One msgpack value of the payload, by what the walk expects there. */
static __always_inline void zmtp_value(struct zmtp_stream *st, u32 cls, u64 n)
{
    switch (st->mode) {
    case ZM_REQTYPE:
        st->reqtype_add = cls == MP_INT && n == 0;
        st->mode = ZM_SKIP;
        return;
    case ZM_ADD_ARRAY:
        st->mode = cls == MP_ARRAY && n >= 2 ? ZM_ADD_ID : ZM_SKIP;
        if (st->mode == ZM_ADD_ID)
            zmtp_event_begins(st);
        st->ev.index = 0;
        return;
    case ZM_ADD_ID:
        zmtp_id_value(st, cls, n, ZM_ADD_TOKENS);
        return;
    case ZM_ADD_TOKENS:
        zmtp_send(st, ENGINE_IPC_ADD, cls == MP_ARRAY ? (u32)n : 0);
        st->mode = ZM_SKIP;
        return;
    case ZM_OUT_ARRAY:
        st->mode = cls == MP_ARRAY && n >= 2 ? ZM_OUT_ENGINE : ZM_SKIP;
        return;
    case ZM_OUT_ENGINE:
        st->mode = cls == MP_INT ? ZM_OUT_LIST : ZM_SKIP;
        return;
    case ZM_OUT_LIST:
        st->entries_left = cls == MP_ARRAY ? (u32)n : 0;
        st->ev.index = 0;
        st->mode = st->entries_left ? ZM_ENTRY : ZM_SKIP;
        return;
    case ZM_ENTRY:
        if (cls != MP_ARRAY || n < 8 || n > 0xffff) {
            st->mode = ZM_SKIP;
            count(COUNTER_ENGINE_IPC_UNREAD);
            return;
        }
        st->fields = (u16)n;
        st->field = 0;
        st->pending = 0;
        zmtp_event_begins(st);
        st->mode = ZM_ENTRY_ID;
        return;
    case ZM_ENTRY_ID:
        zmtp_id_value(st, cls, n, ZM_ENTRY_TOKENS);
        st->field = 1;
        return;
    case ZM_ENTRY_TOKENS:
        st->ev.count = cls == MP_ARRAY ? (u32)n : 0;
        st->field = 2;
        st->mode = ZM_ENTRY_REST;
        zmtp_nested(st, cls, n);
        return;
    case ZM_ENTRY_REST:
        if (st->pending) {
            st->pending--;
            zmtp_nested(st, cls, n);
            return;
        }
        if (st->field == 5 && cls != MP_NIL)
            st->ev.flags |= ENGINE_IPC_FLAG_FINISHED;
        st->field++;
        if (st->field == 8 && cls == MP_ARRAY && n) {
            st->events_left = (u32)n;
            st->mode = ZM_EVENT_MAP;
            return;
        }
        zmtp_nested(st, cls, n);
        return;
    case ZM_EVENT_MAP:
        if (cls != MP_MAP) {
            zmtp_events_unread(st, cls, n, st->events_left - 1);
            return;
        }
        st->map_left = (u32)n;
        st->event_type = 0;
        st->event_bits = 0;
        st->mode = n ? ZM_EVENT_KEY : ZM_EVENT_MAP;
        if (!n && !--st->events_left)
            st->mode = ZM_ENTRY_REST;
        return;
    case ZM_EVENT_KEY:
        if (cls != MP_BYTES) {
            zmtp_events_unread(st, cls, n, 1 + 2 * (st->map_left - 1) + st->events_left - 1);
            return;
        }
        st->key_len = n < 255 ? (u8)n : 255;   /* "type" (4) or "timestamp" (9): told apart by length */
        st->skip = n;
        st->mode = ZM_EVENT_VALUE;
        return;
    case ZM_EVENT_VALUE:
        if (cls == MP_ARRAY || cls == MP_MAP || cls == MP_BYTES) {
            zmtp_events_unread(st, cls, n, 2 * (st->map_left - 1) + st->events_left - 1);
            return;
        }
        if (st->key_len == 4 && cls == MP_INT)
            st->event_type = (u8)n;
        else if (st->key_len == 9 && cls == MP_F64)
            st->event_bits = n;
        st->mode = ZM_EVENT_KEY;
        if (--st->map_left)
            return;
        /* vLLM's EngineCoreEventType: 1 QUEUED, 2 SCHEDULED, 3 PREEMPTED */
        if (st->event_type == 1 && !st->ev.queued_bits)
            st->ev.queued_bits = st->event_bits;
        else if (st->event_type == 2 && !st->ev.scheduled_bits)
            st->ev.scheduled_bits = st->event_bits;
        else if (st->event_type == 3)
            st->ev.flags |= ENGINE_IPC_FLAG_PREEMPTED;
        st->mode = --st->events_left ? ZM_EVENT_MAP : ZM_ENTRY_REST;
        return;
    default:
        st->mode = ZM_SKIP;
    }
}

/* One unit of the walk: 1 stops it. A global function, which the verifier
 * checks once, on its own, whatever the state of the walk that calls it:
 * inlined into the bpf_loop callback, its branches were walked again for
 * each state the loop's iterations could reach (466,000 instructions, 0.8 s
 * of start-up; now 16,677 and 13 ms for the whole program). Everything it
 * needs is in the stream's state. */
__noinline int zmtp_unit_step(struct zmtp_stream *st)
{
    if (!st)
        return 1;
    zmtp_entry_done(st);
    if (st->at >= st->len || st->mode == ZM_LOST)
        return 1;
    if (!st->started) {
        /* A direction followed from its first byte starts with its greeting
         * (0xff ... 0x7f), which each peer sends its own: skipped, not frames. */
        u8 first = 0;
        bpf_probe_read_user(&first, 1, (void *)(st->buf + st->at));
        st->started = 1;
        if (first == 0xff)
            st->skip = ZMTP_GREETING_BYTES;
    }
    if (st->id_more)
        zmtp_copy_id(st);
    if (st->skip) {
        u64 n = st->skip, avail = st->len - st->at;
        if (n > avail)
            n = avail;
        st->at += n;
        st->skip -= n;
        st->frame_left -= n < st->frame_left ? n : st->frame_left;
        return 0;
    }
    if (!st->frame_left) {
        if (!zmtp_take(st, 1, 0) || !zmtp_take(st, zmtp_header_bytes(st->hdr[0]), 0))
            return 1;
        return zmtp_frame_begins(st);
    }
    if (st->mode == ZM_SKIP) {
        st->skip = st->frame_left;
        return 0;
    }
    if (!zmtp_take(st, 1, 1))
        return 1;
    u32 need = mp_header_bytes(st->hdr[0]);
    if (st->hdr_len < need && st->frame_left < need - st->hdr_len) {
        st->hdr_len = 0;   /* a value longer than its frame: not a layout this walk knows */
        st->mode = ZM_SKIP;
        count(COUNTER_ENGINE_IPC_UNREAD);
        return 0;
    }
    if (!zmtp_take(st, need, 1))
        return 1;
    u64 n;
    u32 cls = mp_parse(st->hdr, &n);
    st->hdr_len = 0;
    zmtp_value(st, cls, n);
    if (st->skip > st->frame_left) {
        st->skip = 0;   /* a body longer than its frame: not a layout this walk knows */
        st->mode = ZM_SKIP;
        count(COUNTER_ENGINE_IPC_UNREAD);
    }
    return 0;
}

SCAN_CALLBACK(zmtp_unit)
{
    struct zmtp_walk *w = context;
    return zmtp_unit_step(w->st) ? 1 : 0;
}

/* The tiling probe, one frame header per call: the syscall's bytes are whole
 * ZMTP frames (at least one carrying bytes), or at least two frame headers
 * before a frame that runs past them. */
SCAN_CALLBACK(zmtp_tile)
{
    struct zmtp_tiling *w = context;
    if (w->at >= w->len)
        return 1;
    u8 h[9] = {};
    u32 avail = w->len - w->at;
    bpf_probe_read_user(h, avail < 9 ? (avail & 15) : 9, (void *)(w->buf + w->at));
    u8 flags = h[0];
    u32 header = zmtp_header_bytes(flags);
    if (!zmtp_flags_valid(flags) || avail < header) {
        w->failed = 1;
        return 1;
    }
    u64 size = zmtp_frame_size(h);
    /* A frame of nothing, or a command too short to name itself, is not how ZMTP peers talk. */
    if (size == 0 || (flags & ZMTP_COMMAND && size < 2) || size > 0xffffffffULL) {
        w->failed = 1;
        return 1;
    }
    w->ok++;
    u64 end = (u64)w->at + header + size;
    if (end > w->len) {
        w->failed = w->ok < 2;
        w->at = w->len;
        return 1;
    }
    w->at = (u32)end;
    return 0;
}

/* The syscall's bytes start a ZMTP stream: its greeting, or whole frames. */
static __always_inline int zmtp_opens(struct scratch *s, u64 buf, u32 len)
{
    if (s->n >= 10 && s->head[0] == 0xff && s->head[9] == 0x7f)
        return 1;
    struct zmtp_tiling w = {.buf = buf, .len = len};
    SCAN_LOOP(len + 1, 1 << 16, zmtp_tile, &w);
    return !w.failed && w.ok && w.at == len;
}

#endif /* INFERPROBE_ZMTP_BPF_H */

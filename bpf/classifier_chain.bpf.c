/* classifier_chain.bpf.c: the classification chain, a part of sock.bpf.c.
 *
 * Included by sock.bpf.c after its maps and syscall hooks (it is not an
 * object of its own: its programs work on sock.bpf.c's maps). Holds
 * classify_io, which the read and write hooks and the TLS probes end in,
 * and the tail-call programs it dispatches to, with the state of the
 * protocols that span syscalls: HTTP/2 frames, engine IPC (ZeroMQ), a
 * request's head in pieces, and W3C trace context. What the bytes mean is in
 * the protocol headers (bpf/protocols/), included by sock.bpf.c.
 */

/* ---------------------------------------------------------------- HTTP/2 frames
 *
 * A connection whose first request-half bytes are the HTTP/2 preface is
 * marked h2 (conn_state); from then on each of its syscalls (or TLS calls)
 * goes from classify_io straight to h2_frames, which walks its frames where
 * they lie in user memory (http2.bpf.h) and sends one h2_frames_event:
 * frame headers and derived counts only. Header blocks go to user space
 * through h2_header_pieces, a ring nothing records: HPACK's dynamic table
 * needs every block of the connection, in order, and cannot be kept in the
 * kernel; collector/ingest/h2_header_blocks.py decodes them at once and keeps only
 * the fields docs/http2.md lists. A connection begun before attach shows
 * no preface: it stays unrecognised traffic, never guessed at. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);
    __type(value, struct h2_conn);
} h2_conns SEC(".maps");                 /* conn_id -> walk state */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct h2_stream_key);
    __type(value, struct h2_stream_state);
} h2_streams SEC(".maps");
/* 2 MiB: a busy gRPC server's header blocks come as many small pieces (grpc
 * writes each field of a block as an iovec), each sent only as long as it is. */
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 512 * 4096);
} h2_header_pieces SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct h2_header_piece);
} h2_piece_area SEC(".maps");

/* The connection is gone (its socket closed, or its TLS session freed): its
 * walk state goes, and user space is told after its last header piece (the
 * same ring, so in order), to drop the connection's HPACK tables. */
static __always_inline void h2_connection_closed(u64 conn_id)
{
    if (bpf_map_delete_elem(&h2_conns, &conn_id) != 0)
        return;   /* not HTTP/2, told already, or its walk state was evicted */
    struct h2_conn_closed closed = {};
    fill_header(&closed.hdr, EVENT_H2_CONN_CLOSED, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    closed.conn_id = conn_id;
    if (bpf_ringbuf_output(&h2_header_pieces, &closed, sizeof(closed), 0) != 0)
        count(COUNTER_H2_PIECES_LOST);
}

/* A fresh h2_frames_event for this syscall in the scratch area. */
static __always_inline void h2_begin_event(struct scratch *s, u16 dir, u16 flags)
{
    struct h2_frames_event *h = &s->h2ev;
    h->hdr = s->ev.hdr;
    h->hdr.type = EVENT_H2_FRAMES;
    h->conn_id = s->ev.conn_id;
    h->exit_ns = s->ev.exit_ns;
    h->bytes = s->ev.bytes;
    h->fd = s->ev.fd;
    h->flags = flags | (s->ev.flags & HTTP_FLAG_BEGAN_UNSEEN ? H2_FLAG_BEGAN_UNSEEN : 0);
    h->transport = s->ev.transport;
    h->role = s->ev.role;
    h->dir = dir == DIR_WRITE;
    h->n_frames = 0;
    h->wire_ns = s->ev.wire_ns;
    s->h2_runs = 0;
    s->h2_part = H2_NO_PART;
    s->h2_scan_len = 0;
    s->h2_scans = 0;
}

/* Sends the frames listed so far (only the parts filled: most writes carry one). */
static __always_inline void h2_send_event(struct scratch *s, u16 more)
{
    struct h2_frames_event *h = &s->h2ev;
    u32 n = h->n_frames;
    if (n > H2_FRAMES_PER_EVENT)
        n = H2_FRAMES_PER_EVENT;
    if (more)
        h->flags |= H2_FLAG_MORE;
    u32 size = sizeof(*h) - sizeof(h->frames) + n * sizeof(struct h2_frame);
    if (size <= sizeof(*h))
        send_event(h, size);
    h->flags &= ~(H2_FLAG_MORE | H2_FLAG_PREFACE);
    h->n_frames = 0;
    s->h2_part = H2_NO_PART;
}

/* The part of the current frame in this event, added if it has none yet
 * (a frame begun in an earlier syscall, or before the event filled up). */
static __always_inline struct h2_frame *h2_part_of(struct scratch *s, struct h2_dir *d, u8 continued)
{
    struct h2_frames_event *h = &s->h2ev;
    if (s->h2_part < H2_FRAMES_PER_EVENT)
        return &h->frames[s->h2_part & (H2_FRAMES_PER_EVENT - 1)];
    if (h->n_frames >= H2_FRAMES_PER_EVENT)
        h2_send_event(s, 1);
    u32 i = h->n_frames & (H2_FRAMES_PER_EVENT - 1);
    struct h2_frame *part = &h->frames[i];
    part->stream_id = d->stream_id;
    part->length = d->frame_len;
    part->value = 0;
    part->type = d->type;
    part->flags = d->flags;
    part->part = continued ? H2_PART_FLAG_CONTINUED : 0;
    part->messages = 0;
    h->n_frames = i + 1;
    s->h2_part = i;
    return part;
}

/* A piece of a header block, to user space for HPACK. */
static __always_inline void h2_send_header_piece(struct scratch *s, struct h2_dir *d, u64 at, u32 take)
{
    u32 zero = 0;
    struct h2_header_piece *piece = bpf_map_lookup_elem(&h2_piece_area, &zero);
    if (!piece)
        return;
    piece->hdr = s->h2ev.hdr;
    piece->hdr.type = EVENT_H2_HEADER_PIECE;
    piece->conn_id = s->h2ev.conn_id;
    piece->exit_ns = s->h2ev.exit_ns;
    piece->stream_id = d->stream_id;
    piece->frame_length = d->frame_len;
    piece->offset = d->frame_len - d->frame_left;
    piece->frame_type = d->type;
    piece->frame_flags = d->flags;
    piece->dir = s->h2ev.dir;
    piece->role = s->h2ev.role;
    piece->transport = s->h2ev.transport;
    /* Masked so that the verifier sees the bound (h2_payload_step never
     * asks for 4096 bytes or more; were it to, the piece is cut and its
     * table lost in user space, never misread). */
    u32 n = take;
    piece->truncated = n >= H2_HEADER_PIECE_BYTES;
    if (n >= H2_HEADER_PIECE_BYTES)
        n = H2_HEADER_PIECE_BYTES - 1;
    n &= H2_HEADER_PIECE_BYTES - 1;
    piece->len = n;
    if (n == 0 || bpf_probe_read_user(piece->bytes, n, (void *)at))
        piece->truncated = 1;
    /* Built in a per-CPU area and sent as long as it is: a piece is often a
     * few bytes, and a reserved record would be 4 KiB. */
    u32 size = sizeof(*piece) - H2_HEADER_PIECE_BYTES + n;
    if (size > sizeof(*piece) || bpf_ringbuf_output(&h2_header_pieces, piece, size, 0) != 0)
        count(COUNTER_H2_PIECES_LOST);
}

/* The frames carry the response half: a server's writes, a client's reads. */
static __always_inline int h2_response_half(struct scratch *s)
{
    return (s->h2ev.dir != 0) == (s->h2ev.role == CONN_ROLE_SERVER);
}

/* A DATA frame's header was read: its stream's message state joins the walk. */
static __always_inline void h2_data_frame_begins(struct scratch *s, struct h2_dir *d)
{
    struct h2_stream_key key = {.conn_id = s->h2ev.conn_id, .stream_id = d->stream_id, .dir = s->h2ev.dir};
    struct h2_stream_state *st = bpf_map_lookup_elem(&h2_streams, &key);
    d->msg_left = st ? st->msg_left : 0;
    d->shape = st ? st->shape : H2_SHAPE_UNKNOWN;
    d->prefix_have = st ? st->prefix_have : 0;
    if (st)
        __builtin_memcpy(d->prefix, st->prefix, sizeof(st->prefix));
    d->padded = (d->flags & H2_FRAME_FLAG_PADDED) != 0;
    d->stored_clean = st && st->shape != H2_SHAPE_UNKNOWN && !st->msg_left && !st->prefix_have;
}

/* The current frame's last byte was walked. */
static __always_inline void h2_frame_ends(struct scratch *s, struct h2_dir *d)
{
    struct h2_frame *part = h2_part_of(s, d, 1);
    part->part |= H2_PART_FLAG_ENDS;
    s->h2_part = H2_NO_PART;
    if (d->type != H2_FRAME_DATA)
        return;
    struct h2_stream_key key = {.conn_id = s->h2ev.conn_id, .stream_id = d->stream_id, .dir = s->h2ev.dir};
    if (d->flags & H2_FRAME_FLAG_END_STREAM) {
        bpf_map_delete_elem(&h2_streams, &key);
        return;
    }
    /* Most DATA frames end with a message (gRPC frames each write): the map
     * already says so, and an update costs more than the rest of the walk. */
    if (d->stored_clean && !d->msg_left && !d->prefix_have)
        return;
    struct h2_stream_state st = {.msg_left = d->msg_left, .shape = d->shape, .prefix_have = d->prefix_have};
    __builtin_memcpy(st.prefix, d->prefix, sizeof(st.prefix));
    bpf_map_update_elem(&h2_streams, &key, &st, BPF_ANY);
}

/* One step over a frame header's bytes. */
static __always_inline void h2_header_step(struct scratch *s, struct h2_dir *d, u64 at, u32 avail)
{
    u32 have = d->hdr_have;
    if (have > 8) {
        d->lost = 1;
        return;
    }
    u32 got = h2_take_bytes(d->hdr, have, 9 - have, at, avail);
    if (!got) {
        d->lost = 1;
        return;
    }
    s->h2_seg_off += got;
    have += got;
    d->hdr_have = have;
    if (have < 9)
        return;   /* the header goes on in the next segment */
    d->hdr_have = 0;
    d->frame_len = h2_be24(d->hdr);
    d->frame_left = d->frame_len;
    d->type = d->hdr[3];
    d->flags = d->hdr[4];
    d->stream_id = h2_be32(d->hdr + 5) & 0x7fffffff;
    s->h2_part = H2_NO_PART;
    h2_part_of(s, d, 0);
    if (d->type == H2_FRAME_DATA)
        h2_data_frame_begins(s, d);
    if (!d->frame_left)
        h2_frame_ends(s, d);
}

/* One step over a payload: a gRPC message's prefix or body, or all of a
 * payload this segment holds (header block pieces go to user space). */
static __always_inline void h2_payload_step(struct scratch *s, struct h2_dir *d, u64 at, u32 avail)
{
    u32 take = d->frame_left < avail ? d->frame_left : avail;
    struct h2_frame *part = h2_part_of(s, d, 1);
    u32 at_start = d->frame_left == d->frame_len;
    if (d->type == H2_FRAME_DATA) {
        if (d->shape == H2_SHAPE_UNKNOWN && !d->padded) {
            /* The stream's first DATA byte: a gRPC message's compressed flag, or text;
             * or its first 16, an AWS event stream's prelude (h2_aws_prelude). */
            u8 first[16] = {0xff};
            if (take >= 16)
                bpf_probe_read_user(first, 16, (void *)at);
            else
                bpf_probe_read_user(first, 1, (void *)at);
            d->shape = take >= 16 && h2_aws_prelude(first) ? H2_SHAPE_AWS_EVENTS :
                       first[0] <= 1 ? H2_SHAPE_GRPC : H2_SHAPE_TEXT;
        }
        if (d->shape == H2_SHAPE_GRPC && !d->padded) {
            part->part |= H2_PART_FLAG_GRPC;
            if (d->msg_left) {
                take = d->msg_left < take ? d->msg_left : take;
                d->msg_left -= take;
                if (!d->msg_left && part->messages < 255)
                    part->messages++;
            } else {
                u32 have = d->prefix_have;
                take = h2_take_bytes(d->prefix, have, 5 - (have > 4 ? 4 : have), at, take);
                if (!take) {
                    d->lost = 1;
                    return;
                }
                have += take;
                d->prefix_have = have;
                if (have >= 5) {
                    d->prefix_have = 0;
                    d->msg_left = h2_be32(d->prefix + 1);
                    if (!d->msg_left && part->messages < 255)
                        part->messages++;   /* an empty message is whole at its prefix */
                }
            }
        } else {
            if (d->padded)
                part->part |= H2_PART_FLAG_UNWALKED;
            else if (at_start && d->shape != H2_SHAPE_AWS_EVENTS)
                part->part |= h2_sse_start(at, take);
            /* On the response half, the payload's lines are scanned as an HTTP/1
             * body's (h2_scan_data): a frame may hold several events, a finish
             * chunk and the end marker together (hypercorn's last frame). */
            if (!d->padded && take && h2_response_half(s) && s->h2_scans < H2_DATA_SCANS) {
                s->h2_scan_at = at;
                s->h2_scan_len = take;
                s->h2_scan_part = s->h2_part;
                s->h2_scan_aws = d->shape == H2_SHAPE_AWS_EVENTS;   /* its messages, by scan_event_stream */
            }
        }
        part->value += take;
    } else if (d->type == H2_FRAME_HEADERS || d->type == H2_FRAME_CONTINUATION ||
               d->type == H2_FRAME_PUSH_PROMISE) {
        /* A piece holds less than 4 KiB: a longer payload (a big cookie or
         * token; frames go up to 16 KiB) takes one step per piece, the walk
         * going on where this one stopped, so that no piece is cut. */
        if (take >= H2_HEADER_PIECE_BYTES)
            take = H2_HEADER_PIECE_BYTES - 1;
        asm volatile("%0 &= 4095" : "+r"(take));   /* no change; the verifier's bound for the read */
        h2_send_header_piece(s, d, at, take);
    } else if ((d->type == H2_FRAME_RST_STREAM || d->type == H2_FRAME_GOAWAY) && at_start && take >= 4) {
        /* RST_STREAM: the error code; GOAWAY: the last stream the peer will handle. */
        u8 word[4] = {};
        bpf_probe_read_user(word, 4, (void *)at);
        part->value = h2_be32(word) & (d->type == H2_FRAME_GOAWAY ? 0x7fffffff : 0xffffffff);
    }
    s->h2_seg_off += take;
    d->frame_left -= take;
    if (!d->frame_left)
        h2_frame_ends(s, d);
}

/* The walk gives up on this direction of the connection (a syscall with
 * more frames than the step budget, an unreadable header): said once, in
 * the event and the counters, and never guessed past. */
static __always_inline void h2_give_up(struct scratch *s, struct h2_dir *d)
{
    d->lost = 1;
    s->h2ev.flags |= H2_FLAG_LOST_SYNC;
    count(COUNTER_H2_LOST_SYNC);
}

/* What scan_body and scan_fields found in a DATA payload (h2_scan_data),
 * into its part of the event: its token events (SSE "data:" lines less the
 * end marker and empty or finish chunks; NDJSON lines where it has no
 * "data:"), the end markers; then back to the walk (h2_frames), a run not
 * counted. */
static __always_inline int h2_data_scanned(void *ctx, int tls, struct scratch *s)
{
    struct h2_frame *part = &s->h2ev.frames[s->h2_scan_part & (H2_FRAMES_PER_EVENT - 1)];
    u32 lines = s->data_lines;
    if ((s->done & 1) && lines)
        lines--;
    lines = s->empty_events < lines ? lines - s->empty_events : 0;
    if (!s->data_lines && !s->deferred && !s->named_events)
        lines = s->json_lines;
    part->messages = lines > 255 ? 255 : lines;
    part->part |= H2_PART_FLAG_SCANNED;
    if (s->done)
        part->part |= H2_PART_FLAG_SSE_DONE;
    if (s->json_done)
        part->part |= H2_PART_FLAG_JSON_DONE;
    s->h2_scan_len = 0;
    if (s->h2_runs)
        s->h2_runs--;
    chain_call(ctx, tls, PROG_H2_FRAMES);
    /* The tail call failed: the rest of the syscall cannot be walked. */
    u64 conn_id = s->h2ev.conn_id;
    struct h2_conn *conn = bpf_map_lookup_elem(&h2_conns, &conn_id);
    if (conn)
        h2_give_up(s, &conn->dir[s->h2ev.dir & 1]);
    h2_send_event(s, 0);
    return 0;
}

/* The preface, read (a server) or written (a client): the connection is
 * HTTP/2 from here on; the rest of the syscall is frames. */
static __always_inline int h2_connection_begins(void *ctx, int tls, struct scratch *s)
{
    struct conn_state *state = event_conn(s);
    if (!state)
        return 0;
    state->h2 = 1;
    state->http_seen = 1;
    conn_changed(s);
    struct h2_conn fresh = {};
    bpf_map_update_elem(&h2_conns, &s->ev.conn_id, &fresh, BPF_ANY);
    h2_begin_event(s, s->ev.hdr.type == EVENT_SOCK_WRITE ? DIR_WRITE : DIR_READ, H2_FLAG_PREFACE);
    /* The frames start after the preface, less its pieces held before this syscall. */
    h2_walk_begin(s, H2_PREFACE_BYTES - (s->joined < H2_PREFACE_BYTES ? s->joined : 0));
    chain_call(ctx, tls, PROG_H2_FRAMES);
    h2_send_event(s, 0);   /* the tail call failed: at least say the connection is HTTP/2 */
    return 0;
}

/* The event of a traced syscall that moved bytes (or failed), classified by
 * the tail-call chain below. */
static __always_inline int classify_io(void *ctx, u64 id, struct pending_io io, long ret, u64 now, int tls)
{
    u16 began_before_tracing = io.ts_ns == 0;
    if (began_before_tracing)
        io.ts_ns = now;
    struct scratch *s = get_scratch();
    if (!s)
        return 0;

    if (io.is_msghdr) {
        /* struct user_msghdr: msg_iov at offset 16, msg_iovlen at 24 (LP64),
         * both in one read (each helper call costs ~70 ns, see copy_iovecs). */
        struct user_iovec msg_iov = {};
        bpf_probe_read_user(&msg_iov, sizeof(msg_iov), (void *)(io.buf + 16));
        io.buf = msg_iov.base;
        io.vlen = msg_iov.len > 1024 ? 1024 : (u32)msg_iov.len;
    }

    struct io_event *ev = &s->ev;
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, io.dir == DIR_READ ? EVENT_SOCK_READ : EVENT_SOCK_WRITE, io.ts_ns, id);
    ev->conn_id = io.conn_id;
    ev->exit_ns = now;
    ev->bytes = ret;
    ev->fd = io.fd;
    ev->content_length = -1;
    if (io.vlen)
        ev->flags |= HTTP_FLAG_VECTORED;
    if (began_before_tracing)
        ev->flags |= HTTP_FLAG_BEGAN_UNSEEN;
    ev->transport = io.session ? TRANSPORT_TLS : TRANSPORT_SOCKET;
    ev->role = io.client ? CONN_ROLE_CLIENT : CONN_ROLE_SERVER;
    ev->wire_ns = io.wire_ns;
    s->tls_session = io.session;
    s->h2_buf = io.buf;
    s->h2_vlen = io.vlen;
    s->h2_total = ret > 0 ? (u64)ret : 0;
    if (io.h2) {
        /* An HTTP/2 connection: its bytes are frames, walked where they lie
         * (nothing is copied into the head, and none of the HTTP/1 scan
         * state below is needed). No bytes, no frames. */
        if (ret <= 0)
            return 0;
        h2_begin_event(s, io.dir, 0);
        h2_walk_begin(s, 0);
        chain_call(ctx, tls, PROG_H2_FRAMES);
        return 0;
    }
    s->zmtp = io.zmtp;
    if (!tls && io.zmtp == ZMTP_FOLLOWED) {
        /* An engine's ZeroMQ connection: its frames are walked where they
         * lie, nothing is classified, and only engine_ipc events are sent. */
        if (ret > 0 && !io.vlen)
            chain_call(ctx, tls, PROG_SCAN_ZMTP);
        return 0;
    }
    /* The request half of the exchange: a server reads it, a client writes it. */
    s->request_side = (io.dir == DIR_READ) != (io.client != 0);
    s->http_seen = io.http_seen;
    s->body = io.body;
    s->n = 0;
    s->tail_in_head = 0;
    s->joined = 0;
    s->h2_scan_len = 0;   /* not an HTTP/2 DATA payload (h2_scan_data) */
    s->length_at = 0;
    s->type_at = 0;
    s->retry_at = 0;
    s->host_at = 0;
    s->last_len = 0;
    reset_body_scans(s);

    if (ret < 0) {
        ev->kind = HTTP_KIND_ERROR;
        return submit(s);
    }
    if (ret == 0) {
        ev->kind = io.dir == DIR_READ ? HTTP_KIND_EOF : HTTP_KIND_DATA;
        return submit(s);
    }
    if (io.vlen) {
        s->iov_next = io.buf;   /* nothing copied yet: all the iovecs are left */
        s->iovs_left = io.vlen;
        s->bytes_left = (u64)ret;
        chain_call(ctx, tls, PROG_GATHER_IOVECS);
    } else {
        copy_buffer(s, io.buf, (u64)ret);
        /* Bytes that could open ZMTP frames (a flags byte) or its greeting
         * (0xff) on a connection that carried no HTTP: scan_zmtp probes them,
         * then hands them on to the classifier if they are not. */
#ifdef HAVE_BPF_LOOP
        if (!tls && !io.http_seen && io.zmtp < ZMTP_PROBES_MAX && (s->head[0] <= 0x07 || s->head[0] == 0xff))
            chain_call(ctx, tls, PROG_SCAN_ZMTP);
#endif
        chain_call(ctx, tls, s->request_side ? PROG_CLASSIFY_REQUEST : PROG_CLASSIFY_RESPONSE);
    }
    /* Only reached when the tail call failed: send the unclassified event
     * rather than lose the bytes. */
    return submit(s);
}

/* The end of a body write: its last bytes, the SSE counts, the event. */
static __always_inline int finish_body(void *ctx, int tls, struct scratch *s)
{
    find_last_iovec(s);
    scan_tail(s);
    finish_sse(s);
    if (s->tail_read) {
        /* The JSON fields in the last bytes of a write the windows did not
         * reach (Ollama's final line ends with its eval_count): scan_fields
         * once more, over the tail. */
        __builtin_memcpy(s->head, s->tail, SCAN_TAIL_BYTES);
        s->n = s->tail_read;
        s->tail_pass = 1;
        s->fields_fresh_from = 0;
        chain_call(ctx, tls, PROG_SCAN_FIELDS);
    }
    return submit(s);
}

static __always_inline int chain_gather_iovecs(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    copy_iovecs(s, 0, 0);
    /* A window of fewer bytes than the overlap cannot carry one over. */
    s->more = s->bytes_left && s->n >= WINDOW_OVERLAP;
    chain_call(ctx, tls, s->request_side ? PROG_CLASSIFY_REQUEST : PROG_CLASSIFY_RESPONSE);
    return submit(s);
}
CHAIN_PROGRAM(gather_iovecs)

/* A further window of a long vectored write: the iovecs after the bytes
 * next_body_window() carried over, then back to scan_body. A program of its
 * own, with the offset a constant: copy_iovecs() with a variable one, and
 * resuming, in one program took the verifier three times as long. */
static __always_inline int chain_gather_window(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    copy_iovecs(s, WINDOW_OVERLAP, 1);
    s->more = s->bytes_left && s->windows < MAX_VECTORED_WINDOWS;
    chain_call(ctx, tls, s->json_mode ? PROG_SCAN_FIELDS : PROG_SCAN_BODY);
    return finish_body(ctx, tls, s);
}
CHAIN_PROGRAM(gather_window)

/* ---------------------------------------------------------------- engine IPC (ZMTP)
 *
 * An engine's connections between its own processes (zmtp.bpf.h). A
 * connection that carried no HTTP and whose syscall starts like ZMTP is
 * probed here (its greeting, or bytes that tile as frames); if it is not,
 * the bytes go on to the classifier. Once found it is followed: every later
 * syscall comes here straight from classify_io, and the walk's state per
 * direction lives in zmtp_streams. Needs bpf_loop (HAVE_BPF_LOOP): on older
 * kernels (sock_hash.bpf.o) this program only hands the bytes on. */
static __always_inline void zmtp_connection_closed(u64 conn_id)
{
    struct zmtp_key key = {.conn_id = conn_id, .dir = DIR_READ};
    bpf_map_delete_elem(&zmtp_streams, &key);
    key.dir = DIR_WRITE;
    bpf_map_delete_elem(&zmtp_streams, &key);
    count(COUNTER_CONNS_ENGINE_IPC);
}

#ifdef HAVE_BPF_LOOP
/* One direction's walk begins afresh, at a frame boundary (or its greeting:
 * zmtp_unit_step looks at its first byte). */
static __always_inline struct zmtp_stream *zmtp_stream_begins(u64 conn_id, u32 dir)
{
    u32 zero = 0;
    struct zmtp_stream *blank = bpf_map_lookup_elem(&zmtp_blank, &zero);
    if (!blank)
        return 0;
    struct zmtp_key key = {.conn_id = conn_id, .dir = dir};
    bpf_map_update_elem(&zmtp_streams, &key, blank, BPF_ANY);
    return bpf_map_lookup_elem(&zmtp_streams, &key);
}

/* The connection is ZMTP from here on: marked in socks (no longer counted
 * unrecognised), and both directions' walks begin. */
static __always_inline struct zmtp_stream *zmtp_follow(struct scratch *s, u32 dir)
{
    struct conn_state *state = event_conn(s);
    if (!state)
        return 0;
    state->zmtp = ZMTP_FOLLOWED;
    state->unrecognised = 0;
    conn_changed(s);
    zmtp_stream_begins(s->ev.conn_id, dir == DIR_READ ? DIR_WRITE : DIR_READ);
    return zmtp_stream_begins(s->ev.conn_id, dir);
}

static __always_inline int chain_scan_zmtp(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    u32 dir = s->ev.hdr.type == EVENT_SOCK_WRITE ? DIR_WRITE : DIR_READ;
    u32 len = s->h2_total < 0x7fffffff ? (u32)s->h2_total : 0x7fffffff;
    struct zmtp_stream *st = 0;
    if (s->zmtp == ZMTP_FOLLOWED) {
        struct zmtp_key key = {.conn_id = s->ev.conn_id, .dir = dir};
        st = bpf_map_lookup_elem(&zmtp_streams, &key);
        if (st && st->mode == ZM_LOST) {
            if (!zmtp_opens(s, s->h2_buf, len))
                return 0;
            st = zmtp_stream_begins(s->ev.conn_id, dir);   /* frames again: this direction from here */
        }
    } else {
        if (zmtp_opens(s, s->h2_buf, len)) {
            st = zmtp_follow(s, dir);
        } else {
            struct conn_state *state = event_conn(s);
            if (state && state->zmtp < ZMTP_PROBES_MAX) {
                state->zmtp++;
                conn_changed(s);
            }
            /* Not ZMTP: the classifier reads the bytes, as before the probe. */
            chain_call(ctx, 0, s->request_side ? PROG_CLASSIFY_REQUEST : PROG_CLASSIFY_RESPONSE);
            return submit(s);
        }
    }
    if (!st)
        return 0;
    /* Every event of this syscall carries its time: a read's when it
     * returned (the bytes had arrived), a write's when it began. */
    st->ev.hdr = s->ev.hdr;
    st->ev.hdr.type = EVENT_ENGINE_IPC;
    if (dir == DIR_READ)
        st->ev.hdr.ts_ns = s->ev.exit_ns;
    st->ev.conn_id = s->ev.conn_id;
    st->ev.dir = dir;
    st->buf = s->h2_buf;
    st->at = 0;
    st->len = len;
    struct zmtp_walk w = {.st = st};
    /* Each unit moves at least one byte: len + 1 units walk the whole syscall. */
    SCAN_LOOP(len + 1, 1 << 23, zmtp_unit, &w);
    zmtp_entry_done(st);   /* an entry whose last byte was the syscall's last */
    return 0;
}
#else
static __always_inline int chain_scan_zmtp(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    if (s->zmtp == ZMTP_FOLLOWED)
        return 0;
    chain_call(ctx, 0, s->request_side ? PROG_CLASSIFY_REQUEST : PROG_CLASSIFY_RESPONSE);
    return submit(s);
}
#endif
/* ZMTP over a TLS library is not read: only the syscall chain has this program. */
SEC("tracepoint")
int scan_zmtp(void *ctx) { return chain_scan_zmtp(ctx); }

/* ---------------------------------------------------------------- a request's head in pieces
 *
 * A request line or header block may come in more than one read (a server's)
 * or write (a client's), cut at any byte: granian first reads 24 bytes (the
 * length of the HTTP/2 preface, to tell the protocols apart), so a request
 * line longer than that arrives as "POST /v1/chat/completion" and then
 * "s HTTP/1.1\r\n..."; Go's net/http reads one byte in the background while
 * a handler runs, which takes the first letter of the next keep-alive
 * request. Such a piece, one that opens a request but does not hold the
 * blank line ending its headers (or the first bytes of HTTP/2's preface),
 * is held per connection instead of being
 * sent, and the connection's next request-half bytes are classified with
 * it in front: one event, with the pieces' bytes and when the first one
 * moved. A piece is held only when its syscall's bytes all fit in the head
 * (under SCAN_HEAD_BYTES, the most a single read would have been scanned for
 * too), so the join sees what one read of the whole would have.
 *
 * Bounded: one entry per connection whose head is open now (a few
 * microseconds apart for all the stacks above), in an LRU; conn_ids are
 * never reused, so an entry left by a connection that closed between its
 * pieces is never joined to another and ages out. */
struct open_head {
    u64 first_ns;   /* when the first piece moved: a read's exit, a write's entry */
    u32 len;        /* bytes held */
    u32 pieces;     /* syscalls held so far */
    u8 bytes[SCAN_HEAD_BYTES];
};
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 1024);
    __type(key, u64);
    __type(value, struct open_head);
} request_heads_open SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct open_head);
} open_head_build SEC(".maps");   /* too big for the stack */
/* Where join_open_head() lays the pieces end to end: twice the head, so that
 * the verifier sees any copy of under SCAN_HEAD_BYTES at an offset under
 * SCAN_HEAD_BYTES stay inside it. */
struct head_join {
    u8 bytes[SCRATCH_BYTES];
};
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct head_join);
} head_join_area SEC(".maps");

/* Bytes that could still become a request line: a method's first letters
 * (up to and with its space), nothing after them yet. */
static __always_inline int opens_a_method(struct scratch *s, u64 first8)
{
    u32 n = s->n;
    if (n == 0 || n >= 8)
        return 0;
    u64 low = (1ULL << (8 * n)) - 1;
    return (first8 == (LE8("GET \0\0\0\0") & low)) || (first8 == (LE8("POST \0\0\0") & low)) ||
           (first8 == (LE8("PUT \0\0\0\0") & low)) || (first8 == (LE8("DELETE \0") & low)) ||
           (first8 == (LE8("HEAD \0\0\0") & low)) || (first8 == (LE8("OPTIONS ") & low)) ||
           (first8 == (LE8("PATCH \0\0") & low));
}

/* Holds the head as the open piece of a request (when all of the syscall's
 * bytes are in it): 1 if held, and then the event is not sent. */
static __always_inline int hold_open_head(struct scratch *s)
{
    u32 n = s->n;
    if (n == 0 || n >= SCAN_HEAD_BYTES || (u64)n != (u64)s->ev.bytes || s->ev.joined_pieces >= 254)
        return 0;
    u32 zero = 0;
    struct open_head *open = bpf_map_lookup_elem(&open_head_build, &zero);
    if (!open)
        return 0;
    int read = s->ev.hdr.type == EVENT_SOCK_READ;
    open->first_ns = s->ev.joined_pieces ? s->ev.first_piece_ns : (read ? s->ev.exit_ns : s->ev.hdr.ts_ns);
    open->len = n;
    open->pieces = s->ev.joined_pieces + 1;
    bpf_probe_read_kernel(open->bytes, bounded(n, SCAN_HEAD_BYTES - 1), s->head);
    u64 conn_id = s->ev.conn_id;
    bpf_map_update_elem(&request_heads_open, &conn_id, open, BPF_ANY);
    return 1;
}

/* The connection's open piece, if any, put in front of the syscall's bytes
 * in the head: the event then stands for all of them (bytes, first_piece_ns).
 * A further window of this syscall's buffer is not looked at past a join
 * (its offsets are the buffer's, not the head's); what a request's scans
 * read from the buffer itself (trace context, the body's last bytes) is
 * told of the joined bytes through s->joined. */
static __always_inline void join_open_head(struct scratch *s)
{
    u64 conn_id = s->ev.conn_id;
    struct open_head *open = bpf_map_lookup_elem(&request_heads_open, &conn_id);
    if (!open)
        return;
    u32 zero = 0;
    struct head_join *joined = bpf_map_lookup_elem(&head_join_area, &zero);
    if (!joined) {
        bpf_map_delete_elem(&request_heads_open, &conn_id);
        return;
    }
    u32 k = bounded(open->len, SCAN_HEAD_BYTES - 1);
    u32 m = s->n < SCAN_HEAD_BYTES - k ? s->n : SCAN_HEAD_BYTES - k;
    if (k)
        bpf_probe_read_kernel(joined->bytes, k, open->bytes);
    u64 first_ns = open->first_ns;
    u32 pieces = open->pieces;
    bpf_map_delete_elem(&request_heads_open, &conn_id);
    if (m > 0 && m < SCAN_HEAD_BYTES)
        bpf_probe_read_kernel(&joined->bytes[k], bounded(m, SCAN_HEAD_BYTES - 1), s->head);
    u32 n = k + m;
    if (n > 0 && n <= SCAN_HEAD_BYTES)
        bpf_probe_read_kernel(s->head, bounded(n, SCRATCH_BYTES - 1), joined->bytes);
    s->n = n;
    s->joined = k;
    s->more = 0;
    s->tail_in_head = s->tail_in_head && (u64)n == (u64)s->ev.bytes + k;
    s->ev.bytes += k;
    s->ev.joined_pieces = pieces > 255 ? 255 : (u8)pieces;
    s->ev.first_piece_ns = first_ns;
    count(COUNTER_REQUEST_HEADS_JOINED);
}

/* classify_request and classify_response, the first programs once a
 * syscall's bytes are in the head, take the request half of an exchange (a
 * server's reads, a client's writes) and the response half (a server's
 * writes, a client's reads), and tell which protocol it speaks from its first bytes,
 * by the recognisers of each protocol's header (HTTP/1: http1.bpf.h). A new
 * protocol's recogniser is one more branch in each, sending its syscalls to
 * programs of its own or to the body scans. */
static __always_inline int chain_classify_request(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    join_open_head(s);
    if (h2_is_preface(s))
        return h2_connection_begins(ctx, tls, s);
    if (h2_opens_preface(s) && hold_open_head(s))
        return 0;
    u32 after = 0;
    u64 first8 = first_bytes(s);
    u8 method = parse_method(first8, &after);
    if (request_line(s, method, after)) {
        chain_call(ctx, tls, PROG_SCAN_HEADER_BLOCK);
    } else if ((method != HTTP_METHOD_UNKNOWN && after >= s->n) || opens_a_method(s, first8)) {
        if (hold_open_head(s))
            return 0;   /* a method, or its first letters, and nothing after them yet */
    } else if (s->http_seen) {
        /* a request body read apart from its headers, or more of them (scan_trace_context) */
        chain_call(ctx, tls, PROG_SCAN_TRACE_CONTEXT);
    }
    return submit(s);
}
CHAIN_PROGRAM(classify_request)

static __always_inline int chain_classify_response(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    u64 first8 = first_bytes(s);
    if (status_line(s, first8)) {
        chain_call(ctx, tls, PROG_SCAN_HEADER_BLOCK);
        return submit(s);
    }
    chunked_end_piece(s, first8);
    chain_call(ctx, tls, PROG_SCAN_BODY);
    return submit(s);
}
CHAIN_PROGRAM(classify_response)

/* A response's headers say what its body is: chunked, an AWS event stream.
 * The connection keeps that for the writes (reads) of the body: find_framing
 * reads only a chunked body's payloads, scan_body hands an event stream to
 * scan_event_stream. Written only when it changes, which a keep-alive
 * connection's responses of one kind never do. */
static __always_inline void remember_body(struct scratch *s)
{
    u32 body = (s->ev.flags & HTTP_FLAG_CHUNKED ? BODY_CHUNKED : 0) |
               (s->ev.stream_flags & STREAM_FLAG_AWS_EVENTS ? BODY_AWS_EVENTS : 0);
    if (body == s->body)
        return;
    s->body = body;   /* this write's own body, after its headers */
    struct conn_state *state = event_conn(s);
    if (state) {
        state->body = body;
        conn_changed(s);
    }
}

static __always_inline int chain_scan_header_block(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    scan_headers(s);
    parse_content_length(s);
    copy_host(s);
    if (s->type_at)
        content_type(s, s->type_at);
    if (s->ev.kind == HTTP_KIND_RESPONSE) {
        remember_body(s);
        /* Headers seen whole, neither chunked nor an event stream: nothing
         * in this body is read downstream (no tokens outside streams, the
         * end is a byte count or close), so the scan is skipped. */
        u16 flags = s->ev.flags;
        if ((flags & HTTP_FLAG_HEADERS_END) && !(s->body & BODY_AWS_EVENTS) &&
            !(flags & (HTTP_FLAG_CHUNKED | HTTP_FLAG_EVENT_STREAM | HTTP_FLAG_NDJSON_STREAM)))
            return submit(s);
        if (!s->body_start)
            s->body_start = s->n;   /* headers run past the window: no body in view */
        chain_call(ctx, tls, PROG_SCAN_BODY);
    } else {
        if (!(s->ev.flags & HTTP_FLAG_HEADERS_END)) {
            if (hold_open_head(s))
                return 0;   /* the rest of the request line or headers is in the next read (write) */
            s->body_start = s->n;   /* headers run past the window: only the read's end is body */
        }
        chain_call(ctx, tls, PROG_SCAN_TRACE_CONTEXT);
    }
    return submit(s);
}
CHAIN_PROGRAM(scan_header_block)

/* The rest of a read of a request: its "model" (found by scan_json_fields)
 * taken, or looked for again in the read's last bytes (the OpenAI SDKs put
 * "model" after "messages", so a long prompt pushes it past the head). */
static __always_inline int finish_request_read(void *ctx, int tls, struct scratch *s)
{
    if (take_model(s))
        return submit(s);
    u64 len = s->last_len;
    if (!s->model_pass && len > s->n - s->joined && !(s->ev.flags & HTTP_FLAG_VECTORED)) {
        u32 t = len > SCAN_HEAD_BYTES ? SCAN_HEAD_BYTES : (u32)len;
        if (t > 0 && t <= SCAN_HEAD_BYTES)
            bpf_probe_read_user(s->head, t, (void *)(s->last_base + len - t));
        s->n = t;
        s->model_pass = 1;
        chain_call(ctx, tls, PROG_SCAN_FIELDS);
    }
    return submit(s);
}

/* Scans the head, then each further window of a long write in a call of
 * itself (a tail call: the chain gives each window a fresh instruction
 * budget). Where the tail call fails, the lines counted so far stand. */
static __always_inline int chain_scan_body(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    if (s->ev.kind == HTTP_KIND_RESPONSE && !(s->ev.flags & HTTP_FLAG_HEADERS_END))
        s->more = 0;   /* headers past the head: where the body starts is unknown */
    if ((s->body & BODY_AWS_EVENTS) && !s->h2_scan_len && !s->request_side)
        chain_call(ctx, tls, PROG_SCAN_EVENT_STREAM);   /* binary messages, not lines */
    scan_sse(s);
    if (s->h2_scan_len) {
        /* an HTTP/2 DATA payload (h2_scan_data): its fields, then back to the frame walk */
        chain_call(ctx, tls, PROG_SCAN_FIELDS);
        return h2_data_scanned(ctx, tls, s);
    }
    take_event_name(s);
    /* The first window also goes through scan_fields, to learn whether the
     * stream is NDJSON; so do the last and the first within SCAN_HEAD_BYTES
     * of the write's end, for the counts a stream states at its end (a
     * window of MAX_IOVECS iovecs can end well before the bytes do). At most
     * three per write: the tail-call budget. */
    u64 after = s->ev.flags & HTTP_FLAG_VECTORED ? s->bytes_left :
                s->last_len - s->window_start - s->n;
    int near_end = s->windows && after < SCAN_HEAD_BYTES && !s->fields_near_end;
    if (near_end)
        s->fields_near_end = 1;
    if (!s->windows || !s->more || near_end)
        chain_call(ctx, tls, PROG_SCAN_FIELDS);
    if (next_body_window(s))
        chain_call(ctx, tls, s->ev.flags & HTTP_FLAG_VECTORED ? PROG_GATHER_WINDOW : PROG_SCAN_BODY);
    return finish_body(ctx, tls, s);
}
CHAIN_PROGRAM(scan_body)

/* A window of an AWS event stream's body (event_stream.bpf.h): its token
 * messages, other events, exception and usage, in place of the SSE and JSON
 * scans of scan_body and scan_fields, which read lines; then the next window
 * (a plain buffer's here, a vectored write's through gather_window and
 * scan_body, which hands it back), or the write's end. */
static __always_inline int chain_scan_event_stream(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    scan_event_stream_window(s);   /* a write's head comes through scan_body, which bounded its windows */
    if (s->h2_scan_len)
        return h2_data_scanned(ctx, tls, s);   /* an HTTP/2 DATA payload (h2_scan_data): back to the walk */
    if (next_body_window(s))
        chain_call(ctx, tls, s->ev.flags & HTTP_FLAG_VECTORED ? PROG_GATHER_WINDOW : PROG_SCAN_EVENT_STREAM);
    return finish_body(ctx, tls, s);
}
CHAIN_PROGRAM(scan_event_stream)

/* NDJSON line ends and the JSON fields of a window (stream_fields.bpf.h),
 * apart from scan_body: each program's scan loop has a budget of branches
 * per position that the verifier can follow, and the two together exceed
 * it. Windows after the first go through here alone when the first had no
 * "data:" line (an NDJSON stream), else through scan_body alone until the
 * last. */
static __always_inline int chain_scan_fields(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    /* Later windows from 0: a count cut by the edge of the one before is whole
     * in the overlap (a count seen twice is the same count). The tail, after
     * the windows (finish_body), from 0 too. One scan in the program, which
     * the verifier walks once. What is counted rather than taken (an empty
     * event) is counted in a window right after one this scanned only where
     * that one could not see its end (fields_fresh_from, next_body_window). */
    s->fields_saw_window = 1;
    scan_json_fields(s, s->windows || s->tail_pass || s->model_pass ? 0 : s->body_start);
    if (s->h2_scan_len)
        return h2_data_scanned(ctx, tls, s);   /* an HTTP/2 DATA payload (h2_scan_data) */
    if (s->request_side)
        return finish_request_read(ctx, tls, s);
    if (s->tail_pass)
        return submit(s);
    if (!s->windows) {
        /* Only a stream goes on past the head: a long write of anything else
         * (a JSON body, a file) costs one window, as it always did. */
        u32 sse = s->data_lines || s->deferred || s->named_events;
        if (!sse && !s->json_lines && !s->json_deferred)
            s->more = 0;
        s->json_mode = !sse;
    }
    if (next_body_window(s))
        chain_call(ctx, tls, s->ev.flags & HTTP_FLAG_VECTORED ? PROG_GATHER_WINDOW :
                              s->json_mode ? PROG_SCAN_FIELDS : PROG_SCAN_BODY);
    return finish_body(ctx, tls, s);
}
CHAIN_PROGRAM(scan_fields)

/* The frames of an HTTP/2 connection's syscall, H2_STEPS steps a run; a
 * syscall that needs more runs the program again (a tail call), up to
 * H2_MAX_RUNS. Whoever calls the first run began the walk (h2_walk_begin:
 * classify_io at the syscall's first byte, h2_connection_begins after the
 * preface). */
/* A DATA payload of a text stream (SSE, NDJSON) on the response half, as
 * the walk found it (s->h2_scan_*): its first SCAN_HEAD_BYTES read into the
 * head, for scan_body and scan_fields to scan as an HTTP/1 body write (with
 * s->h2_scan_len set they hand their counts to h2_data_scanned, which goes
 * back to the walk where it stopped). At most H2_DATA_SCANS payloads per
 * syscall: each costs three tail calls of the 33 a chain may make, beside
 * the walk's H2_MAX_RUNS; one past them counts as its first bytes say. A
 * line cut by the frame's end (or the head's) is not counted. */
static __always_inline void h2_scan_data(struct scratch *s)
{
    u32 n = s->h2_scan_len < SCAN_HEAD_BYTES ? s->h2_scan_len : SCAN_HEAD_BYTES;
    if (n > 0 && n <= SCAN_HEAD_BYTES)
        bpf_probe_read_user(s->head, n, (void *)s->h2_scan_at);
    s->n = n;
    reset_body_scans(s);
}

static __always_inline int chain_h2_frames(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    u64 conn_id = s->h2ev.conn_id;
    struct h2_conn *conn = bpf_map_lookup_elem(&h2_conns, &conn_id);
    if (!conn)
        return 0;   /* its walk state was evicted (16384 HTTP/2 connections at once) */
    struct h2_dir *d = &conn->dir[s->h2ev.dir & 1];
    if (d->lost)
        return 0;
    s->h2_runs++;
    for (u32 i = 0; i < H2_STEPS; i++) {
        if (s->h2_seg_off >= s->h2_seg_len) {
            if (!h2_next_segment(s))
                break;
            continue;
        }
        u32 avail = s->h2_seg_len - s->h2_seg_off;
        u64 at = s->h2_seg_base + s->h2_seg_off;
        if (s->h2_skip) {
            u32 step = s->h2_skip < avail ? s->h2_skip : avail;
            s->h2_skip -= step;
            s->h2_seg_off += step;
        } else if (d->frame_left) {
            h2_payload_step(s, d, at, avail);
        } else {
            h2_header_step(s, d, at, avail);
        }
        if (d->lost || s->h2_scan_len)
            break;
    }
    if (s->h2_scan_len && !d->lost) {
        s->h2_scans++;
        h2_scan_data(s);
        chain_call(ctx, tls, s->h2_scan_aws ? PROG_SCAN_EVENT_STREAM : PROG_SCAN_BODY);
        s->h2_scan_len = 0;   /* the tail call failed: the part keeps what its first bytes said */
    }
    if (d->lost) {
        h2_give_up(s, d);
    } else if (h2_bytes_remain(s)) {
        if (s->h2_runs < H2_MAX_RUNS)
            chain_call(ctx, tls, PROG_H2_FRAMES);
        h2_give_up(s, d);   /* out of runs (or the tail call failed) */
    }
    h2_send_event(s, 0);
    return 0;
}
CHAIN_PROGRAM(h2_frames)


/* ---------------------------------------------------------------- W3C trace context
 *
 * The request side's header block looked through for traceparent and
 * tracestate (trace_context.bpf.h), one window per call of this program,
 * between scan_header_block (or classify_request, for a later read or write
 * of a header block left open) and scan_fields, which it hands on to. A
 * request without a long header block costs one window over the head; a
 * body read on a connection costs one lookup in trace_headers_open. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct trace_scan);
} trace_scan_area SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);
    __type(value, struct trace_open);
} trace_headers_open SEC(".maps");
/* The bytes of a traceparent or tracestate value cut by a syscall's end, for
 * the connection's next one: rare (a value across reads), so fewer entries. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 1024);
    __type(key, u64);
    __type(value, struct trace_partial);
} trace_values_open SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct trace_partial);
} trace_partial_build SEC(".maps");

/* The first window of a syscall: the head, after the byte that ended the
 * last syscall when this one goes on with an open header block. 0: nothing to scan. */
static __always_inline int trace_first_window(struct scratch *s, struct trace_scan *t)
{
    u64 conn_id = s->ev.conn_id;
    u32 shift = 0, before = 0;
    struct trace_open open = {};
    if (s->ev.kind != HTTP_KIND_REQUEST) {
        struct trace_open *left = bpf_map_lookup_elem(&trace_headers_open, &conn_id);
        if (!left)
            return 0;
        open = *left;
        before = open.scanned;
        t->buf[0] = open.ended_line ? '\n' : ' ';
        shift = 1;
    }
    __builtin_memset(&t->ev, 0, sizeof(t->ev));
    t->ev.hdr = s->ev.hdr;
    t->ev.hdr.type = EVENT_TRACE_CONTEXT;
    t->ev.conn_id = conn_id;
    t->ev.exit_ns = s->ev.exit_ns;
    t->ev.role = s->ev.role;
    t->io_exit_ns = s->ev.exit_ns;
    t->scanned_before = before;
    t->windows = 0;
    t->ended = 0;
    t->parent_at = t->parent_end = t->state_at = t->state_end = 0;
    /* A value the last syscall ended inside goes on from this one's first byte. */
    t->continues = open.continues;
    t->parent_have = open.parent_have;
    t->state_have = open.state_have;
    if (open.continues & TRACE_CONTINUES_PARENT) {
        t->parent_at = 1;
        t->ev.header_offset = open.parent_line_at;
    }
    if (open.continues & TRACE_CONTINUES_STATE)
        t->state_at = 1;
    t->start = -(s32)shift;
    u32 n = s->n > SCAN_HEAD_BYTES - shift ? SCAN_HEAD_BYTES - shift : s->n;
    u64 size = bounded(n, 2 * SCAN_HEAD_BYTES - 1);
    if (size > 0 && size <= SCAN_HEAD_BYTES)
        bpf_probe_read_kernel(&t->buf[shift & 1], size, s->head);
    t->n = n + shift;
    /* Where the bytes past the head lie: a plain buffer; for vectored I/O the
     * first iovec when the head came from it alone (Node's http client writes a
     * request's headers and body as one iovec); else the head is all there is. */
    u64 bytes = (u64)s->ev.bytes, len = s->n;
    t->user_base = 0;
    if (s->joined) {
        /* Earlier pieces in front of the head (join_open_head): the buffer
         * holds the bytes from s->joined on (later windows start there at the
         * earliest, a value begun in the pieces is read from the head). */
        if (!(s->ev.flags & HTTP_FLAG_VECTORED)) {
            t->user_base = s->last_base - s->joined;
            len = bytes;
        }
    } else if (!(s->ev.flags & HTTP_FLAG_VECTORED)) {
        t->user_base = s->last_base;
        len = bytes;
    } else if (s->n == SCAN_HEAD_BYTES && s->iovs[0].len >= SCAN_HEAD_BYTES) {
        t->user_base = s->iovs[0].base;
        len = s->iovs[0].len < bytes ? s->iovs[0].len : bytes;
    }
    t->whole = len >= bytes;
    u32 room = before < TRACE_HEADER_BYTES ? TRACE_HEADER_BYTES - before : 0;
    t->len = len < room ? (u32)len : room;
    return 1;
}

/* After the last window of a syscall: the event, and whether the header
 * block goes on in the connection's next read (write), with the bytes of a
 * value cut by this syscall's end. */
static __always_inline void trace_finish(struct scratch *s, struct trace_scan *t)
{
    u64 conn_id = s->ev.conn_id;
    const struct trace_partial *partial = t->continues ? bpf_map_lookup_elem(&trace_values_open, &conn_id) : 0;
    s32 seen = t->start + (s32)t->n;
    u32 scanned = t->scanned_before + (seen > 0 ? (u32)seen : 0);
    /* Open only while every byte so far was looked at and the block has not ended. */
    int stays_open = !(t->ended || seen < 0 || !t->whole || (u64)seen < (u64)s->ev.bytes ||
                       scanned >= TRACE_HEADER_BYTES);
    struct trace_open open = {.scanned = scanned,
                              .ended_line = t->buf[(t->n - 1) & SCRATCH_MASK] == '\n'};
    u32 zero = 0;
    struct trace_partial *keep = stays_open ? bpf_map_lookup_elem(&trace_partial_build, &zero) : 0;
    if (keep)
        trace_keep_partial(t, &open, keep, seen, t->user_base, s->head, s->joined, partial);
    trace_values(t, t->user_base, s->head, s->joined, partial);
    if (open.continues)
        bpf_map_update_elem(&trace_values_open, &conn_id, keep, BPF_ANY);
    else if (t->continues)
        bpf_map_delete_elem(&trace_values_open, &conn_id);
    struct trace_context_event *ev = &t->ev;
    if (t->ended)
        ev->flags |= TRACE_CONTEXT_FLAG_HEADERS_END;
    if (s->ev.kind != HTTP_KIND_REQUEST)
        ev->flags |= TRACE_CONTEXT_FLAG_LATER_IO;
    if (ev->flags & (TRACE_CONTEXT_FLAG_TRACEPARENT | TRACE_CONTEXT_FLAG_TRACESTATE |
                     TRACE_CONTEXT_FLAG_TRACEPARENT_CUT | TRACE_CONTEXT_FLAG_TRACESTATE_CUT))
        send_event(ev, sizeof(*ev));
    if (!stays_open) {
        if (s->ev.kind != HTTP_KIND_REQUEST || !(s->ev.flags & HTTP_FLAG_HEADERS_END) || t->scanned_before)
            bpf_map_delete_elem(&trace_headers_open, &conn_id);
        return;
    }
    bpf_map_update_elem(&trace_headers_open, &conn_id, &open, BPF_ANY);
}

static __always_inline int chain_scan_trace_context(void *ctx, int tls)
{
    struct scratch *s = get_scratch();
    u32 zero = 0;
    struct trace_scan *t = bpf_map_lookup_elem(&trace_scan_area, &zero);
    if (!s || !t)
        return 0;
    if (t->io_exit_ns != s->ev.exit_ns || t->ev.conn_id != s->ev.conn_id) {
        if (!trace_first_window(s, t)) {
            chain_call(ctx, tls, PROG_SCAN_FIELDS);
            return submit(s);
        }
    } else {
        /* A further window of the user buffer, from TRACE_WINDOW_OVERLAP before the last one's end. */
        s32 from = t->start + (s32)t->n - TRACE_WINDOW_OVERLAP;
        if (from < (s32)s->joined)
            from = s->joined;   /* the bytes before are the held pieces', which the head had */
        u32 left = from >= 0 && (u32)from < t->len ? t->len - (u32)from : 0;
        u32 n = left > SCAN_HEAD_BYTES ? SCAN_HEAD_BYTES : left;
        u64 size = bounded(n, 2 * SCAN_HEAD_BYTES - 1);
        if (size > 0 && size <= SCAN_HEAD_BYTES)
            bpf_probe_read_user(t->buf, size, (void *)(t->user_base + (u32)from));
        t->start = from;
        t->n = n;
    }
    trace_scan_window(t);
    t->windows++;
    s32 seen = t->start + (s32)t->n;
    int both = t->parent_end && t->state_end;
    if (!t->ended && !both && t->user_base && seen > 0 && (u32)seen < t->len && t->windows < MAX_TRACE_WINDOWS)
        chain_call(ctx, tls, PROG_SCAN_TRACE_CONTEXT);
    trace_finish(s, t);
    chain_call(ctx, tls, PROG_SCAN_FIELDS);
    return submit(s);
}
CHAIN_PROGRAM(scan_trace_context)

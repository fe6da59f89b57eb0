/* sock.bpf.c: HTTP/1.x request and response boundaries from socket syscalls.
 *
 * Attached to syscall tracepoints only (no kprobes). For the target process
 * trees it follows accepted sockets, peeks at the first bytes of each socket
 * read and write to classify them (request line, status line, SSE "data:"
 * events, end of a chunked body) and sends one compact io_event per syscall.
 *
 * Privacy: buffers are copied into a per-CPU scratch area that never leaves
 * the kernel. Only the method, the path (without query string), the status
 * code, lengths, counts and flags reach user space: no body byte does.
 *
 * Shared maps (targets, events, counters) and the process-tree tracking live
 * in common.bpf.h.
 */
#include "common.bpf.h"

/* The scratch buffer is twice the scan window so that a copy of up to
 * SCAN_HEAD_BYTES starting anywhere below SCAN_HEAD_BYTES stays inside it:
 * that is what lets the verifier accept variable offsets (masked below). */
#define SCRATCH_BYTES (2 * SCAN_HEAD_BYTES)
#define SCRATCH_MASK (SCRATCH_BYTES - 1)
#define MAX_IOVECS 4

struct sock_key {
    u32 pid;
    s32 fd;
};

struct conn_state {
    u64 conn_id;
    u32 http_seen;   /* a request line was read: from now on every I/O counts */
    u32 _pad;
};

enum io_dir { DIR_READ = 0, DIR_WRITE = 1 };

struct pending_io {
    u64 ts_ns;
    u64 buf;         /* plain buffer, or iovec array, or user_msghdr */
    u64 conn_id;
    u32 vlen;        /* number of iovecs, 0 for a plain buffer */
    s32 fd;
    u16 dir;
    u16 is_msghdr;
    u32 http_seen;
};

/* Per-CPU state handed from one program of the classification chain to the
 * next (tail calls share no stack). Nothing here leaves the kernel except
 * `ev`, which holds only derived fields. */
struct scratch {
    u8 head[SCRATCH_BYTES];
    u8 tail[SCAN_TAIL_BYTES];
    struct io_event ev;
    u64 last_base;   /* the last user buffer touched, for the tail scan */
    u64 last_len;
    u32 n;           /* bytes copied into head */
    u32 tail_in_head; /* the head ends with the whole of the last buffer */
    u32 body_start;
    u32 http_seen;
    u32 length_at;   /* where the Content-Length value starts, 0 if none */
    u32 data_lines;
    u32 done;
};


/* User-space ABI layouts (stable, unlike kernel-internal structs). */
struct user_iovec {
    u64 base;
    u64 len;
};

BPF_TABLE("lru_hash", struct sock_key, struct conn_state, socks, 65536);
/* Per tid, from a syscall's entry to its exit. A plain hash, not an LRU:
 * inserting into an LRU cost ~100 ns more on every traced syscall
 * (benchmarks/bench_syscalls.py). Entries cannot pile up: the exit removes
 * them, and the kernel runs the exit tracepoint even for a thread killed
 * inside the syscall (tests/e2e/test_inflight_state.py). Should it ever be
 * full, the syscall is counted (IO_UNTRACKED) rather than silently lost. */
BPF_HASH(pending, u64, struct pending_io, 16384);
BPF_TABLE("lru_hash", u64, u64, pending_accept, 4096);           /* per tid: sockaddr ptr */
BPF_ARRAY(next_conn_id, u64, 1);
BPF_PERCPU_ARRAY(scratch_area, struct scratch, 1);

/* ---------------------------------------------------------------- accept / close */

static __always_inline int accept_enter(u64 sockaddr_ptr)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    pending_accept.update(&id, &sockaddr_ptr);
    return 0;
}

static __always_inline int accept_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 addr = 0;
    u64 *sockaddr_ptr = pending_accept.lookup(&id);
    if (sockaddr_ptr) {
        addr = *sockaddr_ptr;
        pending_accept.delete(&id);
    } else if (!is_target(id >> 32)) {
        return 0;
    }
    /* No entry but a target: the accept() was already blocking when we
     * attached (an idle threaded server). Track the connection anyway; only
     * its peer address is unknown. */
    if (ret < 0)
        return 0;

    u32 zero = 0;
    u64 *counter = next_conn_id.lookup(&zero);
    if (!counter)
        return 0;
    u64 conn_id = __sync_fetch_and_add(counter, 1);

    struct sock_key key = {.pid = id >> 32, .fd = (s32)ret};
    struct conn_state state = {.conn_id = conn_id};
    socks.update(&key, &state);

    struct conn_event *ev = events.ringbuf_reserve(sizeof(struct conn_event));
    if (!ev) {
        count(COUNTER_EVENTS_LOST);
        return 0;
    }
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, EVENT_CONN_OPEN, bpf_ktime_get_ns(), id);
    ev->conn_id = conn_id;
    ev->fd = (s32)ret;
    if (addr) {
        /* sockaddr layouts are user ABI: family first, then port (inet). */
        u16 family = 0;
        bpf_probe_read_user(&family, sizeof(family), (void *)addr);
        ev->family = family;
        if (family == 2 /* AF_INET */ || family == 10 /* AF_INET6 */) {
            u16 port_be = 0;
            bpf_probe_read_user(&port_be, sizeof(port_be), (void *)(addr + 2));
            ev->peer_port = (port_be >> 8) | (port_be << 8);
            if (family == 2)
                bpf_probe_read_user(ev->peer_addr, 4, (void *)(addr + 4));
            else
                bpf_probe_read_user(ev->peer_addr, 16, (void *)(addr + 8));
        }
    }
    events.ringbuf_submit(ev, wakeup_flag(sizeof(*ev)));
    count(COUNTER_EVENTS_SENT);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_accept) { return accept_enter((u64)args->upeer_sockaddr); }
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { return accept_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_accept4) { return accept_enter((u64)args->upeer_sockaddr); }
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { return accept_exit(args->ret); }

TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_target(tgid))
        return 0;
    struct sock_key key = {.pid = tgid, .fd = (s32)args->fd};
    struct conn_state *state = socks.lookup(&key);
    if (!state)
        return 0;
    u64 conn_id = state->conn_id;
    u32 http_seen = state->http_seen;
    socks.delete(&key);
    if (!http_seen) {
        count(COUNTER_IO_SKIPPED);
        return 0;
    }
    struct conn_event *ev = events.ringbuf_reserve(sizeof(struct conn_event));
    if (!ev) {
        count(COUNTER_EVENTS_LOST);
        return 0;
    }
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, EVENT_CONN_CLOSE, bpf_ktime_get_ns(), id);
    ev->conn_id = conn_id;
    ev->fd = (s32)args->fd;
    events.ringbuf_submit(ev, wakeup_flag(sizeof(*ev)));
    count(COUNTER_EVENTS_SENT);
    return 0;
}

/* ---------------------------------------------------------------- classification
 *
 * The scanners slide a 16-byte window over the buffer (two u64 registers,
 * newest byte lowest, lower-cased) and compare it with constants. Compared
 * with per-position string compares this keeps each loop iteration to a few
 * branches, which is what lets the verifier accept a 512-byte scan.
 */

/* A window constant: the last characters of a literal, right-aligned. */
#define W1(s) ((u64)(s)[0])
#define W2(s) (((u64)(s)[0] << 8) | (u64)(s)[1])
#define W4(s) (((u64)(s)[0] << 24) | ((u64)(s)[1] << 16) | ((u64)(s)[2] << 8) | (u64)(s)[3])
#define W6(s) (((u64)W2(s) << 32) | W4((s) + 2))
#define W7(s) (((u64)(s)[0] << 48) | W6((s) + 1))
#define W8(s) (((u64)W4(s) << 32) | W4((s) + 4))
#define WMASK(n) ((n) == 8 ? ~0ULL : ((1ULL << ((n) * 8)) - 1))

struct window {
    u64 lo;   /* last 8 bytes */
    u64 hi;   /* the 8 before them */
};

/* ASCII lower case without a branch: every branch inside a scan loop
 * multiplies the paths the verifier walks per byte. */
static __always_inline u64 lower(u8 c)
{
    u64 is_upper = (((u64)(u8)(c - 'A')) - 26) >> 63;   /* 1 when 'A' <= c <= 'Z' */
    return (u64)c + (is_upper << 5);
}

static __always_inline void push(struct window *w, u8 c)
{
    w->hi = (w->hi << 8) | (w->lo >> 56);
    w->lo = (w->lo << 8) | lower(c);
}

/* Header block: the blank line ending it, Content-Length, chunked
 * transfer, text/event-stream, Connection: close. Sets s->body_start (0
 * when the headers run past the window). Branches per byte are few and rare
 * (only on '\n', ':' and '\r'). */
static __always_inline void scan_headers(struct scratch *s)
{
    struct io_event *ev = &s->ev;
    struct window w = {.lo = 0, .hi = 0};
    u32 n = s->n;
    u32 length_at = 0, body_start = 0;
    u16 flags = 0;
    for (u32 i = 0; i < SCAN_HEAD_BYTES; i++) {
        if (i >= n)
            break;
        u8 c = s->head[i & SCRATCH_MASK];
        push(&w, c);
        if (c == '\n') {
            if ((w.lo & WMASK(4)) == W4("\r\n\r\n") || (w.lo & WMASK(2)) == W2("\n\n")) {
                body_start = i + 1;
                flags |= HTTP_FLAG_HEADERS_END;
                break;
            }
        } else if (c == ':') {
            if (w.hi == W8("\ncontent") && w.lo == W8("-length:"))
                length_at = i + 1;
        } else if (c == '\r') {
            if (w.lo == W8("chunked\r"))
                flags |= HTTP_FLAG_CHUNKED;
            else if (w.hi == W8("xt/event") && w.lo == W8("-stream\r"))
                flags |= HTTP_FLAG_EVENT_STREAM;
            else if (w.lo == W8(": close\r"))
                flags |= HTTP_FLAG_CONN_CLOSE;
        }
    }
    ev->flags |= flags;
    s->body_start = body_start;
    s->length_at = length_at;
    ev->header_bytes = body_start;
}

/* The Content-Length value noted by scan_headers(). Runs in its own program:
 * see the chain above classify_read(). */
static __always_inline void parse_content_length(struct scratch *s)
{
    u32 at = s->length_at, n = s->n;
    if (!at)
        return;
    s64 value = 0;
    int digits = 0;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        u32 pos = at + k;
        if (pos >= n)
            break;
        u8 c = s->head[pos & SCRATCH_MASK];
        if (c == ' ' && !digits)
            continue;
        if (c < '0' || c > '9')
            break;
        value = value * 10 + (c - '0');
        digits++;
    }
    if (digits) {
        s->ev.content_length = value;
        s->ev.flags |= HTTP_FLAG_HAS_LENGTH;
    }
}

/* Body: SSE "data:" fields at the start of a line, and "data: [DONE]".
 * Counts live in the scratch map, not in registers, so that paths through
 * the loop differ in nothing the verifier tracks. */
static __always_inline void scan_sse(struct scratch *s)
{
    struct window w = {.lo = '\n', .hi = 0};
    u32 n = s->n, start = s->body_start;
    s->data_lines = 0;
    s->done = 0;
    for (u32 j = 0; j < SCAN_HEAD_BYTES; j++) {
        u32 i = start + j;
        if (i >= n)
            break;
        u8 c = s->head[i & SCRATCH_MASK];
        push(&w, c);
        if (c == ':') {
            if ((w.lo & WMASK(6)) == W6("\ndata:"))
                s->data_lines++;
        } else if (c == ']') {
            if ((w.lo & WMASK(6)) == W6("[done]"))
                s->done |= 1;   /* bit 0: seen in the head, its "data:" was counted */
        }
    }
}

static __always_inline void finish_sse(struct scratch *s)
{
    u32 data_lines = s->data_lines;
    if (s->done)
        s->ev.flags |= HTTP_FLAG_SSE_DONE;
    if ((s->done & 1) && data_lines)
        data_lines--;   /* the [DONE] line is the end marker, not a token */
    s->ev.sse_events = data_lines > 0xffff ? 0xffff : data_lines;
}

/* The last bytes of a write: the chunked terminator and [DONE] trail the
 * final token chunk when a server coalesces the end of a stream. */
static __always_inline void scan_tail(struct scratch *s)
{
    u64 len = s->last_len;
    if (!len)
        return;
    u32 t = len > SCAN_TAIL_BYTES ? SCAN_TAIL_BYTES : (u32)len;
    if (t == 0 || t > SCAN_TAIL_BYTES)
        return;
    if (s->tail_in_head) {
        /* The last buffer is all in the head: take the tail from there
         * rather than read user memory again (most token chunks), and
         * across iovecs, so "\r\n0\r\n\r\n" split between two is seen. */
        u32 n = s->n;
        t = n > SCAN_TAIL_BYTES ? SCAN_TAIL_BYTES : n;
        u32 from = n - t;
#pragma unroll
        for (u32 k = 0; k < SCAN_TAIL_BYTES; k++)
            s->tail[k] = s->head[(from + k) & SCRATCH_MASK];
    } else {
        bpf_probe_read_user(s->tail, t, (void *)(s->last_base + len - t));
    }
    /* [DONE] beyond the head window is only looked for in the tail. */
    u32 tail_is_new = (u64)s->ev.bytes > s->n;
    struct window w = {};
#pragma nounroll
    for (u32 i = 0; i < SCAN_TAIL_BYTES; i++) {
        if (i >= t)
            break;
        u8 c = s->tail[i & (SCAN_TAIL_BYTES - 1)];
        push(&w, c);
        if (c == ']' && (w.lo & WMASK(6)) == W6("[done]"))
            s->done |= tail_is_new << 1;   /* bit 1: seen in the tail only */
    }
    if ((w.lo & WMASK(7)) == W7("\r\n0\r\n\r\n"))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
}

static __always_inline u8 parse_method(u64 first8, u32 *after)
{
    /* first8 holds the first 8 bytes, the first byte highest */
    if ((first8 >> 32) == W4("GET ")) { *after = 4; return HTTP_METHOD_GET; }
    if ((first8 >> 24) == (((u64)W4("POST") << 8) | ' ')) { *after = 5; return HTTP_METHOD_POST; }
    if ((first8 >> 32) == W4("PUT ")) { *after = 4; return HTTP_METHOD_PUT; }
    if ((first8 >> 8) == (((u64)W6("DELETE") << 8) | ' ')) { *after = 7; return HTTP_METHOD_DELETE; }
    if ((first8 >> 24) == (((u64)W4("HEAD") << 8) | ' ')) { *after = 5; return HTTP_METHOD_HEAD; }
    if (first8 == W8("OPTIONS ")) { *after = 8; return HTTP_METHOD_OPTIONS; }
    if ((first8 >> 16) == (((u64)W4("PATC") << 16) | ((u64)'H' << 8) | ' ')) { *after = 6; return HTTP_METHOD_PATCH; }
    return HTTP_METHOD_UNKNOWN;
}

/* lower() folds case for header names; methods and "HTTP/" are compared
 * as sent, so the first 8 bytes are read raw. */
static __always_inline u64 first_bytes(struct scratch *s)
{
    u64 v = 0;
    u32 n = s->n;
#pragma unroll
    for (int k = 0; k < 8; k++)
        v = (v << 8) | (k < n ? s->head[k] : 0);
    return v;
}

/* Copies the path of a request line up to a space or '?': the query string
 * can carry user data, so it is never copied. */
static __always_inline void copy_path(struct scratch *s, u32 start)
{
    u32 n = s->n;
    u32 len = 0;
#pragma unroll
    for (int k = 0; k < PATH_MAX_BYTES; k++) {
        u32 pos = start + k;
        if (pos >= n)
            break;
        u8 c = s->head[pos & SCRATCH_MASK];
        if (c == ' ' || c == '?' || c == '#' || c == '\r' || c == '\n')
            break;
        s->ev.path[k] = c;
        len++;
    }
    s->ev.path_len = len;
}

/* Copies up to SCAN_HEAD_BYTES of what the syscall moved into the scratch
 * head. For vectored I/O the first MAX_IOVECS iovecs are concatenated (HTTP
 * servers such as hyper send a chunk header, the data and the trailer as
 * separate iovecs). Remembers the last buffer touched for the tail scan. */
static __always_inline void copy_head(struct scratch *s, u64 buf, u32 vlen, u64 moved)
{
    if (!vlen) {
        u32 n = moved > SCAN_HEAD_BYTES ? SCAN_HEAD_BYTES : (u32)moved;
        if (n > 0 && n <= SCAN_HEAD_BYTES)
            bpf_probe_read_user(s->head, n, (void *)buf);
        s->n = n;
        s->last_base = buf;
        s->last_len = moved;
        s->tail_in_head = moved == n;
        return;
    }
    u32 copied = 0;
    u64 remaining = moved;
    s->last_len = 0;
    s->tail_in_head = 0;
#pragma unroll
    for (int k = 0; k < MAX_IOVECS; k++) {
        if (k >= vlen || remaining == 0 || copied >= SCAN_HEAD_BYTES)
            break;
        struct user_iovec iov = {};
        bpf_probe_read_user(&iov, sizeof(iov), (void *)(buf + k * sizeof(iov)));
        u64 take = iov.len < remaining ? iov.len : remaining;
        s->last_base = iov.base;
        s->last_len = take;
        remaining -= take;
        u32 room = SCAN_HEAD_BYTES - copied;
        u32 n = take > room ? room : (u32)take;
        u64 off = copied, size = n;
        /* Hide what the compiler knows so that the checks stay in the code
         * as written: the verifier needs them to bound off + size. */
        asm volatile("" : "+r"(off), "+r"(size));
        off &= SCAN_HEAD_BYTES - 1;
        if (size > SCAN_HEAD_BYTES)
            size = SCAN_HEAD_BYTES;
        if (size > 0)
            bpf_probe_read_user(&s->head[off], size, (void *)iov.base);
        copied += n;
        s->tail_in_head = n == take;
    }
    s->n = copied;
}

/* ---------------------------------------------------------------- read / write
 *
 * Entry stores the arguments per thread. Exit fills the event in per-CPU
 * scratch and hands it down a chain of tail calls, one loop per program so
 * that each verifies on its own:
 *   sys_exit_* -> classify_read  -> scan_header_block -> finish_headers -> submit
 *              -> classify_write -> scan_header_block -> finish_headers
 *                                      -> scan_body -> finish_body -> submit
 *                                -> scan_body (no status line) -> finish_body -> submit
 * A loop's exit leads straight into a tail call: had more code followed it
 * in the same program, the verifier would walk that code once per possible
 * exit index, which is what overran its one-million-instruction budget.
 */
enum classify_prog {
    PROG_CLASSIFY_READ = 0,
    PROG_CLASSIFY_WRITE = 1,
    PROG_SCAN_HEADER_BLOCK = 2,
    PROG_FINISH_HEADERS = 3,
    PROG_SCAN_BODY = 4,
    PROG_FINISH_BODY = 5,
};
BPF_PROG_ARRAY(classifiers, 8);

static __always_inline int io_enter(s32 fd, u64 buf, u32 vlen, u16 dir, u16 is_msghdr)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_target(tgid))
        return 0;
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct conn_state *state = socks.lookup(&key);
    if (!state)
        return 0;
    struct pending_io io = {
        .ts_ns = bpf_ktime_get_ns(),
        .buf = buf,
        .conn_id = state->conn_id,
        .vlen = vlen,
        .fd = fd,
        .dir = dir,
        .is_msghdr = is_msghdr,
        .http_seen = state->http_seen,
    };
    if (pending.update(&id, &io) != 0)
        count(COUNTER_IO_UNTRACKED);
    return 0;
}

/* The last step of every chain: until a connection has carried a request
 * line its traffic is not HTTP we can use (database clients, IPC sockets),
 * so it is dropped here; otherwise the event goes to the ring buffer. */
static __always_inline int submit(struct scratch *s)
{
    struct io_event *ev = &s->ev;
    if (!s->http_seen) {
        if (ev->kind != HTTP_KIND_REQUEST) {
            count(COUNTER_IO_SKIPPED);
            return 0;
        }
        struct sock_key key = {.pid = ev->hdr.pid, .fd = ev->fd};
        struct conn_state *state = socks.lookup(&key);
        if (state)
            state->http_seen = 1;
    }
    if (ev->kind == HTTP_KIND_REQUEST)
        count(COUNTER_REQUESTS);
    return send_event(ev, sizeof(*ev));
}

static __always_inline struct scratch *get_scratch(void)
{
    u32 zero = 0;
    return scratch_area.lookup(&zero);
}

static __always_inline int io_exit(void *ctx, long ret)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct pending_io *found = pending.lookup(&id);
    if (!found)
        return 0;
    struct pending_io io = *found;
    pending.delete(&id);

    /* Non-blocking sockets: EAGAIN is a poll, not I/O. */
    if (ret == -11 /* EAGAIN */)
        return 0;
    struct scratch *s = get_scratch();
    if (!s)
        return 0;

    if (io.is_msghdr) {
        /* struct user_msghdr: msg_iov at offset 16, msg_iovlen at 24 (LP64). */
        u64 iov_ptr = 0, iov_len = 0;
        bpf_probe_read_user(&iov_ptr, sizeof(iov_ptr), (void *)(io.buf + 16));
        bpf_probe_read_user(&iov_len, sizeof(iov_len), (void *)(io.buf + 24));
        io.buf = iov_ptr;
        io.vlen = iov_len > 1024 ? 1024 : (u32)iov_len;
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
    s->http_seen = io.http_seen;
    s->n = 0;
    s->tail_in_head = 0;
    s->body_start = 0;
    s->length_at = 0;
    s->last_len = 0;

    if (ret < 0) {
        ev->kind = HTTP_KIND_ERROR;
        return submit(s);
    }
    if (ret == 0) {
        ev->kind = io.dir == DIR_READ ? HTTP_KIND_EOF : HTTP_KIND_DATA;
        return submit(s);
    }
    copy_head(s, io.buf, io.vlen, (u64)ret);
    classifiers.call(ctx, io.dir == DIR_READ ? PROG_CLASSIFY_READ : PROG_CLASSIFY_WRITE);
    /* Only reached when the tail call failed: send the unclassified event
     * rather than lose the bytes. */
    return submit(s);
}

int classify_read(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    u32 after = 0;
    u8 method = parse_method(first_bytes(s), &after);
    if (method != HTTP_METHOD_UNKNOWN && after < s->n && s->head[after & SCRATCH_MASK] == '/') {
        s->ev.kind = HTTP_KIND_REQUEST;
        s->ev.method = method;
        copy_path(s, after);
        classifiers.call(ctx, PROG_SCAN_HEADER_BLOCK);
    }
    return submit(s);
}

int classify_write(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    u64 first8 = first_bytes(s);
    if ((first8 >> 8) == (((u64)W4("HTTP") << 24) | ((u64)'/' << 16) | ((u64)'1' << 8) | '.') &&
        s->n >= 12 && s->head[8] == ' ') {
        u8 d0 = s->head[9], d1 = s->head[10], d2 = s->head[11];
        if (d0 >= '1' && d0 <= '5' && d1 >= '0' && d1 <= '9' && d2 >= '0' && d2 <= '9') {
            s->ev.kind = HTTP_KIND_RESPONSE;
            s->ev.status = (d0 - '0') * 100 + (d1 - '0') * 10 + (d2 - '0');
            classifiers.call(ctx, PROG_SCAN_HEADER_BLOCK);
            return submit(s);
        }
    }
    /* The last chunk "0\r\n\r\n" written on its own. */
    if (s->n == 5 && (first8 >> 24) == (((u64)'0' << 32) | W4("\r\n\r\n")))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
    classifiers.call(ctx, PROG_SCAN_BODY);
    return submit(s);
}

int scan_header_block(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    scan_headers(s);
    classifiers.call(ctx, PROG_FINISH_HEADERS);
    return submit(s);
}

int finish_headers(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    parse_content_length(s);
    if (s->ev.kind == HTTP_KIND_RESPONSE) {
        if (!s->body_start)
            s->body_start = s->n;   /* headers run past the window: no body in view */
        classifiers.call(ctx, PROG_SCAN_BODY);
    }
    return submit(s);
}

int scan_body(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    scan_sse(s);
    classifiers.call(ctx, PROG_FINISH_BODY);
    return submit(s);
}

int finish_body(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    scan_tail(s);
    finish_sse(s);
    return submit(s);
}

TRACEPOINT_PROBE(syscalls, sys_enter_read) { return io_enter(args->fd, (u64)args->buf, 0, DIR_READ, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_read) { return io_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_readv) { return io_enter(args->fd, (u64)args->vec, args->vlen, DIR_READ, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { return io_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) { return io_enter(args->fd, (u64)args->ubuf, 0, DIR_READ, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { return io_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) { return io_enter(args->fd, (u64)args->msg, 0, DIR_READ, 1); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { return io_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return io_enter(args->fd, (u64)args->buf, 0, DIR_WRITE, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return io_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_writev) { return io_enter(args->fd, (u64)args->vec, args->vlen, DIR_WRITE, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { return io_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { return io_enter(args->fd, (u64)args->buff, 0, DIR_WRITE, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { return io_exit(args, args->ret); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { return io_enter(args->fd, (u64)args->msg, 0, DIR_WRITE, 1); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { return io_exit(args, args->ret); }

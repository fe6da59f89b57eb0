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
/* Iovecs copied into the head: hyper (Rust) writes each chunk as three (size
 * line, data, CRLF), so two token chunks it queued and wrote at once, or a
 * token, [DONE] and the last chunk, take six or seven. */
#define MAX_IOVECS 8

/* Where the reads need no entry program (read_exit): the pending state in
 * task storage, the saved user registers readable (x86-64: the first
 * argument's register still holds it at exit), and no other probe set
 * looking for a read in flight from inside the syscall (net.bpf.c asks for
 * the entries with READS_NEED_ENTRY). */
#if defined(PENDING_IN_TASK_STORAGE) && defined(HAVE_TASK_PT_REGS) && defined(__x86_64__) && \
    !defined(READS_NEED_ENTRY)
#define READS_AT_EXIT 1
#endif

struct sock_key {
    u32 pid;
    s32 fd;
};

struct conn_state {
    u64 conn_id;
    u32 http_seen;   /* a request line was read: from now on every I/O counts */
    u32 carried;     /* 0x100 | the letter a one-byte read returned (carried_method) */
    u32 chunked;     /* its last response's headers said chunked: find_framing may apply */
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
    u32 chunked;
};

/* User-space ABI layouts (stable, unlike kernel-internal structs). */
struct user_iovec {
    u64 base;
    u64 len;
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
    u32 chunked;     /* the connection's response is chunked (conn_state) */
    u32 length_at;   /* where the Content-Length value starts, 0 if none */
    u32 type_at;     /* where the Content-Type value starts, 0 if none */
    u32 data_lines;
    u32 done;
    /* Vectored I/O: the iovecs copy_iovecs() did not reach, and the bytes the
     * syscall moved through them (find_last_iovec walks them). The first
     * may have been copied in part: iov_skip of its bytes. */
    u64 iov_next;
    u64 bytes_left;
    u32 iovs_left;
    u32 iov_skip;
    /* A write longer than the head: scan_body() goes on over the rest of it,
     * one window at a time (next_body_window). */
    u32 window_start; /* where in the write the head now starts */
    u32 windows;      /* windows scanned after the first */
    u32 more;         /* another window follows this one */
    u32 deferred;     /* a "data:" line or an NDJSON line end was left to the next window */
    /* Stream shapes beyond unnamed SSE events (line_end, sse_line): */
    u32 json_lines;     /* NDJSON line ends: '}' or ']' before the '\n' */
    u32 json_deferred;  /* an NDJSON line end was left to the next window */
    u32 json_mode;      /* windows after the first: no "data:" in the first, only scan_fields reads them */
    u32 json_done;      /* "done": true seen */
    u32 empty_events;   /* "choices":[] and "delta":{} seen: SSE events without a token */
    u32 fields_near_end; /* scan_fields ran on the first window near the write's end */
    u32 event_name_at;  /* the SSE event's "event:" line: where its name starts, + 1 */
    u32 named_events;
    u32 first_name_at;  /* this window's first such name: where (+ 1) and how long */
    u32 first_name_len;
    u32 line_room;      /* bytes a line needs in view: 12 with another window to follow, else 5 */
    /* JSON fields of this window (stream_fields.bpf.h): where a count's
     * value starts (+ 1), and the request's "model" value */
    u32 output_at;
    u32 input_at;
    u32 model_at;
    u32 model_pass;     /* request body: 0 the head, 1 the read's last bytes */
    u32 tail_read;      /* bytes of the write's end read into tail[] */
    u32 tail_pass;      /* scan_fields is reading the tail, copied into the head */
    struct user_iovec iovs[MAX_IOVECS];   /* copy_iovecs: the next iovecs, read at once */
    u64 frame_word[MAX_IOVECS];           /* find_framing: a framing buffer's bytes, 0: read it */
    u8 frame_role[MAX_IOVECS];            /* enum frame_role, for framing_chains */
};



BPF_TABLE("lru_hash", struct sock_key, struct conn_state, socks, 65536);
/* Any change to socks that a thread's cache of it (below) could miss: a
 * connection accepted or closed, or seen to carry HTTP. Each change bumps
 * the generation of its (process, fd) slot, so a busy server's accepts and
 * closes leave other fds' and other processes' cached entries valid;
 * slots are shared by hash, and a collision only costs a socks lookup.
 * Caches stamped with an older generation are ignored. User space seeds
 * socks before the targets are set (collector/loader.py), so no target
 * thread can have cached a seeded socket as untracked. */
#define SOCKS_GENERATION_SLOTS 4096
BPF_ARRAY(socks_generation, u64, SOCKS_GENERATION_SLOTS);
/* The first conn_id handed out in the kernel: lower ones are connections
 * that were open when tracing began (seeded by user space). */
BPF_ARRAY(first_new_conn_id, u64, 1);

/* The generation counter of the (process, fd) slot. */
static __always_inline u64 *socks_generation_of(u32 tgid, s32 fd)
{
    u32 slot = (tgid * 0x9E3779B1U + (u32)fd) & (SOCKS_GENERATION_SLOTS - 1);
    return socks_generation.lookup(&slot);
}

static __always_inline u64 socks_generation_now(u32 tgid, s32 fd)
{
    u64 *generation = socks_generation_of(tgid, fd);
    return generation ? *generation : 0;
}

/* Called after the change to socks, so that a cache filled from the state
 * before it carries the generation before it. */
static __always_inline void socks_changed(u32 tgid, s32 fd)
{
    u64 *generation = socks_generation_of(tgid, fd);
    if (generation)
        __sync_fetch_and_add(generation, 1);
}

/* What the exit needs of a traced syscall, written where pending_slot() or
 * recover_in_flight() keep it. */
static __always_inline void fill_pending(struct pending_io *io, u64 ts_ns, u64 buf, u32 vlen, s32 fd,
                                         u16 dir, u16 is_msghdr, struct conn_state *conn)
{
    io->ts_ns = ts_ns;
    io->buf = buf;
    io->conn_id = conn->conn_id;
    io->vlen = vlen;
    io->fd = fd;
    io->dir = dir;
    io->is_msghdr = is_msghdr;
    io->http_seen = conn->http_seen;
    io->chunked = conn->chunked;
}

/* What pending_finish() found for the exiting thread. */
enum pending_found {
    PENDING_NONE = 0,          /* no traced syscall in flight */
    PENDING_FOUND = 1,
    PENDING_THREAD_UNSEEN = 2, /* task storage only: the thread entered nothing since attach */
};

/* Per thread, from a syscall's entry to its exit.
 *
 * Where the kernel allows it (5.13+ with BTF: collector/probe_sets/sockets.py
 * decides), in task-local storage: a lookup through the task, ~10 ns, where
 * a hash update plus delete cost ~180 ns on every traced syscall
 * (benchmarks/bench_syscalls.py). The kernel frees it with the thread; an
 * entry is in flight while its ts_ns is non-zero.
 *
 * Elsewhere a plain hash, not an LRU (an LRU insert costs ~100 ns more).
 * Entries cannot pile up: the exit removes them, and the kernel runs the
 * exit tracepoint even for a thread killed inside the syscall
 * (tests/e2e/test_inflight_state.py). Should it ever be full, the syscall is
 * counted (IO_UNTRACKED) rather than silently lost. */
#ifdef PENDING_IN_TASK_STORAGE
#include <asm/ptrace.h>   /* struct pt_regs: the saved user registers (recover_in_flight) */

/* A thread's recent fds and what socks says of them. A socks lookup costs
 * ~150 ns in a busy server (two cache misses into a 65536-entry map); this
 * copy sits in the cache lines the syscall's pending state touches anyway.
 * Sixteen direct-mapped slots cover an event loop's handful of busy
 * connections; a collision or a newer generation just means a socks
 * lookup. An fd that is no tracked socket (a log file, a pipe, a client
 * connection to a backend) is cached as such too: a server writing a log
 * line per request would otherwise pay the lookup on every line. A hit
 * skips socks, so its LRU does not see the use: when full (65536 live
 * connections) it may evict a busy one, whose cached copy then serves on
 * until close(), which bumps the slot whether or not socks still has it. */
#define CONN_CACHE_SLOTS 16
struct cached_conn {
    u64 conn_id;
    u64 generation;
    s32 fd;
    u32 http_seen;
    u32 chunked;
    u32 filled;
    u32 tracked;     /* 0: socks has no entry for this fd */
};

struct thread_io {
    struct pending_io io;   /* first: pending_slot() hands out &thread->io */
    struct cached_conn conns[CONN_CACHE_SLOTS];
};
BPF_TASK_STORAGE(pending_task, struct thread_io);

/* Where io_enter builds the syscall's pending state: in place. */
static __always_inline struct pending_io *pending_slot(u64 id)
{
    struct thread_io *thread = pending_task.task_storage_get(bpf_get_current_task_btf(), 0,
                                                             BPF_LOCAL_STORAGE_GET_F_CREATE);
    return thread ? &thread->io : 0;
}

static __always_inline void pending_commit(u64 id, struct pending_io *slot) {}

static __always_inline int lookup_conn(struct pending_io *slot, u32 tgid, s32 fd,
                                       struct conn_state *out)
{
    struct thread_io *thread = (struct thread_io *)slot;
    /* Read before socks: a change after this point leaves the copy stale
     * under a generation that no longer matches. */
    u64 generation = socks_generation_now(tgid, fd);
    struct cached_conn *cached = &thread->conns[(u32)fd & (CONN_CACHE_SLOTS - 1)];
    if (cached->filled && cached->fd == fd && cached->generation == generation) {
        out->conn_id = cached->conn_id;
        out->http_seen = cached->http_seen;
        out->chunked = cached->chunked;
        return cached->tracked;
    }
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct conn_state *state = socks.lookup(&key);
    cached->generation = generation;
    cached->fd = fd;
    cached->filled = 1;
    cached->tracked = state != 0;
    if (!state)
        return 0;
    *out = *state;
    cached->conn_id = out->conn_id;
    cached->http_seen = out->http_seen;
    cached->chunked = out->chunked;
    return 1;
}

static __always_inline int pending_finish(u64 id, struct pending_io *io)
{
    struct pending_io *slot = pending_task.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    if (!slot)
        return PENDING_THREAD_UNSEEN;
    if (!slot->ts_ns)
        return PENDING_NONE;
    *io = *slot;
    slot->ts_ns = 0;
    return PENDING_FOUND;
}

/* A socket syscall the thread was already inside when tracing began (an
 * idle server blocked in recv() at attach): its entry was never seen, and
 * without this its request would be missing. Every traced syscall a target
 * thread enters creates its storage, so a thread without any is in one
 * that began earlier. The arguments are still in the thread's saved user
 * registers (the architecture's syscall ABI, read as uprobes read theirs);
 * the start is unknown, so io->ts_ns stays 0 and io_exit uses the exit
 * time and flags the event. Taken at most once per thread: it creates the
 * storage. x86-64 and Linux 5.15+ only (HAVE_TASK_PT_REGS, set by
 * collector/probe_sets/sockets.py): elsewhere the first argument's register
 * already holds the return value at exit. */
static __always_inline int recover_in_flight(u64 id, struct pending_io *io, u16 dir,
                                             u16 vectored, u16 is_msghdr)
{
#if defined(HAVE_TASK_PT_REGS) && defined(__x86_64__)
    u32 tgid = id >> 32;   /* a target: io_exit checked */
    struct task_struct *task = bpf_get_current_task_btf();
    struct thread_io *thread = pending_task.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!thread)
        return 0;
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    s32 fd = (s32)regs->di;
    struct conn_state state;
    if (!lookup_conn(&thread->io, tgid, fd, &state))
        return 0;
    /* Begun before attach, so on a connection open then (seeded by user
     * space, ids below first_new_conn_id). A newer one on this fd means the
     * fd was closed and reused while the thread sat on the old socket. */
    u32 zero = 0;
    u64 *first_new = first_new_conn_id.lookup(&zero);
    if (!first_new || state.conn_id >= *first_new)
        return 0;
    fill_pending(io, 0, regs->si, vectored ? (u32)regs->dx : 0, fd, dir, is_msghdr, &state);
    return 1;
#else
    return 0;
#endif
}

/* The thread's syscall in flight, left in place (net.bpf.c reads it). */
static __always_inline struct pending_io *pending_peek(u64 id)
{
    struct pending_io *slot = pending_task.task_storage_get(bpf_get_current_task_btf(), 0, 0);
    return slot && slot->ts_ns ? slot : 0;
}
#else
BPF_HASH(pending, u64, struct pending_io, 16384);
BPF_PERCPU_ARRAY(pending_staging, struct pending_io, 1);

/* Where io_enter builds the syscall's pending state: a per-CPU draft that
 * pending_commit() copies into the hash. */
static __always_inline struct pending_io *pending_slot(u64 id)
{
    u32 zero = 0;
    return pending_staging.lookup(&zero);
}

static __always_inline void pending_commit(u64 id, struct pending_io *slot)
{
    if (pending.update(&id, slot) != 0)
        count(COUNTER_IO_UNTRACKED);
}

static __always_inline int lookup_conn(struct pending_io *slot, u32 tgid, s32 fd,
                                       struct conn_state *out)
{
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct conn_state *state = socks.lookup(&key);
    if (!state)
        return 0;
    *out = *state;
    return 1;
}

static __always_inline int pending_finish(u64 id, struct pending_io *io)
{
    struct pending_io *found = pending.lookup(&id);
    if (!found)
        return PENDING_NONE;
    *io = *found;
    pending.delete(&id);
    return PENDING_FOUND;
}

/* The hash cannot tell a thread never seen from one between syscalls, so a
 * syscall already under way at attach stays unrecorded in this mode. */
static __always_inline int recover_in_flight(u64 id, struct pending_io *io, u16 dir,
                                             u16 vectored, u16 is_msghdr)
{
    return 0;
}

static __always_inline struct pending_io *pending_peek(u64 id)
{
    return pending.lookup(&id);
}
#endif
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
    socks_changed(key.pid, key.fd);

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
    if (!state) {
        /* A thread may still have it cached as a connection: socks is an
         * LRU and may have evicted the entry. The fd's next life must not
         * inherit that copy. */
        socks_changed(tgid, key.fd);
        return 0;
    }
    u64 conn_id = state->conn_id;
    u32 http_seen = state->http_seen;
    socks.delete(&key);
    socks_changed(tgid, key.fd);
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
 * The scanners read the copied head eight bytes at a time and only look
 * closer at words holding a '\n': everything they look for sits at the
 * start or the end of a line (header names and values, SSE "data:" fields,
 * the blank line ending the headers). A token chunk's JSON has a newline or
 * two in a hundred bytes or more, so most words cost a load and four ALU
 * operations instead of a branch per byte; that was most of the time spent
 * in these programs (benchmarks/bench_syscalls.py --kernel-only).
 *
 * Comparisons fold ASCII case by OR-ing 0x20 into the letter positions of a
 * pattern only: x | 0x20 equals a lower-case letter exactly when x is that
 * letter in either case, so the fold admits nothing else.
 */

/* Little-endian constants: byte i of the literal in bits 8i..8i+7, which is
 * what an 8-byte load from the buffer gives. */
#define LE_BYTE(s, i) ((u64)(u8)(s)[i] << (8 * (i)))
#define LE8(s) (LE_BYTE(s, 0) | LE_BYTE(s, 1) | LE_BYTE(s, 2) | LE_BYTE(s, 3) | \
                LE_BYTE(s, 4) | LE_BYTE(s, 5) | LE_BYTE(s, 6) | LE_BYTE(s, 7))
#define LOW_BYTES(n) ((n) >= 8 ? ~0ULL : ((1ULL << (8 * (n))) - 1))
#define IS_LOWER(c) ((c) >= 'a' && (c) <= 'z')
#define FOLD_BYTE(s, i) ((u64)(IS_LOWER((s)[i]) ? 0x20 : 0) << (8 * (i)))
#define FOLD8(s) (FOLD_BYTE(s, 0) | FOLD_BYTE(s, 1) | FOLD_BYTE(s, 2) | FOLD_BYTE(s, 3) | \
                  FOLD_BYTE(s, 4) | FOLD_BYTE(s, 5) | FOLD_BYTE(s, 6) | FOLD_BYTE(s, 7))
/* The first n bytes of word w equal the (lower-case) literal, in any case. */
#define MATCHES(w, lit, n) ((((w) | FOLD8(lit "\0\0\0\0\0\0\0")) & LOW_BYTES(n)) == \
                            (LE8(lit "\0\0\0\0\0\0\0") & LOW_BYTES(n)))

/* The first n bytes of word w equal the literal exactly (case-sensitive). */
#define EQUALS(w, lit, n) (((w) & LOW_BYTES(n)) == (LE8(lit "\0\0\0\0\0\0\0") & LOW_BYTES(n)))

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Eight bytes of the head from `at` (any alignment: x86-64 and arm64 load
 * unaligned words natively, and the verifier allows it there). Every caller
 * has at < SCAN_HEAD_BYTES; the mask proves to the verifier that the load
 * stays inside the scratch area. */
static __always_inline u64 load8(const u8 *head, u32 at)
{
    return *(const u64 *)&head[at & (SCAN_HEAD_BYTES - 1)];
}

/* The same for the tail buffer (at < SCAN_TAIL_BYTES). */
static __always_inline u64 load8_tail(const u8 *tail, u32 at)
{
    return *(const u64 *)&tail[at & (SCAN_TAIL_BYTES - 1)];
}

/* What the scanners find goes to the scratch map at once: left to itself
 * the compiler keeps flags and counts in registers across the unrolled
 * positions of a word, and then every combination of found/not found is a
 * different state to the verifier, which never gets to the end. */
static __always_inline void stay_in_memory(void)
{
    asm volatile("" ::: "memory");
}

/* The newlines of the 8 bytes at `base` that lie in [from, n): one bit (the
 * byte's high bit) per '\n', exact (no borrow between bytes). Computing the
 * bounds here as a mask leaves one branch per position to the verifier. */
static __always_inline u64 bytes_equal(u64 w, u8 c)
{
    u64 x = w ^ (ONES * c);
    return ~(((x & ~HIGHS) + ~HIGHS) | x) & HIGHS;
}

/* Keeps the bits of `mask` (one per byte of the word at `base`) that lie in [from, n). */
static __always_inline u64 within(u64 mask, u32 base, u32 from, u32 n)
{
    u32 left = n - base;   /* callers have base < n */
    if (left < 8)
        mask &= (1ULL << (8 * left)) - 1;
    if (from > base)
        mask &= ~((1ULL << (8 * ((from - base) & 7))) - 1);
    return mask;
}

static __always_inline u64 newlines(const u8 *head, u32 base, u32 from, u32 n)
{
    return within(bytes_equal(load8(head, base), '\n'), base, from, n);
}

/* A Content-Type value starting at v: text/event-stream, with or without
 * parameters ("; charset=utf-8"). */
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
    if (q + 16 <= n && MATCHES(load8(s->head, q), "\ncontent", 8)) {
        u64 rest = load8(s->head, q + 8);
        if (MATCHES(rest, "-length:", 8))
            s->length_at = q + 16;
        else if (MATCHES(rest, "-type:", 6))
            s->type_at = q + 14;   /* read once after the scan: fewer branches per line */
    }
    return 0;
}

/* Header block: sets s->body_start (0 when the headers run past the
 * window), the header flags and where a Content-Length value starts. */
static __always_inline void scan_headers(struct scratch *s)
{
    u32 n = s->n;
    for (u32 base = 0; base < SCAN_HEAD_BYTES; base += 8) {
        if (base >= n)
            break;
        u64 found = newlines(s->head, base, 0, n);
        if (!found)
            continue;
#pragma unroll
        for (u32 b = 0; b < 8; b++) {
            if ((found & (0x80ULL << (8 * b))) && header_newline(s, base + b))
                return;
            stay_in_memory();
        }
    }
}

/* The Content-Length value noted by scan_headers(). Runs in its own program:
 * see the chain above classify_read(). */
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
    if (!s->length_at)
        return;
    u64 value = read_decimal(s, s->length_at, &digits);
    if (digits) {
        s->ev.content_length = (s64)value;
        s->ev.flags |= HTTP_FLAG_HAS_LENGTH;
    }
}

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
    u32 first = start & ~7U;
    for (u32 word = 0; word < SCAN_HEAD_BYTES / 8; word++) {
        u32 base = first + word * 8;
        if (base >= n)
            break;
        u64 found = newlines(s->head, base, start, n);
        if (!found)
            continue;
#pragma unroll
        for (u32 b = 0; b < 8; b++) {
            if (found & (0x80ULL << (8 * b)))
                sse_line(s, base + b + 1);
            stay_in_memory();
        }
    }
}

#include "stream_fields.bpf.h"

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

#define CHUNKED_END "\r\n0\r\n\r\n"   /* the empty last chunk after the previous one's CRLF */

/* How a write ends, for a chunked body whose end comes in pieces (cpp-httplib,
 * llama.cpp's server: the last data chunk, then "0\r\n", then "\r\n"; or the
 * last data chunk and "0\r\n" in one write, then trailers and the blank line):
 * "\r\n0\r\n" is the last chunk's line after a chunk, "\r\n\r\n" an empty line.
 * The session decides with the response's state (collector/sessionizer.py).
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

/* A vectored write's end can lie past the iovecs copy_iovecs() read: more
 * than MAX_IOVECS of them, or a head filled by the first. Walk the rest of
 * the array, without copying, to the buffer holding the last byte moved, so
 * that the tail is that buffer's end. Past IOV_WALK_MAX iovecs there is no
 * tail rather than a wrong one. */
#define IOV_WALK_MAX 64

/* Reads the iovec at `at` and takes what the syscall moved through it past
 * its first `skip` bytes, at most `remaining`: a buffer that took bytes
 * becomes the last one touched (an empty one leaves the one before).
 * Returns the bytes taken. */
static __always_inline u64 take_iovec(struct scratch *s, u64 at, u64 skip, u64 remaining,
                                      struct user_iovec *iov)
{
    bpf_probe_read_user(iov, sizeof(*iov), (void *)at);
    u64 avail = iov->len > skip ? iov->len - skip : 0;
    u64 take = avail < remaining ? avail : remaining;
    if (take) {
        s->last_base = iov->base;
        s->last_len = skip + take;
    }
    return take;
}

static __always_inline void find_last_iovec(struct scratch *s)
{
    u64 remaining = s->bytes_left;
    u64 next = s->iov_next;
    u32 left = s->iovs_left;
    if (!remaining)
        return;
    for (u32 k = 0; k < IOV_WALK_MAX; k++) {
        if (k >= left || !remaining)
            break;
        struct user_iovec iov = {};
        u64 take = take_iovec(s, next + k * sizeof(iov), k ? 0 : s->iov_skip, remaining, &iov);
        if (take)
            s->tail_in_head = 0;
        remaining -= take;
    }
    if (remaining)
        s->last_len = 0;
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
#pragma unroll
    for (u32 k = 0; k + 6 <= SCAN_TAIL_BYTES; k++) {
        if (k + 6 <= t && MATCHES(load8_tail(s->tail, k), "[done]", 6))
            s->done |= tail_is_new << 1;   /* bit 1: seen in the tail only */
    }
    if (t >= 7 && MATCHES(load8_tail(s->tail, t - 7), CHUNKED_END, 7))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
    /* The last chunk as a buffer of its own at the end of a vectored write
     * (Node.js writes it so): its CRLF before is in another iovec. */
    if (len == 5 && MATCHES(load8_tail(s->tail, 0), "0\r\n\r\n", 5))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
    if (tail_is_new)
        s->json_lines += json_line_at_end(s, s->tail, t);
}

/* The word starts with the literal, compared as sent (methods and "HTTP/"
 * are case-sensitive). */
#define STARTS(w, lit) (((w) & LOW_BYTES(sizeof(lit) - 1)) == \
                        (LE8(lit "\0\0\0\0\0\0\0") & LOW_BYTES(sizeof(lit) - 1)))

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

/* The first 8 bytes, zero past what was copied. */
static __always_inline u64 first_bytes(struct scratch *s)
{
    u32 n = s->n;
    u64 w = load8(s->head, 0);
    return n >= 8 ? w : w & ((1ULL << (8 * n)) - 1);
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

/* Copies up to SCAN_HEAD_BYTES of a plain buffer into the scratch head, and
 * remembers it as the last buffer touched, for the tail scan. */
static __always_inline void copy_buffer(struct scratch *s, u64 buf, u64 moved)
{
    u32 n = moved > SCAN_HEAD_BYTES ? SCAN_HEAD_BYTES : (u32)moved;
    if (n > 0 && n <= SCAN_HEAD_BYTES)
        bpf_probe_read_user(s->head, n, (void *)buf);
    s->n = n;
    s->last_base = buf;
    s->last_len = moved;
    s->tail_in_head = moved == n;
    s->bytes_left = 0;
    s->more = moved > n;
}

/* Chunk framing known from the iovec lengths alone. A server that frames
 * its chunks itself hands each piece of the framing to writev() or
 * sendmsg() as a buffer of its own:
 *   Node's http module: [size, "\r\n", payload, "\r\n"]
 *   hyper, asyncio's writelines(), h11: [size "\r\n", payload, "\r\n"]
 * and a helper call costs ~70 ns here whatever it copies, so reading those
 * 2-byte buffers was most of what a Node token chunk cost. Where the
 * lengths fit that pattern exactly (the size buffer as long as the
 * payload's length in hex, with or without its CRLF; the CRLFs two bytes),
 * the framing is written into the head as the server must have written it
 * (the size in lowercase hex: only its length matters to the scans, and no
 * hex digit starts a field they look for) and only the payload is read.
 * They must also chain from the first iovec (framing_chains), on a
 * connection whose response headers said chunked (remember_chunked). Any
 * other shape is read byte for byte. */
static __always_inline u32 hex_digits(u64 len)
{
    return len < 0x10 ? 1 : len < 0x100 ? 2 : len < 0x1000 ? 3 : len < 0x10000 ? 4 : 0;
}

#define CRLF_WORD 0x0a0dULL   /* "\r\n" as the little-endian bytes of a word */

/* `len` in `digits` lowercase hex digits, as the bytes of a word. No
 * branch: the verifier follows each one per iovec of the unrolled loop. */
static __always_inline u64 hex_word(u64 len, u32 digits)
{
    u64 word = 0;
#pragma unroll
    for (u32 j = 0; j < 4; j++) {
        u64 nibble = (len >> (4 * (3 - j))) & 0xf;
        word |= (nibble + '0' + 39 * ((nibble + 6) >> 4)) << (8 * j);   /* 10-15: 'a'-'f' */
    }
    return word >> (8 * ((4 - digits) & 3));   /* the last `digits` of four */
}

enum frame_role { ROLE_PAYLOAD = 0, ROLE_CRLF = 1, ROLE_SIZE = 2, ROLE_SIZE_CRLF = 3 };
enum frame_expect { EXPECT_SIZE = 0, EXPECT_CRLF_AFTER_SIZE, EXPECT_PAYLOAD, EXPECT_CRLF_AFTER_PAYLOAD };

/* Marks each of the first `count` iovecs of s->iovs that fits a framing
 * role by its length and its neighbours' (s->frame_role, s->frame_word:
 * the bytes it must hold). Every k is tried, the CRLFs of the chunk before
 * too (a CRLF never fits as a size: its payload would have to be 16-255
 * bytes with two more 2-byte buffers after it). No early exit: with one,
 * or a `continue`, clang rolled the loop back up and the verifier lost its
 * bound. */
static __always_inline void mark_framing(struct scratch *s, u32 count)
{
    __builtin_memset(s->frame_word, 0, sizeof(s->frame_word));
    __builtin_memset(s->frame_role, 0, sizeof(s->frame_role));
#pragma unroll
    for (u32 k = 0; k + 2 < MAX_IOVECS; k++) {
        u64 size_len = s->iovs[k].len, next = s->iovs[k + 1].len, after = s->iovs[k + 2].len;
        u32 four = k + 3 < count && k + 3 < MAX_IOVECS;
        if (k + 2 < count && four && next == 2 && after && size_len == hex_digits(after) &&
            s->iovs[(k + 3) & (MAX_IOVECS - 1)].len == 2) {
            s->frame_role[k] = ROLE_SIZE;
            s->frame_word[k] = hex_word(after, size_len);
            s->frame_role[k + 1] = ROLE_CRLF;
            s->frame_word[k + 1] = CRLF_WORD;
            s->frame_role[(k + 3) & (MAX_IOVECS - 1)] = ROLE_CRLF;
            s->frame_word[(k + 3) & (MAX_IOVECS - 1)] = CRLF_WORD;
        } else if (k + 2 < count && next && after == 2 && size_len == hex_digits(next) + 2) {
            s->frame_role[k] = ROLE_SIZE_CRLF;
            s->frame_word[k] = hex_word(next, size_len - 2) | (CRLF_WORD << (8 * ((size_len - 2) & 3)));
            s->frame_role[k + 2] = ROLE_CRLF;
            s->frame_word[k + 2] = CRLF_WORD;
        }
        stay_in_memory();
    }
}

/* The roles must chain from the first iovec: chunk after chunk, each a
 * size (with or without its CRLF), its payload, a CRLF, and at most one
 * buffer after the last chunk that is read (Node's "0\r\n\r\n"). The
 * chunks may run on past the iovecs looked at (`more`). Anything else, such
 * as a body split into arbitrary pieces whose lengths happen to fit at
 * some k, is read byte for byte. */
static __always_inline int framing_chains(struct scratch *s, u32 count, u32 more)
{
    u32 expect = EXPECT_SIZE, broken = 0;
#pragma unroll
    for (u32 k = 0; k < MAX_IOVECS; k++) {
        if (k < count) {
            u8 role = s->frame_role[k];
            if (expect == EXPECT_SIZE) {
                if (role == ROLE_SIZE)
                    expect = EXPECT_CRLF_AFTER_SIZE;
                else if (role == ROLE_SIZE_CRLF)
                    expect = EXPECT_PAYLOAD;
                else if (role != ROLE_PAYLOAD || k + 1 != count || more)
                    broken = 1;
            } else if (expect == EXPECT_CRLF_AFTER_SIZE) {
                broken |= role != ROLE_CRLF;
                expect = EXPECT_PAYLOAD;
            } else if (expect == EXPECT_PAYLOAD) {
                broken |= role != ROLE_PAYLOAD;
                expect = EXPECT_CRLF_AFTER_PAYLOAD;
            } else {
                broken |= role != ROLE_CRLF;
                expect = EXPECT_SIZE;
            }
        }
    }
    return !broken && (expect == EXPECT_SIZE || more);
}

/* The framing buffers of the first `count` iovecs, when they chain
 * (s->frame_word: 0 for every buffer to read). */
static __always_inline void find_framing(struct scratch *s, u32 count, u32 more)
{
    mark_framing(s, count);
    if (!framing_chains(s, count, more))
        __builtin_memset(s->frame_word, 0, sizeof(s->frame_word));
}

/* Vectored I/O: concatenates up to MAX_IOVECS iovecs not yet copied
 * (s->iov_next, s->iovs_left, s->bytes_left) into the head from `at` up to
 * SCAN_HEAD_BYTES, and leaves those fields describing the rest: for the next
 * window, or for find_last_iovec(). An iovec the head fills stays next, with
 * s->iov_skip of its bytes copied; `resume` (a constant: the first window
 * has nothing to resume, and its program verifies faster without) starts
 * past them. Remembers the last buffer touched for the tail scan.
 *
 * The iovec array is read in one bpf_probe_read_user(), not one per iovec:
 * each call costs ~40 ns here whatever its size (Node's 4-iovec chunk went
 * from 964 to 845 ns in its exit program, benchmarks/bench_syscalls.py). */
static __always_inline void copy_iovecs(struct scratch *s, u32 at, int resume)
{
    u64 buf = s->iov_next, remaining = s->bytes_left;
    u32 vlen = s->iovs_left;
    u64 first_skip = resume ? s->iov_skip : 0;
    u32 copied = at;
    u32 walked = 0;
    s->tail_in_head = 0;
    s->iov_skip = 0;
    /* The kernel has just read these for the syscall: they are mapped, and a
     * failed read (never seen) copies nothing rather than garbage. */
    u32 count = vlen < MAX_IOVECS ? vlen : MAX_IOVECS;
    u64 array_bytes = (u64)count * sizeof(struct user_iovec);
    asm volatile("" : "+r"(array_bytes));
    if (array_bytes > sizeof(s->iovs))
        array_bytes = sizeof(s->iovs);
    if (array_bytes == 0 || bpf_probe_read_user(s->iovs, array_bytes, (void *)buf) != 0)
        count = 0;
    if (s->chunked)
        find_framing(s, count, vlen > count);
    else
        __builtin_memset(s->frame_word, 0, sizeof(s->frame_word));
#pragma unroll
    for (int k = 0; k < MAX_IOVECS; k++) {
        if (k >= count || remaining == 0 || copied >= SCAN_HEAD_BYTES)
            break;
        u64 skip = k == 0 ? first_skip : 0;
        struct user_iovec iov = s->iovs[k & (MAX_IOVECS - 1)];
        u64 avail = iov.len > skip ? iov.len - skip : 0;
        u64 take = avail < remaining ? avail : remaining;
        walked = k + 1;
        if (take == 0)
            continue;   /* an empty iovec: nothing to copy */
        s->last_base = iov.base;
        s->last_len = skip + take;
        u32 room = SCAN_HEAD_BYTES - copied;
        u32 n = take > room ? room : (u32)take;
        u64 off = copied, size = n;
        /* Hide what the compiler knows so that the checks stay in the code
         * as written: the verifier needs them to bound off + size. */
        asm volatile("" : "+r"(off), "+r"(size));
        off &= SCAN_HEAD_BYTES - 1;
        if (size > SCAN_HEAD_BYTES)
            size = SCAN_HEAD_BYTES;
        u64 frame = s->frame_word[k & (MAX_IOVECS - 1)];
        if (frame)   /* one store; bytes past `size` are overwritten next, or lie past s->n */
            *(u64 *)&s->head[off] = frame >> (8 * (skip & 7));
        else if (size > 0)
            bpf_probe_read_user(&s->head[off], size, (void *)(iov.base + skip));
        copied += n;
        remaining -= n;
        s->tail_in_head = n == take;
        if (n < take) {
            s->iov_skip = skip + n;   /* the head is full inside this iovec: it comes next */
            walked = k;
            break;
        }
    }
    s->n = copied;
    s->iov_next = buf + walked * sizeof(struct user_iovec);
    s->iovs_left = vlen - walked;
    s->bytes_left = remaining;
}

/* Moves the head to the next window of a long write: the last
 * WINDOW_OVERLAP bytes of this one, then what follows them in the write (a
 * plain buffer's next bytes, or the next iovecs'). Returns 0 when this
 * window was the last to scan. A write longer than the windows counts the
 * lines in them; its end is still read as a tail (scan_tail). */
static __always_inline int next_body_window(struct scratch *s)
{
    if (!s->more)
        return 0;
    u32 n = s->n;   /* >= WINDOW_OVERLAP: a shorter window sets no `more` */
#pragma unroll
    for (u32 k = 0; k < WINDOW_OVERLAP; k += 8) {
        u64 carried = load8(s->head, n - WINDOW_OVERLAP + k);
        *(u64 *)&s->head[k] = carried;
    }
    s->window_start += n - WINDOW_OVERLAP;
    s->windows++;
    /* An "event:" line whose data line is in the next window: its name moves
     * with the bytes (one cut before the overlap is lost, and its data counts
     * as unnamed). */
    u32 name_at = s->event_name_at;
    s->event_name_at = name_at > n - WINDOW_OVERLAP ? name_at - (n - WINDOW_OVERLAP) : 0;
    /* Newlines from here: lines starting at or after WINDOW_OVERLAP - 11,
     * which the window before could not see whole ("data: [DONE]"). */
    s->body_start = WINDOW_OVERLAP - 12;
    if (s->ev.flags & HTTP_FLAG_VECTORED)
        return 1;   /* gather_window fills the rest of the window */
    /* A plain buffer is its own last buffer (copy_buffer): last_base and
     * last_len are the whole write. */
    u64 at = (u64)s->window_start + WINDOW_OVERLAP;   /* the first byte not yet in a window */
    u64 rest = s->last_len - at;
    u32 fresh = rest > SCAN_HEAD_BYTES - WINDOW_OVERLAP ? SCAN_HEAD_BYTES - WINDOW_OVERLAP : (u32)rest;
    if (fresh > 0 && fresh <= SCAN_HEAD_BYTES - WINDOW_OVERLAP)
        bpf_probe_read_user(&s->head[WINDOW_OVERLAP], fresh, (void *)(s->last_base + at));
    s->n = WINDOW_OVERLAP + fresh;
    s->tail_in_head = rest == fresh;   /* the end of the write is in view */
    s->more = rest > fresh && s->windows < MAX_BODY_WINDOWS;
    return 1;
}

/* ---------------------------------------------------------------- read / write
 *
 * Entry stores the arguments per thread. Exit fills the event in per-CPU
 * scratch and hands it down a short chain of tail calls (a few ns each), so
 * that each program verifies on its own:
 *   sys_exit_* [-> gather_iovecs] -> classify_read  -> scan_header_block -> submit
 *                                 -> classify_write -> scan_header_block -> scan_body -> submit
 *                                                   -> scan_body (no status line) -> submit
 * Code after a scan loop is walked by the verifier once per way out of the
 * loop, so what follows the loops is kept small; and each scan is its own
 * program because verifying one costs ~0.1 s of start-up (inlined into
 * classify_write, the body scan made that one program take a second). The
 * iovec copy is a program of its own for the same reason: inlined, its loop
 * was verified in each of the eight exit programs, and eight iovecs instead
 * of four took start-up from 1.5 to 2.8 s.
 */
enum classify_prog {
    PROG_CLASSIFY_READ = 0,
    PROG_CLASSIFY_WRITE = 1,
    PROG_SCAN_HEADER_BLOCK = 2,
    PROG_SCAN_BODY = 3,
    PROG_GATHER_IOVECS = 4,
    PROG_GATHER_WINDOW = 5,
    PROG_SCAN_FIELDS = 6,
};
BPF_PROG_ARRAY(classifiers, 7);

static __always_inline int io_enter(s32 fd, u64 buf, u32 vlen, u16 dir, u16 is_msghdr)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_target(tgid))
        return 0;
    struct pending_io *io = pending_slot(id);
    if (!io) {
        count(COUNTER_IO_UNTRACKED);
        return 0;
    }
    struct conn_state state;
    if (!lookup_conn(io, tgid, fd, &state)) {
        io->ts_ns = 0;   /* nothing in flight, whatever an earlier syscall left */
        return 0;
    }
    fill_pending(io, bpf_ktime_get_ns(), buf, vlen, fd, dir, is_msghdr, &state);
    pending_commit(id, io);
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
        if (state) {
            state->http_seen = 1;
            socks_changed(key.pid, key.fd);
        }
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

static __always_inline int classify_io(void *ctx, u64 id, struct pending_io io, long ret, u64 now);

static __always_inline int io_exit(void *ctx, long ret, u16 dir, u16 vectored, u16 is_msghdr)
{
    u64 id = bpf_get_current_pid_tgid();
    /* Most syscalls on a host are not the targets': the array lookup the JIT
     * inlines turns them away before the task-storage helper call. */
    if (!is_target(id >> 32))
        return 0;
    struct pending_io io;
    int found = pending_finish(id, &io);
    /* Non-blocking sockets: EAGAIN is a poll, not I/O. (After the pending
     * entry is taken, so that none is left behind.) */
    if (found == PENDING_NONE || ret == -11 /* EAGAIN */)
        return 0;
    if (found == PENDING_THREAD_UNSEEN && (ret <= 0 || !recover_in_flight(id, &io, dir, vectored, is_msghdr)))
        return 0;
    /* Only now: this exit runs for every read and write on the host, and
     * the clock costs more than the lookup that turns most of them away. */
    return classify_io(ctx, id, io, ret, bpf_ktime_get_ns());
}

/* Reads at their exit only, where the kernel lets a program read the
 * thread's saved user registers (READS_AT_EXIT, set above). A read's entry
 * tells nothing its exit cannot: a request's ingress is when its read
 * returned, and the arguments are still in those registers (the syscall
 * ABI, as recover_in_flight reads them). So the read syscalls get no entry
 * program: one program run less on every read of every process on the
 * host, which is most of what a process nobody traces pays (a load client
 * reads ten times per request). Writes keep theirs: a token's time is when
 * its write began, ~8 us before a loopback write returns. */
static __always_inline int read_exit(void *ctx, long ret, u16 vectored, u16 is_msghdr)
{
#ifdef READS_AT_EXIT
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (ret == -11 /* EAGAIN */ || !is_target(tgid))
        return 0;
    struct task_struct *task = bpf_get_current_task_btf();
    struct thread_io *thread = pending_task.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!thread) {
        count(COUNTER_IO_UNTRACKED);
        return 0;
    }
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    s32 fd = (s32)regs->di;
    struct conn_state state;
    if (!lookup_conn(&thread->io, tgid, fd, &state))
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct pending_io io;
    fill_pending(&io, now, regs->si, vectored ? (u32)regs->dx : 0, fd, DIR_READ, is_msghdr, &state);
    return classify_io(ctx, id, io, ret, now);
#else
    return io_exit(ctx, ret, DIR_READ, vectored, is_msghdr);
#endif
}

/* The event of a traced syscall that moved bytes (or failed), classified by
 * the tail-call chain below. */
static __always_inline int classify_io(void *ctx, u64 id, struct pending_io io, long ret, u64 now)
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
    s->http_seen = io.http_seen;
    s->chunked = io.chunked;
    s->n = 0;
    s->tail_in_head = 0;
    s->window_start = 0;
    s->windows = 0;
    s->more = 0;
    s->body_start = 0;
    s->length_at = 0;
    s->type_at = 0;
    s->last_len = 0;
    s->output_at = 0;
    s->input_at = 0;
    s->model_at = 0;
    s->model_pass = 0;
    s->tail_read = 0;
    s->tail_pass = 0;
    s->json_mode = 0;
    s->json_lines = 0;
    s->json_deferred = 0;
    s->json_done = 0;
    s->empty_events = 0;
    s->fields_near_end = 0;
    s->named_events = 0;
    s->head[SCRATCH_BYTES - 1] = 0;   /* what a line end at 0 finds before it (stream_fields.bpf.h) */

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
        classifiers.call(ctx, PROG_GATHER_IOVECS);
    } else {
        copy_buffer(s, io.buf, (u64)ret);
        classifiers.call(ctx, io.dir == DIR_READ ? PROG_CLASSIFY_READ : PROG_CLASSIFY_WRITE);
    }
    /* Only reached when the tail call failed: send the unclassified event
     * rather than lose the bytes. */
    return submit(s);
}

/* The end of a body write: its last bytes, the SSE counts, the event. */
static __always_inline int finish_body(void *ctx, struct scratch *s)
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
        classifiers.call(ctx, PROG_SCAN_FIELDS);
    }
    return submit(s);
}

int gather_iovecs(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    copy_iovecs(s, 0, 0);
    /* A window of fewer bytes than the overlap cannot carry one over. */
    s->more = s->bytes_left && s->n >= WINDOW_OVERLAP;
    classifiers.call(ctx, s->ev.hdr.type == EVENT_SOCK_READ ? PROG_CLASSIFY_READ : PROG_CLASSIFY_WRITE);
    return submit(s);
}

/* A further window of a long vectored write: the iovecs after the bytes
 * next_body_window() carried over, then back to scan_body. A program of its
 * own, with the offset a constant: copy_iovecs() with a variable one, and
 * resuming, in one program took the verifier three times as long. */
int gather_window(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    copy_iovecs(s, WINDOW_OVERLAP, 1);
    s->more = s->bytes_left && s->windows < MAX_VECTORED_WINDOWS;
    classifiers.call(ctx, s->json_mode ? PROG_SCAN_FIELDS : PROG_SCAN_BODY);
    return finish_body(ctx, s);
}

/* Go's net/http reads one byte in the background while a handler runs, to
 * see the client go away; a keep-alive request that arrives then loses its
 * first byte to that read, and the read of its request line starts one byte
 * in ("OST /v1/..."). So a read that returns one letter on an HTTP
 * connection is kept in the connection's entry, and the next read is parsed
 * with it in front. Only reads that are no request line pay the lookup. */
static __always_inline u8 carried_method(struct scratch *s, u64 first8, u32 *after)
{
    struct sock_key key = {.pid = s->ev.hdr.pid, .fd = s->ev.fd};
    struct conn_state *state = socks.lookup(&key);
    if (!state)
        return HTTP_METHOD_UNKNOWN;
    u32 carried = state->carried;
    u8 c = s->head[0];
    state->carried = s->n == 1 && c >= 'A' && c <= 'Z' ? 0x100 | c : 0;
    if (!carried || s->n < 8)
        return HTTP_METHOD_UNKNOWN;
    u32 at = 0;
    u8 method = parse_method((first8 << 8) | (carried & 0xff), &at);
    if (method == HTTP_METHOD_UNKNOWN || at == 0)
        return HTTP_METHOD_UNKNOWN;
    *after = at - 1;
    return method;
}

int classify_read(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    u32 after = 0;
    u64 first8 = first_bytes(s);
    u8 method = parse_method(first8, &after);
    if (method == HTTP_METHOD_UNKNOWN && s->http_seen)
        method = carried_method(s, first8, &after);
    if (method != HTTP_METHOD_UNKNOWN && after < s->n && s->head[after & SCRATCH_MASK] == '/') {
        s->ev.kind = HTTP_KIND_REQUEST;
        s->ev.method = method;
        copy_path(s, after);
        classifiers.call(ctx, PROG_SCAN_HEADER_BLOCK);
    } else if (s->http_seen) {
        classifiers.call(ctx, PROG_SCAN_FIELDS);   /* a request body read apart from its headers */
    }
    return submit(s);
}

int classify_write(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    u64 first8 = first_bytes(s);
    if (STARTS(first8, "HTTP/1.") && s->n >= 12 && s->head[8] == ' ') {
        u8 d0 = s->head[9], d1 = s->head[10], d2 = s->head[11];
        if (d0 >= '1' && d0 <= '5' && d1 >= '0' && d1 <= '9' && d2 >= '0' && d2 <= '9') {
            s->ev.kind = HTTP_KIND_RESPONSE;
            s->ev.status = (d0 - '0') * 100 + (d1 - '0') * 10 + (d2 - '0');
            classifiers.call(ctx, PROG_SCAN_HEADER_BLOCK);
            return submit(s);
        }
    }
    /* The last chunk "0\r\n\r\n" written on its own; or its "0\r\n" opening
     * a write, with trailers and the blank line here or in writes of their
     * own (end_lines); or the blank line alone. */
    if (s->n == 5 && STARTS(first8, "0\r\n\r\n"))
        s->ev.flags |= HTTP_FLAG_CHUNKED_END;
    else if (STARTS(first8, "0\r\n"))
        s->ev.flags |= HTTP_FLAG_LAST_CHUNK;
    if (s->n == 2 && STARTS(first8, "\r\n"))
        s->ev.flags |= HTTP_FLAG_BLANK_LINE_END;
    classifiers.call(ctx, PROG_SCAN_BODY);
    return submit(s);
}

/* A response's headers say whether its body is chunked: the connection
 * keeps that for the writes of the body (find_framing reads only their
 * payloads then). Written only when it changes, which a keep-alive
 * connection's responses of one kind never do. */
static __always_inline void remember_chunked(struct scratch *s)
{
    u32 chunked = (s->ev.flags & HTTP_FLAG_CHUNKED) != 0;
    if (chunked == s->chunked)
        return;
    struct sock_key key = {.pid = s->ev.hdr.pid, .fd = s->ev.fd};
    struct conn_state *state = socks.lookup(&key);
    if (state) {
        state->chunked = chunked;
        socks_changed(key.pid, key.fd);
    }
}

int scan_header_block(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    scan_headers(s);
    parse_content_length(s);
    if (s->type_at)
        content_type(s, s->type_at);
    if (s->ev.kind == HTTP_KIND_RESPONSE) {
        remember_chunked(s);
        /* Headers seen whole, neither chunked nor an event stream: nothing
         * in this body is read downstream (no tokens outside streams, the
         * end is a byte count or close), so the scan is skipped. */
        u16 flags = s->ev.flags;
        if ((flags & HTTP_FLAG_HEADERS_END) &&
            !(flags & (HTTP_FLAG_CHUNKED | HTTP_FLAG_EVENT_STREAM | HTTP_FLAG_NDJSON_STREAM)))
            return submit(s);
        if (!s->body_start)
            s->body_start = s->n;   /* headers run past the window: no body in view */
        classifiers.call(ctx, PROG_SCAN_BODY);
    } else {
        if (!(s->ev.flags & HTTP_FLAG_HEADERS_END))
            s->body_start = s->n;   /* headers run past the window: only the read's end is body */
        classifiers.call(ctx, PROG_SCAN_FIELDS);
    }
    return submit(s);
}

/* The rest of a read of a request: its "model" (found by scan_json_fields)
 * taken, or looked for again in the read's last bytes (the OpenAI SDKs put
 * "model" after "messages", so a long prompt pushes it past the head). */
static __always_inline int finish_request_read(void *ctx, struct scratch *s)
{
    if (take_model(s))
        return submit(s);
    u64 len = s->last_len;
    if (!s->model_pass && len > s->n && !(s->ev.flags & HTTP_FLAG_VECTORED)) {
        u32 t = len > SCAN_HEAD_BYTES ? SCAN_HEAD_BYTES : (u32)len;
        if (t > 0 && t <= SCAN_HEAD_BYTES)
            bpf_probe_read_user(s->head, t, (void *)(s->last_base + len - t));
        s->n = t;
        s->model_pass = 1;
        classifiers.call(ctx, PROG_SCAN_FIELDS);
    }
    return submit(s);
}

/* Scans the head, then each further window of a long write in a call of
 * itself (a tail call: the chain gives each window a fresh instruction
 * budget). Where the tail call fails, the lines counted so far stand. */
int scan_body(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    if (s->ev.kind == HTTP_KIND_RESPONSE && !(s->ev.flags & HTTP_FLAG_HEADERS_END))
        s->more = 0;   /* headers past the head: where the body starts is unknown */
    scan_sse(s);
    take_event_name(s);
    /* The first window also goes through scan_fields, to learn whether the
     * stream is NDJSON; so do the last and the first within SCAN_HEAD_BYTES
     * of the write's end, for the counts a stream states at its end (a
     * window of eight iovecs can end well before the bytes do). At most
     * three per write: the tail-call budget. */
    u64 after = s->ev.flags & HTTP_FLAG_VECTORED ? s->bytes_left :
                s->last_len - s->window_start - s->n;
    int near_end = s->windows && after < SCAN_HEAD_BYTES && !s->fields_near_end;
    if (near_end)
        s->fields_near_end = 1;
    if (!s->windows || !s->more || near_end)
        classifiers.call(ctx, PROG_SCAN_FIELDS);
    if (next_body_window(s))
        classifiers.call(ctx, s->ev.flags & HTTP_FLAG_VECTORED ? PROG_GATHER_WINDOW : PROG_SCAN_BODY);
    return finish_body(ctx, s);
}

/* NDJSON line ends and the JSON fields of a window (stream_fields.bpf.h),
 * apart from scan_body: each program's scan loop has a budget of branches
 * per position that the verifier can follow, and the two together exceed
 * it. Windows after the first go through here alone when the first had no
 * "data:" line (an NDJSON stream), else through scan_body alone until the
 * last. */
int scan_fields(void *ctx)
{
    struct scratch *s = get_scratch();
    if (!s)
        return 0;
    /* Later windows from 0: a count cut by the edge of the one before is whole
     * in the overlap (a count seen twice is the same count). The tail, after
     * the windows (finish_body), from 0 too. One scan in the program, which
     * the verifier walks once. */
    scan_json_fields(s, s->windows || s->tail_pass || s->model_pass ? 0 : s->body_start);
    if (s->ev.hdr.type == EVENT_SOCK_READ)
        return finish_request_read(ctx, s);
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
        classifiers.call(ctx, s->ev.flags & HTTP_FLAG_VECTORED ? PROG_GATHER_WINDOW :
                              s->json_mode ? PROG_SCAN_FIELDS : PROG_SCAN_BODY);
    return finish_body(ctx, s);
}

#ifndef READS_AT_EXIT
TRACEPOINT_PROBE(syscalls, sys_enter_read) { return io_enter(args->fd, (u64)args->buf, 0, DIR_READ, 0); }
TRACEPOINT_PROBE(syscalls, sys_enter_readv) { return io_enter(args->fd, (u64)args->vec, args->vlen, DIR_READ, 0); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) { return io_enter(args->fd, (u64)args->ubuf, 0, DIR_READ, 0); }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) { return io_enter(args->fd, (u64)args->msg, 0, DIR_READ, 1); }
#endif
TRACEPOINT_PROBE(syscalls, sys_exit_read) { return read_exit(args, args->ret, 0, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { return read_exit(args, args->ret, 1, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { return read_exit(args, args->ret, 0, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { return read_exit(args, args->ret, 0, 1); }
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return io_enter(args->fd, (u64)args->buf, 0, DIR_WRITE, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return io_exit(args, args->ret, DIR_WRITE, 0, 0); }
TRACEPOINT_PROBE(syscalls, sys_enter_writev) { return io_enter(args->fd, (u64)args->vec, args->vlen, DIR_WRITE, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { return io_exit(args, args->ret, DIR_WRITE, 1, 0); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { return io_enter(args->fd, (u64)args->buff, 0, DIR_WRITE, 0); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { return io_exit(args, args->ret, DIR_WRITE, 0, 0); }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { return io_enter(args->fd, (u64)args->msg, 0, DIR_WRITE, 1); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { return io_exit(args, args->ret, DIR_WRITE, 0, 1); }

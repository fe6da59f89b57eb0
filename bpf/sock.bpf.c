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
 *
 * This file holds the maps and the code that touches them, the hooks, and
 * the classification chain's programs, read top to bottom: the connection
 * table, pending I/O, accept and close, then the read and write hooks and
 * the tail-call chain. How bytes are read and what they mean live in the
 * headers below, one concern each, all working on struct scratch; a new
 * protocol is a header of its own plus a branch in classify_read and
 * classify_write, where the chain dispatches on a syscall's first bytes.
 * Map code stays here: bcc rewrites map calls (map.lookup(), .call(),
 * task_storage_get) only in its main file, and leaves them in an included
 * header as calls the kernel refuses.
 */
#include "common.bpf.h"
#include "scratch.bpf.h"        /* struct scratch: what the chain's programs share */
#include "scan_bytes.bpf.h"     /* word-at-a-time comparisons and loads */
#include "http1.bpf.h"          /* request line, status line, header block */
#include "sse.bpf.h"            /* SSE lines of a body window */
#include "stream_fields.bpf.h"  /* the JSON fields a stream states about itself */
#include "stream_end.bpf.h"     /* how a write ends: its last bytes */
#include "chunk_framing.bpf.h"  /* chunk framing known from iovec lengths */
#include "gather.bpf.h"         /* a syscall's bytes into the head: buffer or iovecs */
#include "body_windows.bpf.h"   /* a long write, a window at a time */

/* Where the reads need no entry program (read_exit): the pending state in
 * task storage, the saved user registers readable (x86-64: the first
 * argument's register still holds it at exit), and no other probe set
 * looking for a read in flight from inside the syscall (net.bpf.c asks for
 * the entries with READS_NEED_ENTRY). */
#if defined(PENDING_IN_TASK_STORAGE) && defined(HAVE_TASK_PT_REGS) && defined(__x86_64__) && \
    !defined(READS_NEED_ENTRY)
#define READS_AT_EXIT 1
#endif

/* ---------------------------------------------------------------- connections and pending I/O */

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
 * 64 direct-mapped slots (2 KiB a thread) cover an event loop's busy
 * connections: with 16, Node serving 32 keep-alive connections missed
 * half the time, and its writev entry cost 202 ns a run instead of 151
 * (benchmarks/bench_node_sse.py). A collision or a newer generation just
 * means a socks lookup. An fd that is no tracked socket (a log file, a pipe, a client
 * connection to a backend) is cached as such too: a server writing a log
 * line per request would otherwise pay the lookup on every line. A hit
 * skips socks, so its LRU does not see the use: when full (65536 live
 * connections) it may evict a busy one, whose cached copy then serves on
 * until close(), which bumps the slot whether or not socks still has it. */
#define CONN_CACHE_SLOTS 64
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
    u32 read_exit_seen;     /* read_exit ran for this thread: its read began after attach */
};
BPF_TASK_STORAGE(pending_task, struct thread_io);
#ifdef READS_AT_EXIT
/* tid -> fd of the read-family syscall each target thread was blocked in
 * when tracing began (collector/probe_sets/sockets.py reads
 * /proc/<pid>/task/<tid>/syscall before the targets are set): read_exit
 * cannot tell otherwise a read begun before attach from one begun after. */
BPF_HASH(reads_at_attach, u32, s32, 4096);
#endif

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

#if defined(HAVE_TASK_PT_REGS) && defined(__x86_64__)
/* The current thread's storage, made if it has none yet. */
static __always_inline struct thread_io *current_thread_io(void)
{
    struct thread_io *thread = pending_task.task_storage_get(bpf_get_current_task_btf(), 0,
                                                             BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!thread)
        count(COUNTER_IO_UNTRACKED);
    return thread;
}

/* The syscall the current thread is in, from its saved user registers (the
 * architecture's syscall ABI, read as uprobes read theirs: rdi, rsi, rdx
 * hold the first three arguments for the whole syscall), when the fd in its
 * first argument is a tracked connection: fills `state` and *fd, and returns
 * the registers (0 otherwise). */
static __always_inline struct pt_regs *syscall_on_connection(struct thread_io *thread, u32 tgid,
                                                             struct conn_state *state, s32 *fd)
{
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    *fd = (s32)regs->di;
    return lookup_conn(&thread->io, tgid, *fd, state) ? regs : 0;
}

/* A syscall begun before attach is on a connection open then (seeded by
 * user space, ids below first_new_conn_id). A newer one on its fd means the
 * fd was closed and reused while the thread sat on the old socket: its
 * bytes belong to neither. */
static __always_inline int open_at_attach(struct conn_state *state)
{
    u32 zero = 0;
    u64 *first_new = first_new_conn_id.lookup(&zero);
    return first_new && state->conn_id < *first_new;
}
#endif

/* A socket syscall the thread was already inside when tracing began (an
 * idle server blocked in recv() at attach): its entry was never seen, and
 * without this its request would be missing. Every traced syscall a target
 * thread enters creates its storage, so a thread without any is in one
 * that began earlier. The arguments are still in the thread's saved user
 * registers (syscall_on_connection); the start is unknown, so io->ts_ns stays 0 and io_exit uses the exit
 * time and flags the event. Taken at most once per thread: it creates the
 * storage. x86-64 and Linux 5.15+ only (HAVE_TASK_PT_REGS, set by
 * collector/probe_sets/sockets.py): elsewhere the first argument's register
 * already holds the return value at exit. */
static __always_inline int recover_in_flight(u64 id, struct pending_io *io, u16 dir,
                                             u16 vectored, u16 is_msghdr)
{
#if defined(HAVE_TASK_PT_REGS) && defined(__x86_64__)
    struct thread_io *thread = current_thread_io();
    if (!thread)
        return 0;
    struct conn_state state;
    s32 fd;
    struct pt_regs *regs = syscall_on_connection(thread, id >> 32, &state, &fd);   /* a target: io_exit checked */
    if (!regs || !open_at_attach(&state))
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

/* The socket table's entry of the connection an event is about: what the
 * chain programs change once they know more of it (http_seen, carried,
 * chunked), each followed by socks_changed() so no thread's cache misses it. */
static __always_inline struct conn_state *event_conn(const struct io_event *ev)
{
    struct sock_key key = {.pid = ev->hdr.pid, .fd = ev->fd};
    return socks.lookup(&key);
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
        struct conn_state *state = event_conn(ev);
        if (state) {
            state->http_seen = 1;
            socks_changed(ev->hdr.pid, ev->fd);
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
    struct thread_io *thread = current_thread_io();
    if (!thread)
        return 0;
    /* A read the thread was already in when tracing began: user space lists
     * the threads it found blocked in one, and their fds (reads_at_attach).
     * Looked up once per thread, at its first read exit. */
    s32 blocked_fd = -1;
    if (!thread->read_exit_seen) {
        thread->read_exit_seen = 1;
        u32 tid = (u32)id;
        s32 *listed = reads_at_attach.lookup(&tid);
        if (listed) {
            blocked_fd = *listed;
            reads_at_attach.delete(&tid);
        }
    }
    struct conn_state state;
    s32 fd;
    struct pt_regs *regs = syscall_on_connection(thread, tgid, &state, &fd);
    if (!regs)
        return 0;
    u64 now = bpf_ktime_get_ns(), start = now;
    if (fd == blocked_fd) {
        if (!open_at_attach(&state))
            return 0;
        start = 0;   /* begun unseen: classify_io times it at the exit and flags it */
    }
    struct pending_io io;
    fill_pending(&io, start, regs->si, vectored ? (u32)regs->dx : 0, fd, DIR_READ, is_msghdr, &state);
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
    struct conn_state *state = event_conn(&s->ev);
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

/* classify_read and classify_write, the first programs once a syscall's
 * bytes are in the head, tell which protocol it speaks from its first bytes,
 * by the recognisers of each protocol's header (HTTP/1: http1.bpf.h). A new
 * protocol's recogniser is one more branch in each, sending its syscalls to
 * programs of its own or to the body scans. */
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
    if (request_line(s, method, after)) {
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
    if (status_line(s, first8)) {
        classifiers.call(ctx, PROG_SCAN_HEADER_BLOCK);
        return submit(s);
    }
    chunked_end_piece(s, first8);
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
    struct conn_state *state = event_conn(&s->ev);
    if (state) {
        state->chunked = chunked;
        socks_changed(s->ev.hdr.pid, s->ev.fd);
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

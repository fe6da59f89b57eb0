/* sock.bpf.c: HTTP/1.x request and response boundaries from socket syscalls
 * and from the plaintext of TLS libraries.
 *
 * Attached to syscall tracepoints (no kprobes) and, with the TLS set on, to
 * uprobes on OpenSSL and Go's crypto/tls. For the target process trees it
 * follows the sockets they accept (server role) and connect (client role:
 * their outbound calls), peeks at the first bytes of each read and write,
 * or of each SSL_read/SSL_write's plaintext, to classify them (request line,
 * status line, SSE "data:" events, end of a chunked body) and sends one
 * compact io_event per syscall or library call.
 *
 * Privacy: buffers are copied into a per-CPU scratch area that never leaves
 * the kernel. Only the method, the path (without query string), the status
 * code, lengths, counts and flags reach user space: no body byte does.
 *
 * Built ahead of time with clang against vmlinux.h (scripts/build_bpf.sh) and
 * loaded with libbpf (collector/attach/libbpf.py): the kernel types it reads
 * (tracepoint records, pt_regs) are relocated for the running kernel (CO-RE).
 * This object creates the maps every set shares (targets, events, counters:
 * common.bpf.h); the other sets' objects are handed them. The network
 * and host-wide sets' programs are parts of it (net.bpf.c, host_wide.bpf.c,
 * included at the end), switched on by the settings below.
 *
 * This file holds the maps and the code that touches them, the hooks, and
 * the classification chain's programs, read top to bottom: the connection
 * table, pending I/O, accept, connect and close, then the read and write
 * hooks and the tail-call chain, and last the TLS library probes, which hand
 * their plaintext to the chain's kprobe-type copy. How bytes are read and
 * what they mean live in the headers below, one concern each, all working on struct scratch; a new
 * protocol is a header of its own plus a branch in classify_request and
 * classify_response, where the chain dispatches on a syscall's first bytes.
 */
#include "common.bpf.h"
#include "process_tree.bpf.h"   /* the target set follows fork() and exit */
#include "scratch.bpf.h"        /* struct scratch: what the chain's programs share */
#include "scan_bytes.bpf.h"     /* word-at-a-time comparisons and loads */
#include "http1.bpf.h"          /* request line, status line, header block */
#include "sse.bpf.h"            /* SSE lines of a body window */
#include "stream_fields.bpf.h"  /* the JSON fields a stream states about itself */
#include "event_stream.bpf.h"   /* AWS event streams (Bedrock): messages of a body window */
#include "stream_end.bpf.h"     /* how a write ends: its last bytes */
#include "chunk_framing.bpf.h"  /* chunk framing known from iovec lengths */
#include "gather.bpf.h"         /* a syscall's bytes into the head: buffer or iovecs */
#include "body_windows.bpf.h"   /* a long write, a window at a time */
#include "http2.bpf.h"          /* HTTP/2 frames, across syscalls and iovecs */
#include "trace_context.bpf.h"  /* W3C traceparent / tracestate values of a request */
#include "zmtp.bpf.h"           /* ZeroMQ between an engine's processes (vLLM's API server and EngineCore) */

/* Two objects are built from this file (scripts/build_bpf.sh):
 *   sock.bpf.o       -DPENDING_IN_TASK_STORAGE: a syscall's pending state in
 *                    task-local storage (Linux 5.13+ with BTF), and on x86-64
 *                    the saved user registers readable (bpf_task_pt_regs,
 *                    5.15+: HAVE_TASK_PT_REGS below);
 *   sock_hash.bpf.o  the pending state in a hash, for the kernels without.
 * collector/attach/probe_sets/sockets.py picks one. Everything else is decided
 * when a recording starts, by the read-only settings below, which the loader
 * writes between open and load: the verifier sees them as constants and drops
 * the code they turn off, so a setting costs nothing where it is off. */
#if defined(PENDING_IN_TASK_STORAGE) && defined(__TARGET_ARCH_x86)
#define HAVE_TASK_PT_REGS 1
#endif

/* Reads need no entry program (read_exit): only with the saved registers
 * (HAVE_TASK_PT_REGS), and while no other probe set looks for a read in
 * flight from inside the syscall (net.bpf.c needs the entries). The read
 * entry programs are then left unloaded. */
const volatile u32 reads_at_exit = 0;
/* The TLS set is on: its uprobes feed the chain's kprobe-type copy. */
const volatile u32 tls_probes = 0;
/* The host-wide set is on (host_wide.bpf.c): processes adopted by what they serve. */
const volatile u32 host_wide_on = 0;
/* The network set is on (net.bpf.c): sock:inet_sock_set_state feeds it too. */
const volatile u32 net_socket_state = 0;

/* Host-wide mode's hooks, defined in host_wide.bpf.c (included at the end of
 * this file): sock.bpf.c calls them where a process listens or accepts and
 * where a connection moves bytes. Each returns at once when host_wide_on is 0. */
#define HOST_WIDE_LISTEN 1   /* how a process was adopted: it listened ... */
#define HOST_WIDE_ACCEPT 2   /* ... or accepted */
static __always_inline int host_wide_adopt(u32 tgid, u16 port, u16 how);
static __always_inline int host_wide_follow(u64 conn_id);
static __always_inline void host_wide_tally_open(u32 tgid, s32 fd);
static __always_inline int host_wide_tallied(u32 tgid, s32 fd);
static __always_inline void host_wide_tally(u32 tgid, s32 fd, u16 dir, u64 t_ns);
static __always_inline void host_wide_tally_close(u32 tgid, s32 fd);

/* ---------------------------------------------------------------- connections and pending I/O */

struct sock_key {
    u32 pid;
    s32 fd;
};

struct conn_state {
    u64 conn_id;
    u32 http_seen;   /* a request line was read: from now on every I/O counts */
    u32 body;        /* BODY_* of its last response: chunked (find_framing may apply), an AWS event stream */
    u32 tls;         /* a TLS session runs over it: its bytes are ciphertext, read at the library */
    u32 unrecognised; /* it moved bytes the classifier did not recognise (counted at close) */
    u32 client;      /* enum conn_role: connect()ed by the target (it sends requests) or accepted */
    u32 h2;          /* it began with the HTTP/2 preface: its bytes are frames (h2_frames) */
    u32 tally_only;  /* never in socks: lookup_conn's answer for a connection only tallied (host_wide.bpf.c) */
    u32 local_ipc;   /* enum local_ipc: a Unix-domain socket, whose unrecognised bytes are IPC of this host,
                      * not unhooked TLS; or one end of a socketpair the process holds both ends of */
    u32 tls_read_over; /* a hooked TLS library call read over it without plaintext yet (tls_note_carrier) */
    u32 zmtp;        /* 1..ZMTP_PROBES_MAX: probes found no ZMTP frames; ZMTP_FOLLOWED: walked by scan_zmtp */
};

enum io_dir { DIR_READ = 0, DIR_WRITE = 1, DIR_HANDSHAKE = 2 /* a TLS call that moves no plaintext */ };

struct pending_io {
    u64 ts_ns;
    u64 buf;         /* plain buffer, or iovec array, or user_msghdr */
    u64 conn_id;
    u32 vlen;        /* number of iovecs, 0 for a plain buffer */
    s32 fd;
    u16 dir;
    u16 is_msghdr;
    u32 http_seen;
    u32 body;
    u32 client;
    u64 session;     /* TLS: the library's session (SSL *, Go *tls.Conn); 0 for a socket syscall */
    u64 wire_ns;     /* TLS: when the first socket syscall inside the library call began */
    u32 h2;
    u32 tally_only;  /* a syscall on a connection only tallied: io_exit counts it and sends nothing */
    u32 zmtp;
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct sock_key);
    __type(value, struct conn_state);
} socks SEC(".maps");
/* Any change to socks that a thread's cache of it (below) could miss: a
 * connection accepted or closed, or seen to carry HTTP. Each change bumps
 * the generation of its (process, fd) slot, so a busy server's accepts and
 * closes leave other fds' and other processes' cached entries valid;
 * slots are shared by hash, and a collision only costs a socks lookup.
 * Caches stamped with an older generation are ignored. User space seeds
 * socks before the targets are set (collector/attach/loader.py), so no target
 * thread can have cached a seeded socket as untracked. */
#define SOCKS_GENERATION_SLOTS 4096
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SOCKS_GENERATION_SLOTS);
    __type(key, u32);
    __type(value, u64);
} socks_generation SEC(".maps");
/* The first conn_id handed out in the kernel: lower ones are connections
 * that were open when tracing began (seeded by user space). */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} first_new_conn_id SEC(".maps");

/* The generation counter of the (process, fd) slot. */
static __always_inline u64 *socks_generation_of(u32 tgid, s32 fd)
{
    u32 slot = (tgid * 0x9E3779B1U + (u32)fd) & (SOCKS_GENERATION_SLOTS - 1);
    return bpf_map_lookup_elem(&socks_generation, &slot);
}

/* (Unused where the pending state is in a hash: no thread cache there.) */
static __always_inline __attribute__((unused)) u64 socks_generation_now(u32 tgid, s32 fd)
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
    io->body = conn->body;
    io->client = conn->client;
    io->h2 = conn->h2;
    io->zmtp = conn->zmtp;
    io->session = 0;
    io->wire_ns = 0;
    io->tally_only = 0;
}

/* A syscall on a connection host_wide.bpf.c only tallies (unsampled, or
 * TLS ciphertext): its exit needs the fd, the direction and the entry time. */
static __always_inline void tally_pending(struct pending_io *io, u64 ts_ns, s32 fd, u16 dir)
{
    __builtin_memset(io, 0, sizeof(*io));
    io->ts_ns = ts_ns;
    io->fd = fd;
    io->dir = dir;
    io->tally_only = 1;
}

/* What pending_finish() found for the exiting thread. */
enum pending_found {
    PENDING_NONE = 0,          /* no traced syscall in flight */
    PENDING_FOUND = 1,
    PENDING_THREAD_UNSEEN = 2, /* task storage only: the thread entered nothing since attach */
};

/* Per thread, from a syscall's entry to its exit.
 *
 * Where the kernel allows it (5.13+ with BTF: collector/attach/probe_sets/sockets.py
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
    u32 body;
    u32 tls;
    u32 client;
    u32 h2;
    u32 zmtp;
    u32 filled;
    u32 tracked;     /* 0: socks has no entry for this fd */
    u32 tally_only;  /* no socks entry, but host_wide.bpf.c tallies it (an unsampled connection) */
};

struct thread_io {
    struct pending_io io;   /* first: pending_slot() hands out &thread->io */
    struct cached_conn conns[CONN_CACHE_SLOTS];
    u32 read_exit_seen;     /* read_exit ran for this thread: its read began after attach */
    /* Which socket a TLS session runs over (tls_session_of): the socket
     * syscalls a thread makes inside an OpenSSL call, and the socket it
     * read last (a memory BIO: asyncio, Node). */
    u32 tls_in_call;        /* an SSL_read/SSL_write of this thread is under way */
    s32 tls_nested_fd;      /* the first tracked socket it touched inside that call, or -1 */
    u64 tls_wire_ns;        /* when that syscall began, if a write */
    s32 last_read_fd;       /* the tracked socket this thread read last, + 1 (0: none yet) */
};
struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct thread_io);
} pending_task SEC(".maps");
#ifdef HAVE_TASK_PT_REGS
/* tid -> fd of the read-family syscall each target thread was blocked in
 * when tracing began (collector/attach/probe_sets/sockets.py reads
 * /proc/<pid>/task/<tid>/syscall before the targets are set): read_exit
 * cannot tell otherwise a read begun before attach from one begun after. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, u32);
    __type(value, s32);
} reads_at_attach SEC(".maps");
#endif

/* Where io_enter builds the syscall's pending state: in place. */
static __always_inline struct pending_io *pending_slot(u64 id)
{
    struct thread_io *thread = bpf_task_storage_get(&pending_task, bpf_get_current_task_btf(), 0,
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
        out->body = cached->body;
        out->tls = cached->tls;
        out->client = cached->client;
        out->h2 = cached->h2;
        out->zmtp = cached->zmtp;
        out->tally_only = cached->tally_only;
        return cached->tracked;
    }
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct conn_state *state = bpf_map_lookup_elem(&socks, &key);
    cached->generation = generation;
    cached->fd = fd;
    cached->filled = 1;
    cached->tracked = state != 0;
    /* Looked up only on a miss: the cache then answers for the fd until it changes. */
    cached->tally_only = !state && host_wide_tallied(tgid, fd);
    out->tally_only = cached->tally_only;
    if (!state)
        return 0;
    *out = *state;
    cached->conn_id = out->conn_id;
    cached->http_seen = out->http_seen;
    cached->body = out->body;
    cached->tls = out->tls;
    cached->client = out->client;
    cached->h2 = out->h2;
    cached->zmtp = out->zmtp;
    return 1;
}

static __always_inline int pending_finish(u64 id, struct pending_io *io)
{
    struct pending_io *slot = bpf_task_storage_get(&pending_task, bpf_get_current_task_btf(), 0, 0);
    if (!slot)
        return PENDING_THREAD_UNSEEN;
    if (!slot->ts_ns)
        return PENDING_NONE;
    *io = *slot;
    slot->ts_ns = 0;
    return PENDING_FOUND;
}

/* What a socket syscall of a target thread tells the TLS probes about the
 * socket under a session (tls_session_of): the first tracked socket the
 * thread touches inside an SSL_read/SSL_write (a socket BIO: Python's
 * blocking ssl sockets, curl, nginx), and the one it read last (a memory
 * BIO: asyncio and Node read the ciphertext, then hand it to OpenSSL). */
static __always_inline void note_tls_carrier(struct pending_io *slot, s32 fd, u16 dir, u64 now)
{
    if (!tls_probes)
        return;
    struct thread_io *thread = (struct thread_io *)slot;
    if (dir == DIR_READ)
        thread->last_read_fd = fd + 1;
    if (thread->tls_in_call && thread->tls_nested_fd < 0) {
        thread->tls_nested_fd = fd;
        thread->tls_wire_ns = dir == DIR_WRITE ? now : 0;
    }
}

#if defined(HAVE_TASK_PT_REGS)
/* The current thread's storage, made if it has none yet. */
static __always_inline struct thread_io *current_thread_io(void)
{
    struct thread_io *thread = bpf_task_storage_get(&pending_task, bpf_get_current_task_btf(), 0,
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
    *fd = (s32)BPF_CORE_READ(regs, di);
    return lookup_conn(&thread->io, tgid, *fd, state) || state->tally_only ? regs : 0;
}

/* A syscall begun before attach is on a connection open then (seeded by
 * user space, ids below first_new_conn_id). A newer one on its fd means the
 * fd was closed and reused while the thread sat on the old socket: its
 * bytes belong to neither. */
static __always_inline int open_at_attach(struct conn_state *state)
{
    u32 zero = 0;
    u64 *first_new = bpf_map_lookup_elem(&first_new_conn_id, &zero);
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
 * collector/attach/probe_sets/sockets.py): elsewhere the first argument's register
 * already holds the return value at exit. */
static __always_inline int recover_in_flight(u64 id, struct pending_io *io, u16 dir,
                                             u16 vectored, u16 is_msghdr)
{
#if defined(HAVE_TASK_PT_REGS)
    struct thread_io *thread = current_thread_io();
    if (!thread)
        return 0;
    struct conn_state state = {};
    s32 fd;
    struct pt_regs *regs = syscall_on_connection(thread, id >> 32, &state, &fd);   /* a target: io_exit checked */
    if (!regs || !open_at_attach(&state))
        return 0;
    fill_pending(io, 0, BPF_CORE_READ(regs, si), vectored ? (u32)BPF_CORE_READ(regs, dx) : 0, fd, dir, is_msghdr, &state);
    return 1;
#else
    return 0;
#endif
}

/* The thread's syscall in flight, left in place (net.bpf.c reads it). */
static __always_inline struct pending_io *pending_peek(u64 id)
{
    struct pending_io *slot = bpf_task_storage_get(&pending_task, bpf_get_current_task_btf(), 0, 0);
    return slot && slot->ts_ns ? slot : 0;
}
#else
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);
    __type(value, struct pending_io);
} pending SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct pending_io);
} pending_staging SEC(".maps");

/* Where io_enter builds the syscall's pending state: a per-CPU draft that
 * pending_commit() copies into the hash. */
static __always_inline struct pending_io *pending_slot(u64 id)
{
    u32 zero = 0;
    return bpf_map_lookup_elem(&pending_staging, &zero);
}

static __always_inline void pending_commit(u64 id, struct pending_io *slot)
{
    if (bpf_map_update_elem(&pending, &id, slot, BPF_ANY) != 0)
        count(COUNTER_IO_UNTRACKED);
}

static __always_inline int lookup_conn(struct pending_io *slot, u32 tgid, s32 fd,
                                       struct conn_state *out)
{
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct conn_state *state = bpf_map_lookup_elem(&socks, &key);
    if (!state) {
        out->tally_only = host_wide_tallied(tgid, fd);
        return 0;
    }
    *out = *state;
    return 1;
}

static __always_inline int pending_finish(u64 id, struct pending_io *io)
{
    struct pending_io *found = bpf_map_lookup_elem(&pending, &id);
    if (!found)
        return PENDING_NONE;
    *io = *found;
    bpf_map_delete_elem(&pending, &id);
    return PENDING_FOUND;
}

/* Without per-thread storage a TLS session is tied to its socket only where
 * the library's own structures name the fd (Go); see tls_session_of. */
static __always_inline void note_tls_carrier(struct pending_io *slot, s32 fd, u16 dir, u64 now) {}

/* The hash cannot tell a thread never seen from one between syscalls, so a
 * syscall already under way at attach stays unrecorded in this mode. */
static __always_inline int recover_in_flight(u64 id, struct pending_io *io, u16 dir,
                                             u16 vectored, u16 is_msghdr)
{
    return 0;
}

static __always_inline struct pending_io *pending_peek(u64 id)
{
    return bpf_map_lookup_elem(&pending, &id);
}
#endif
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, u64);
    __type(value, u64);
} pending_accept SEC(".maps");           /* per tid: sockaddr ptr */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} next_conn_id SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct scratch);
} scratch_area SEC(".maps");

/* ---------------------------------------------------------------- accept / close */

/* The next connection id (ids are unique for the recording; user space
 * seeds next_conn_id past the sockets open at attach). 0 if the map is gone. */
static __always_inline int new_conn_id(u64 *conn_id)
{
    u32 zero = 0;
    u64 *counter = bpf_map_lookup_elem(&next_conn_id, &zero);
    if (!counter)
        return 0;
    *conn_id = __sync_fetch_and_add(counter, 1);
    return 1;
}

/* A connection event in the ring buffer, its common fields filled in (0
 * when the buffer is full: counted lost); conn_event_submit() sends it. */
static __always_inline struct conn_event *conn_event_reserve(u32 type, u64 ts, u64 pid_tgid, u64 conn_id,
                                                             s32 fd, u16 role)
{
    struct conn_event *ev = bpf_ringbuf_reserve(&events, sizeof(struct conn_event), 0);
    if (!ev) {
        count(COUNTER_EVENTS_LOST);
        return 0;
    }
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, type, ts, pid_tgid);
    ev->conn_id = conn_id;
    ev->fd = fd;
    ev->role = role;
    return ev;
}

static __always_inline int conn_event_submit(struct conn_event *ev)
{
    bpf_ringbuf_submit(ev, wakeup_flag(sizeof(*ev)));
    count(COUNTER_EVENTS_SENT);
    return 0;
}

/* The family of a user sockaddr (its first field), 0 without one. */
static __always_inline u16 sockaddr_family(u64 addr)
{
    u16 family = 0;
    if (addr)
        bpf_probe_read_user(&family, sizeof(family), (void *)addr);
    return family;
}

static __always_inline void fill_peer(struct conn_event *ev, u64 addr)
{
    /* sockaddr layouts are user ABI: family first, then port (inet). */
    u16 family = sockaddr_family(addr);
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

/* Connections whose peer nothing else names: accepted ones whose accept()
 * was passed no address buffer (uvloop, libuv and so Node, cpp-httplib and
 * so llama-server, many C servers), and TCP connections open at attach,
 * accepted or the target's own calls out (seeded by user space).
 * tcp:tcp_rcv_space_adjust names the peer, from the socket itself, inside
 * the first read of it. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 8192);
    __type(key, struct sock_key);
    __type(value, u64);
} peer_wanted SEC(".maps");   /* (pid, fd) -> conn_id */

static __always_inline int accept_enter(u64 sockaddr_ptr)
{
    u64 id = bpf_get_current_pid_tgid();
    /* Host-wide mode: a process that accepts serves a stream socket. */
    if (!is_target(id >> 32) && !host_wide_adopt(id >> 32, 0, HOST_WIDE_ACCEPT))
        return 0;
    bpf_map_update_elem(&pending_accept, &id, &sockaddr_ptr, BPF_ANY);
    return 0;
}

static __always_inline int accept_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 addr = 0;
    u64 *sockaddr_ptr = bpf_map_lookup_elem(&pending_accept, &id);
    if (sockaddr_ptr) {
        addr = *sockaddr_ptr;
        bpf_map_delete_elem(&pending_accept, &id);
    } else if (!is_target(id >> 32) && !(ret >= 0 && host_wide_adopt(id >> 32, 0, HOST_WIDE_ACCEPT))) {
        return 0;
    }
    /* No entry but a target: the accept() was already blocking when we
     * attached (an idle threaded server). Track the connection anyway; only
     * its peer address is unknown. */
    if (ret < 0)
        return 0;

    u64 conn_id;
    if (!new_conn_id(&conn_id))
        return 0;
    /* Host-wide mode tallies every accepted connection; sampling (agent
     * --max-cpu) follows only some in full: the others get no socks entry. */
    host_wide_tally_open(id >> 32, (s32)ret);
    if (!host_wide_follow(conn_id)) {
        socks_changed(id >> 32, (s32)ret);   /* a thread may have cached the fd's last life */
        return 0;
    }

    struct sock_key key = {.pid = id >> 32, .fd = (s32)ret};
    struct conn_state state = {.conn_id = conn_id, .local_ipc = sockaddr_family(addr) == 1 /* AF_UNIX */};
    bpf_map_update_elem(&socks, &key, &state, BPF_ANY);
    socks_changed(key.pid, key.fd);

    struct conn_event *ev = conn_event_reserve(EVENT_CONN_OPEN, bpf_ktime_get_ns(), id, conn_id, (s32)ret,
                                               CONN_ROLE_SERVER);
    if (!ev)
        return 0;
    if (addr)
        fill_peer(ev, addr);
    if (!ev->family)
        bpf_map_update_elem(&peer_wanted, &key, &conn_id, BPF_ANY);
    return conn_event_submit(ev);
}

SEC("tracepoint/syscalls/sys_enter_accept")
int sys_enter_accept(struct trace_event_raw_sys_enter *args) { return accept_enter((u64)args->args[1]); }
SEC("tracepoint/syscalls/sys_exit_accept")
int sys_exit_accept(struct trace_event_raw_sys_exit *args) { return accept_exit(args->ret); }
SEC("tracepoint/syscalls/sys_enter_accept4")
int sys_enter_accept4(struct trace_event_raw_sys_enter *args) { return accept_enter((u64)args->args[1]); }
SEC("tracepoint/syscalls/sys_exit_accept4")
int sys_exit_accept4(struct trace_event_raw_sys_exit *args) { return accept_exit(args->ret); }

/* ---------------------------------------------------------------- connect: the targets' outbound calls
 *
 * A socket a target connect()s is a client connection: its writes carry
 * requests and its reads responses (conn_state.client; the chain takes the
 * request half by s->request_side). Its id is handed out at the call, so
 * that sock:inet_sock_set_state, which sees the TCP handshake, can name it:
 * SYN_SENT runs inside connect() on the calling thread (pending_connect),
 * ESTABLISHED later, in whatever context the SYN-ACK arrives, and is found
 * by the socket's address, an opaque key the tracepoint gives (connecting). */
struct connect_call {
    u64 ts_ns;
    u64 sockaddr;
    u64 conn_id;
    s32 fd;
    u32 pad;
};
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, u64);
    __type(value, struct connect_call);
} pending_connect SEC(".maps");   /* per tid */

struct connecting_conn {
    u64 conn_id;
    u64 pid_tgid;
};
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, u64);
    __type(value, struct connecting_conn);
} connecting SEC(".maps");   /* skaddr -> the connection */


SEC("tracepoint/syscalls/sys_enter_connect")
int sys_enter_connect(struct trace_event_raw_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    struct connect_call call = {.ts_ns = bpf_ktime_get_ns(), .sockaddr = (u64)args->args[1],
                                .fd = (s32)args->args[0]};
    if (!new_conn_id(&call.conn_id))
        return 0;
    bpf_map_update_elem(&pending_connect, &id, &call, BPF_ANY);
    return 0;
}

SEC("tracepoint/syscalls/sys_exit_connect")
int sys_exit_connect(struct trace_event_raw_sys_exit *args)
{
    u64 id = bpf_get_current_pid_tgid();
    struct connect_call *found = bpf_map_lookup_elem(&pending_connect, &id);
    if (!found)
        return 0;
    struct connect_call call = *found;
    bpf_map_delete_elem(&pending_connect, &id);
    long ret = args->ret;
    if (ret == 0 || ret == -115 /* EINPROGRESS: a non-blocking connect under way */) {
        struct sock_key key = {.pid = id >> 32, .fd = call.fd};
        struct conn_state state = {.conn_id = call.conn_id, .client = 1,
                                   .local_ipc = sockaddr_family(call.sockaddr) == 1 /* AF_UNIX */};
        bpf_map_update_elem(&socks, &key, &state, BPF_ANY);
        socks_changed(key.pid, key.fd);
    }
    /* Failed ones too: a refused or timed-out attempt is what a retry follows. */
    struct conn_event *ev = conn_event_reserve(EVENT_CONN_OPEN, call.ts_ns, id, call.conn_id, call.fd,
                                               CONN_ROLE_CLIENT);
    if (!ev)
        return 0;
    ev->result = (s32)ret;
    if (call.sockaddr)
        fill_peer(ev, call.sockaddr);
    return conn_event_submit(ev);
}

/* net.bpf.c's part of this tracepoint, defined there: one program per tracepoint here. */
static __always_inline void net_socket_state_changed(u64 sk, int newstate);

SEC("tracepoint/sock/inet_sock_set_state")
int inet_sock_set_state(struct trace_event_raw_inet_sock_set_state *args)
{
    if (args->protocol != 6 /* IPPROTO_TCP */)
        return 0;
    u64 sk = (u64)args->skaddr;
    if (net_socket_state)
        net_socket_state_changed(sk, args->newstate);
    if (host_wide_on && args->newstate == 10 /* TCP_LISTEN */) {
        /* listen() runs this in the caller's context, with the local port. */
        u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (!is_target(tgid))
            host_wide_adopt(tgid, args->sport, HOST_WIDE_LISTEN);
        return 0;
    }
    if (args->newstate == 2 /* TCP_SYN_SENT */) {
        u64 id = bpf_get_current_pid_tgid();
        struct connect_call *call = bpf_map_lookup_elem(&pending_connect, &id);
        if (call) {
            struct connecting_conn conn = {.conn_id = call->conn_id, .pid_tgid = id};
            bpf_map_update_elem(&connecting, &sk, &conn, BPF_ANY);
        }
        return 0;
    }
    if (args->oldstate != 2 /* TCP_SYN_SENT */)
        return 0;
    struct connecting_conn *found = bpf_map_lookup_elem(&connecting, &sk);
    if (!found)
        return 0;
    struct connecting_conn conn = *found;
    bpf_map_delete_elem(&connecting, &sk);
    if (args->newstate != 1 /* TCP_ESTABLISHED */)
        return 0;   /* refused, reset or timed out: connect() or the first I/O reports it */
    struct conn_event *ev = conn_event_reserve(EVENT_CONN_CONNECTED, bpf_ktime_get_ns(), conn.pid_tgid,
                                               conn.conn_id, -1, CONN_ROLE_CLIENT);
    if (!ev)
        return 0;
    /* The port the kernel bound for it: the peer port its server sees, which ties
     * a traced proxy's upstream call to the traced backend's request. */
    ev->local_port = args->sport;
    return conn_event_submit(ev);
}

/* The fd the current thread is reading, if it is in a read-family syscall:
 * tcp:tcp_rcv_space_adjust runs inside tcp_recvmsg, in the reader's
 * context, but names only the socket. With the thread's saved registers the
 * syscall's own number and first argument say it for every read, TLS
 * ciphertext included (x86-64 numbers: read, readv, recvfrom, recvmsg,
 * recvmmsg); otherwise the read io_enter left pending, plaintext only. */
static __always_inline int current_read_fd(u64 id, s32 *fd)
{
#if defined(HAVE_TASK_PT_REGS)
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    u64 nr = BPF_CORE_READ(regs, orig_ax);
    if (nr != 0 && nr != 19 && nr != 45 && nr != 47 && nr != 299)
        return 0;
    *fd = (s32)BPF_CORE_READ(regs, di);
    return 1;
#else
    struct pending_io *io = pending_peek(id);
    if (!io || io->dir != DIR_READ)
        return 0;
    *fd = io->fd;
    return 1;
#endif
}

/* The peer of a connection in peer_wanted, at its first read: EVENT_CONN_PEER
 * with the address the kernel keeps for the socket (the tracepoint's own
 * fields, host byte order ports), once per connection. */
SEC("tracepoint/tcp/tcp_rcv_space_adjust")
int tcp_rcv_space_adjust(struct trace_event_raw_tcp_event_sk *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    s32 fd;
    if (!current_read_fd(id, &fd))
        return 0;
    struct sock_key key = {.pid = id >> 32, .fd = fd};
    u64 *wanted = bpf_map_lookup_elem(&peer_wanted, &key);
    if (!wanted)
        return 0;
    u64 conn_id = *wanted;
    bpf_map_delete_elem(&peer_wanted, &key);
    /* A connection open at attach may be the target's own call out (a pooled
     * client connection): the socket's far end is then its server. */
    struct conn_state *state = bpf_map_lookup_elem(&socks, &key);
    u16 role = state && state->client ? CONN_ROLE_CLIENT : CONN_ROLE_SERVER;
    struct conn_event *ev = conn_event_reserve(EVENT_CONN_PEER, bpf_ktime_get_ns(), id, conn_id, fd, role);
    if (!ev)
        return 0;
    ev->family = args->family;
    ev->peer_port = args->dport;
    /* Read rather than copied: clang would address the record's arrays through
     * a moved context pointer, which the verifier refuses. */
    if (args->family == 2 /* AF_INET */)
        bpf_core_read(ev->peer_addr, 4, &args->daddr);
    else
        bpf_core_read(ev->peer_addr, 16, &args->daddr_v6);
    return conn_event_submit(ev);
}

/* A TLS session of a target process: the library's handle for it (SSL *,
 * Go's *tls.Conn) and the connection state the classifier keeps, as socks
 * keeps it for a plain socket. */
struct tls_key {
    u32 pid;
    u32 pad;
    u64 session;
};

struct tls_session {
    struct conn_state state;
    s32 fd;          /* the socket under it, -1 where none was found (COUNTER_TLS_UNTIED) */
    u32 pad;
};
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct tls_key);
    __type(value, struct tls_session);
} tls_sessions SEC(".maps");

/* A rustls connection's session key (rustls_socket_of, in "TLS" below), one
 * no pointer can be: user addresses stay below 2^47. */
#define RUSTLS_SESSION(conn_id) ((conn_id) | (1ULL << 63))

/* A rustls session lives as long as its socket (an SSL *'s ends at SSL_free). */
static __always_inline void rustls_session_closed(u32 tgid, u64 conn_id)
{
    struct tls_key key = {.pid = tgid, .session = RUSTLS_SESSION(conn_id)};
    bpf_map_delete_elem(&tls_sessions, &key);
}

/* Which counter a connection that moved bytes nothing recognised goes to:
 * local IPC, TLS ciphertext a hooked library read over (no plaintext came),
 * or traffic inferprobe could not read (analyzers/unread_traffic.py). */
static __always_inline u32 unread_counter(u32 local_ipc, u32 tls_read_over)
{
    if (local_ipc)
        return local_ipc == LOCAL_IPC_SELF_PAIR ? COUNTER_CONNS_SELF_PAIR : COUNTER_CONNS_LOCAL_IPC;
    return tls_read_over ? COUNTER_CONNS_TLS_NO_PLAINTEXT : COUNTER_CONNS_UNRECOGNISED;
}

static __always_inline void h2_connection_closed(u64 conn_id);   /* the HTTP/2 section below */
static __always_inline void zmtp_connection_closed(u64 conn_id);   /* the engine IPC section below */

SEC("tracepoint/syscalls/sys_enter_close")
int sys_enter_close(struct trace_event_raw_sys_enter *args)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_target(tgid))
        return 0;
    struct sock_key key = {.pid = tgid, .fd = (s32)args->args[0]};
    host_wide_tally_close(tgid, key.fd);
    bpf_map_delete_elem(&peer_wanted, &key);   /* the fd's next life is another connection */
    struct conn_state *state = bpf_map_lookup_elem(&socks, &key);
    if (!state) {
        /* A thread may still have it cached as a connection: socks is an
         * LRU and may have evicted the entry. The fd's next life must not
         * inherit that copy. */
        socks_changed(tgid, key.fd);
        return 0;
    }
    u64 conn_id = state->conn_id;
    /* A TLS session's close is its socket's: its requests end here too. */
    u32 carried_http = state->http_seen || state->tls;
    u32 unrecognised = state->unrecognised;
    u32 local_ipc = state->local_ipc;
    u32 tls_read_over = state->tls_read_over;
    u32 client = state->client;
    if (state->h2 || state->tls)   /* a TLS session's frames are walked under its socket's id */
        h2_connection_closed(conn_id);
    if (state->tls)
        rustls_session_closed(tgid, conn_id);
    if (state->zmtp == ZMTP_FOLLOWED)
        zmtp_connection_closed(conn_id);
    bpf_map_delete_elem(&socks, &key);
    socks_changed(tgid, key.fd);
    if (!carried_http) {
        count(COUNTER_IO_SKIPPED);
        if (unrecognised)
            count(unread_counter(local_ipc, tls_read_over));
        return 0;
    }
    struct conn_event *ev = conn_event_reserve(EVENT_CONN_CLOSE, bpf_ktime_get_ns(), id, conn_id,
                                               key.fd, client ? CONN_ROLE_CLIENT : CONN_ROLE_SERVER);
    return ev ? conn_event_submit(ev) : 0;
}

/* ---------------------------------------------------------------- read / write
 *
 * Entry stores the arguments per thread. Exit fills the event in per-CPU
 * scratch and hands it down a short chain of tail calls (a few ns each), so
 * that each program verifies on its own:
 *   sys_exit_* [-> gather_iovecs] -> classify_request  -> scan_header_block -> submit
 *                                 -> classify_response -> scan_header_block -> scan_body -> submit
 *                                                   -> scan_body (no status line) -> submit
 *              (the HTTP/2 preface) classify_request -> h2_frames [-> h2_frames ...]
 *   sys_exit_* of an HTTP/2 connection              -> h2_frames [-> h2_frames ...]
 * Code after a scan loop is walked by the verifier once per way out of the
 * loop, so what follows the loops is kept small; and each scan is its own
 * program because verifying one costs ~0.1 s of start-up (inlined into
 * classify_response, the body scan made that one program take a second). The
 * iovec copy is a program of its own for the same reason: inlined, its loop
 * was verified in each of the eight exit programs, and eight iovecs instead
 * of four took start-up from 1.5 to 2.8 s. Its step per iovec is now a
 * global function (gather_step), verified once, which is what lets one
 * window take sixteen iovecs.
 */
enum classify_prog {
    PROG_CLASSIFY_REQUEST = 0,
    PROG_CLASSIFY_RESPONSE = 1,
    PROG_SCAN_HEADER_BLOCK = 2,
    PROG_SCAN_BODY = 3,
    PROG_GATHER_IOVECS = 4,
    PROG_GATHER_WINDOW = 5,
    PROG_SCAN_FIELDS = 6,
    PROG_SCAN_TRACE_CONTEXT = 7,
    PROG_H2_FRAMES = 8,
    PROG_SCAN_EVENT_STREAM = 9,
    PROG_SCAN_ZMTP = 10,
    PROG_COUNT = 11,
};
struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, PROG_COUNT);
    __type(key, u32);
    __type(value, u32);
} classifiers SEC(".maps");

/* The same chain for the TLS probes' plaintext: uprobes are kprobe-type
 * programs, and the kernel lets a program tail-call only programs of its
 * own type, so each chain program is loaded twice (CHAIN_PROGRAM below)
 * and each copy calls on through the array of its kind. */
struct {
    __uint(type, BPF_MAP_TYPE_PROG_ARRAY);
    __uint(max_entries, PROG_COUNT);
    __type(key, u32);
    __type(value, u32);
} classifiers_tls SEC(".maps");

/* An SSL_read/SSL_write (or Go Read/Write) under way, from its entry probe
 * to its return probe: per thread for OpenSSL; per goroutine for Go, which
 * may resume on another thread after blocking. */
enum tls_caller { TLS_CALLER_THREAD = 0, TLS_CALLER_GOROUTINE = 1 };
/* What a call's return value is: the byte count (SSL_read, Go's n), 1 with
 * the count stored through len_out (SSL_read_ex), or Rust's io::Result<usize>
 * (rustls: a tag, 0 for Ok, then the count; in RAX:RDX, or through len_out
 * where an older rustc returned it through a hidden pointer). */
enum tls_result { TLS_RESULT_COUNT = 0, TLS_RESULT_COUNT_OUT = 1, TLS_RESULT_RUST = 2 };

struct tls_call_key {
    u32 pid;
    u32 caller;      /* enum tls_caller */
    u64 id;          /* the tid, or the goroutine (g pointer) */
};

struct tls_call {
    u64 session;
    u64 buf;
    u64 len_out;     /* SSL_read_ex/SSL_write_ex: where the library stores the byte count; rustls from an
                      * older rustc: where its Result goes (TLS_RESULT_RUST); else 0 */
    u64 ts_ns;
    u32 dir;
    s32 fd;          /* the socket, where the library's structures name it (Go), else -1 */
    u32 result;      /* enum tls_result: how the call's return says how many bytes moved */
    u32 pad;
};
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct tls_call_key);
    __type(value, struct tls_call);
} tls_calls SEC(".maps");

/* A tail call to the next program of the chain a program belongs to: the
 * syscall chain, or (tls) the TLS probes' copy of it. tls is a constant in
 * every program, so each copy refers to its own array only. */
static __always_inline void chain_call(void *ctx, int tls, u32 prog)
{
    if (tls) {
        bpf_tail_call(ctx, &classifiers_tls, prog);
        return;
    }
    bpf_tail_call(ctx, &classifiers, prog);
}

/* A program of the chain: chain_<name>(ctx, tls) is its body; the syscall
 * chain loads <name>, the TLS probes' chain <name>_tls (left unloaded while
 * the TLS set is off). Neither is attached anywhere: the loader puts them in
 * their arrays (collector/attach/probe_sets/sockets.py). */
#define CHAIN_PROGRAM(name)                                                             \
    SEC("tracepoint") int name(void *ctx) { return chain_##name(ctx, 0); }             \
    SEC("uprobe") int name##_tls(struct pt_regs *ctx) { return chain_##name(ctx, 1); }

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
    struct conn_state state = {};
    if (!lookup_conn(io, tgid, fd, &state)) {
        if (state.tally_only) {
            u64 now = bpf_ktime_get_ns();
            note_tls_carrier(io, fd, dir, now);   /* so that its TLS session is known unsampled too */
            tally_pending(io, now, fd, dir);
        } else {
            io->ts_ns = 0;   /* nothing in flight, whatever an earlier syscall left */
        }
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    note_tls_carrier(io, fd, dir, now);
    if (state.tls) {
        /* ciphertext: the TLS probes read this connection's plaintext; its turns are still tallied */
        if (host_wide_tallied(tgid, fd))
            tally_pending(io, now, fd, dir);
        else
            io->ts_ns = 0;
        return 0;
    }
    fill_pending(io, now, buf, vlen, fd, dir, is_msghdr, &state);
    pending_commit(id, io);
    return 0;
}

/* The state of the connection an event is about, in the socket table or,
 * for TLS plaintext, the session table: what the chain programs change
 * once they know more of it (http_seen, body), each followed by
 * conn_changed() so no thread's cache misses it. */
static __always_inline struct conn_state *event_conn(struct scratch *s)
{
    if (s->tls_session) {
        struct tls_key tkey = {.pid = s->ev.hdr.pid, .session = s->tls_session};
        struct tls_session *session = bpf_map_lookup_elem(&tls_sessions, &tkey);
        return session ? &session->state : 0;
    }
    struct sock_key key = {.pid = s->ev.hdr.pid, .fd = s->ev.fd};
    return bpf_map_lookup_elem(&socks, &key);
}

/* After a change to event_conn(s): threads cache socket entries, not
 * sessions (those are looked up on every library call). */
static __always_inline void conn_changed(struct scratch *s)
{
    if (!s->tls_session)
        socks_changed(s->ev.hdr.pid, s->ev.fd);
}

/* A connection the target connect()ed (a socket, not TLS plaintext) whose
 * first request-half bytes are neither a request line, nor the HTTP/2
 * preface, nor a TLS record (whose plaintext the TLS probes may yet read):
 * a call to a database, a cache, an RPC backend. It is dropped from socks
 * and counted as unrecognised now, so that each of its later syscalls costs
 * a thread-cache hit instead of the classifier (benchmarks/
 * bench_backend_calls.py). Accepted connections keep being read: a proxy's
 * PROXY-protocol line, say, may come before keep-alive requests. */
static __always_inline int gives_up_on(struct scratch *s)
{
    if (!s->request_side || s->tls_session || s->ev.role != CONN_ROLE_CLIENT)
        return 0;
    u8 first = s->head[0], second = s->n > 1 ? s->head[1] : 0;
    if (first >= 0x14 && first <= 0x17 && second == 0x03)
        return 0;   /* a TLS record: handshake, alert, change cipher spec or data */
    struct sock_key key = {.pid = s->ev.hdr.pid, .fd = s->ev.fd};
    struct conn_state *state = bpf_map_lookup_elem(&socks, &key);
    u32 local_ipc = state && state->local_ipc;
    if (bpf_map_delete_elem(&socks, &key) != 0)
        return 0;
    socks_changed(key.pid, key.fd);
    count(unread_counter(local_ipc, 0));
    return 1;
}

/* The last step of every chain: until a connection has carried a request
 * line its traffic is not HTTP we can use (database clients, IPC sockets),
 * so it is dropped here; otherwise the event goes to the ring buffer. A
 * client's status line counts as well: its request write is classified at
 * the write's return, and a thread preempted between the socket write and
 * that return (Go's crypto/tls Write on a busy host) finds the response's
 * first read already returned. User space orders the two by when their
 * bytes moved (collector/ingest/sessionizer.py effect_order). */
static __always_inline int opens_http(struct io_event *ev)
{
    return ev->kind == HTTP_KIND_REQUEST || (ev->kind == HTTP_KIND_RESPONSE && ev->role == CONN_ROLE_CLIENT);
}

static __always_inline int submit(struct scratch *s)
{
    struct io_event *ev = &s->ev;
    if (!s->http_seen) {
        if (!opens_http(ev)) {
            count(COUNTER_IO_SKIPPED);
            if (ev->bytes > 0 && gives_up_on(s))
                return 0;
            /* Bytes nothing recognised: close() counts the connection
             * (COUNTER_CONNS_UNRECOGNISED) unless TLS plaintext or a request
             * line turns up on it later. */
            struct conn_state *state = event_conn(s);
            if (state && !state->unrecognised && ev->bytes > 0)
                state->unrecognised = 1;
            return 0;
        }
        struct conn_state *state = event_conn(s);
        if (state) {
            state->http_seen = 1;
            conn_changed(s);
        }
    }
    if (ev->kind == HTTP_KIND_REQUEST)
        count(COUNTER_REQUESTS);
    return send_event(ev, sizeof(*ev));
}

static __always_inline struct scratch *get_scratch(void)
{
    u32 zero = 0;
    return bpf_map_lookup_elem(&scratch_area, &zero);
}

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

static __always_inline int classify_io(void *ctx, u64 id, struct pending_io io, long ret, u64 now, int tls);

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
    u64 now = bpf_ktime_get_ns();
    if (ret > 0 && !io.client)
        host_wide_tally(id >> 32, io.fd, io.dir, io.dir == DIR_READ ? now : io.ts_ns);
    if (io.tally_only)
        return 0;
    return classify_io(ctx, id, io, ret, now, 0);
}

/* Reads at their exit only, where the kernel lets a program read the
 * thread's saved user registers (reads_at_exit, set above). A read's entry
 * tells nothing its exit cannot: a request's ingress is when its read
 * returned, and the arguments are still in those registers (the syscall
 * ABI, as recover_in_flight reads them). So the read syscalls get no entry
 * program: one program run less on every read of every process on the
 * host, which is most of what a process nobody traces pays (a load client
 * reads ten times per request). Writes keep theirs: a token's time is when
 * its write began, ~8 us before a loopback write returns. */
static __always_inline int read_exit(void *ctx, long ret, u16 vectored, u16 is_msghdr)
{
#ifdef HAVE_TASK_PT_REGS
    if (reads_at_exit) {
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
            s32 *listed = bpf_map_lookup_elem(&reads_at_attach, &tid);
            if (listed) {
                blocked_fd = *listed;
                bpf_map_delete_elem(&reads_at_attach, &tid);
            }
        }
        struct conn_state state = {};
        s32 fd;
        struct pt_regs *regs = syscall_on_connection(thread, tgid, &state, &fd);
        if (!regs)
            return 0;
        u64 now = bpf_ktime_get_ns(), start = now;
        if (ret > 0 && !state.client)
            host_wide_tally(tgid, fd, DIR_READ, now);
        if (ret > 0)
            note_tls_carrier(&thread->io, fd, DIR_READ, now);
        if (state.tally_only)
            return 0;
        if (state.tls)
            return 0;   /* ciphertext: the TLS probes read this connection's plaintext */
        if (fd == blocked_fd) {
            if (!open_at_attach(&state))
                return 0;
            start = 0;   /* begun unseen: classify_io times it at the exit and flags it */
        }
        struct pending_io io;
        fill_pending(&io, start, BPF_CORE_READ(regs, si), vectored ? (u32)BPF_CORE_READ(regs, dx) : 0, fd, DIR_READ, is_msghdr, &state);
        return classify_io(ctx, id, io, ret, now, 0);
    }
#endif
    return io_exit(ctx, ret, DIR_READ, vectored, is_msghdr);
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

/* The reads' entries: left unloaded where reads_at_exit. */
SEC("tracepoint/syscalls/sys_enter_read")
int sys_enter_read(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], 0, DIR_READ, 0); }
SEC("tracepoint/syscalls/sys_enter_readv")
int sys_enter_readv(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], args->args[2], DIR_READ, 0); }
SEC("tracepoint/syscalls/sys_enter_recvfrom")
int sys_enter_recvfrom(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], 0, DIR_READ, 0); }
SEC("tracepoint/syscalls/sys_enter_recvmsg")
int sys_enter_recvmsg(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], 0, DIR_READ, 1); }
SEC("tracepoint/syscalls/sys_exit_read")
int sys_exit_read(struct trace_event_raw_sys_exit *args) { return read_exit(args, args->ret, 0, 0); }
SEC("tracepoint/syscalls/sys_exit_readv")
int sys_exit_readv(struct trace_event_raw_sys_exit *args) { return read_exit(args, args->ret, 1, 0); }
SEC("tracepoint/syscalls/sys_exit_recvfrom")
int sys_exit_recvfrom(struct trace_event_raw_sys_exit *args) { return read_exit(args, args->ret, 0, 0); }
SEC("tracepoint/syscalls/sys_exit_recvmsg")
int sys_exit_recvmsg(struct trace_event_raw_sys_exit *args) { return read_exit(args, args->ret, 0, 1); }
SEC("tracepoint/syscalls/sys_enter_write")
int sys_enter_write(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], 0, DIR_WRITE, 0); }
SEC("tracepoint/syscalls/sys_exit_write")
int sys_exit_write(struct trace_event_raw_sys_exit *args) { return io_exit(args, args->ret, DIR_WRITE, 0, 0); }
SEC("tracepoint/syscalls/sys_enter_writev")
int sys_enter_writev(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], args->args[2], DIR_WRITE, 0); }
SEC("tracepoint/syscalls/sys_exit_writev")
int sys_exit_writev(struct trace_event_raw_sys_exit *args) { return io_exit(args, args->ret, DIR_WRITE, 1, 0); }
SEC("tracepoint/syscalls/sys_enter_sendto")
int sys_enter_sendto(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], 0, DIR_WRITE, 0); }
SEC("tracepoint/syscalls/sys_exit_sendto")
int sys_exit_sendto(struct trace_event_raw_sys_exit *args) { return io_exit(args, args->ret, DIR_WRITE, 0, 0); }
SEC("tracepoint/syscalls/sys_enter_sendmsg")
int sys_enter_sendmsg(struct trace_event_raw_sys_enter *args) { return io_enter(args->args[0], (u64)args->args[1], 0, DIR_WRITE, 1); }
SEC("tracepoint/syscalls/sys_exit_sendmsg")
int sys_exit_sendmsg(struct trace_event_raw_sys_exit *args) { return io_exit(args, args->ret, DIR_WRITE, 0, 1); }

/* ---------------------------------------------------------------- TLS: plaintext at the library boundary
 *
 * Uprobes on the TLS library (collector/attach/probe_sets/tls.py attaches them)
 * hand the plaintext of each SSL_read/SSL_write to the same chain as a
 * socket syscall's bytes, through its kprobe-type copy (classifiers_tls):
 * one classifier, whatever carried the bytes. As for sockets, the bytes
 * stay in the per-CPU scratch area; only derived fields leave the kernel.
 *
 * Timing: an SSL_write's event is stamped at the call's entry, when the
 * plaintext was handed over (a token's moment, as a socket write's entry
 * is); its wire_ns is when the socket write inside the call began, where
 * the library wrote to the socket itself. An SSL_read's is its return,
 * when the plaintext was there for the application.
 *
 * The socket under a session (tls_session_of), in this order: the fd the
 * library's structures name (Go), the first tracked socket the thread
 * touched inside the call (a socket BIO), or for a read the socket the
 * thread read last (a memory BIO: asyncio, Node). Its conn_id becomes the
 * session's, so requests keep their connection's peer, network data and
 * close; the socket is marked tls and its ciphertext is skipped from then
 * on. A session whose socket cannot be found gets an id of its own
 * (COUNTER_TLS_UNTIED). */

/* The socket a TLS call's ciphertext moved over: the fd the library's
 * structures name, the first socket touched inside the call (a socket BIO),
 * or for a read the socket the thread read last (a memory BIO). */
static __always_inline s32 tls_carrier_fd(struct tls_call *call, s32 nested_fd, s32 last_read_fd)
{
    return call->fd >= 0 ? call->fd : nested_fd >= 0 ? nested_fd : call->dir != DIR_WRITE ? last_read_fd : -1;
}

/* The socket a TLS read (or handshake step) read over, where it is one that
 * is neither tied to a session yet nor carrying plain HTTP; its fd in *fd. */
static __always_inline struct conn_state *tls_read_carrier(u32 tgid, struct tls_call *call, s32 nested_fd,
                                                           s32 last_read_fd, s32 *fd)
{
    if (call->dir == DIR_WRITE)
        return 0;
    *fd = tls_carrier_fd(call, nested_fd, last_read_fd);
    if (*fd < 0)
        return 0;
    struct sock_key skey = {.pid = tgid, .fd = *fd};
    struct conn_state *sock = bpf_map_lookup_elem(&socks, &skey);
    return sock && !sock->tls && !sock->http_seen ? sock : 0;
}

/* A session left untied at its first call, a client's write over a memory
 * BIO (Node's and asyncio's clients encrypt the request into memory and
 * write the ciphertext after the call returns, so no socket is in sight),
 * is tied at its first read: the socket the thread read the answer's
 * ciphertext from. Its requests already carry the session's own id, so the
 * socket takes that id, and EVENT_TLS_TIED tells user space which (pid, fd)
 * it was: the connection opened there gives the requests its peer and
 * connect times (collector/ingest/sessionizer.py), and its ciphertext is no longer
 * "unrecognised" traffic. Only a socket not yet under TLS nor carrying plain
 * HTTP qualifies, of the session's role, or accepted (below). */
static __always_inline void tls_tie_late(u32 tgid, struct tls_session *session, struct tls_call *call,
                                         s32 nested_fd, s32 last_read_fd)
{
    s32 fd = -1;
    struct conn_state *sock = tls_read_carrier(tgid, call, nested_fd, last_read_fd, &fd);
    if (!sock)
        return;
    if (sock->client != session->state.client) {
        /* The session's role was a guess from its first call, a write: HTTP/1's client
         * speaks first. An HTTP/2 server speaks first too, its SETTINGS (Node's http2
         * over TLS, when it writes them before it reads the client's preface): an
         * accepted socket, fresh, says the session is its server's. */
        if (sock->client)
            return;
        session->state.client = 0;
    }
    sock->conn_id = session->state.conn_id;
    sock->tls = 1;
    session->fd = fd;
    socks_changed(tgid, fd);
    struct conn_event *ev = conn_event_reserve(EVENT_TLS_TIED, bpf_ktime_get_ns(), bpf_get_current_pid_tgid(),
                                               session->state.conn_id, fd,
                                               session->state.client ? CONN_ROLE_CLIENT : CONN_ROLE_SERVER);
    if (ev)
        conn_event_submit(ev);
}

/* A TLS call that moved no plaintext (a memory BIO's handshake steps inside
 * SSL_read, Node's; a read that would block): the socket it read over is
 * marked tls_read_over, so that if it never carries plaintext (a pool's
 * connection opened ahead and left unused) it is counted as TLS with
 * nothing to read, not as traffic inferprobe could not read. Only a flag
 * for that count: the socket's bytes are still classified, and the session
 * is tied at its first plaintext as before. */
static __always_inline void tls_note_carrier(u32 tgid, struct tls_call *call, s32 nested_fd, s32 last_read_fd)
{
    s32 fd = -1;
    struct conn_state *sock = tls_read_carrier(tgid, call, nested_fd, last_read_fd, &fd);
    if (sock && !sock->tls_read_over)
        sock->tls_read_over = 1;
}

static __always_inline struct tls_session *tls_session_of(u32 tgid, struct tls_call *call, s32 nested_fd,
                                                          s32 last_read_fd)
{
    struct tls_key key = {.pid = tgid, .session = call->session};
    struct tls_session *session = bpf_map_lookup_elem(&tls_sessions, &key);
    if (session) {
        if (session->fd < 0) {
            tls_tie_late(tgid, session, call, nested_fd, last_read_fd);
            return session;
        }
        /* Still over the socket it was tied to? A handle freed and reused by
         * a later session (a Go *tls.Conn after garbage collection) is not. */
        struct sock_key skey = {.pid = tgid, .fd = session->fd};
        struct conn_state *sock = bpf_map_lookup_elem(&socks, &skey);
        if (sock && sock->conn_id == session->state.conn_id)
            return session;
    }
    /* A memory BIO's read, or handshake, follows the thread's read of the ciphertext. */
    s32 fd = tls_carrier_fd(call, nested_fd, last_read_fd);
    struct tls_session fresh = {.fd = -1};
    if (fd >= 0) {
        struct sock_key skey = {.pid = tgid, .fd = fd};
        struct conn_state *sock = bpf_map_lookup_elem(&socks, &skey);
        if (sock) {
            fresh.state.conn_id = sock->conn_id;
            fresh.state.client = sock->client;
            fresh.fd = fd;
            if (!sock->tls) {
                sock->tls = 1;
                socks_changed(tgid, fd);
            }
        } else if (host_wide_tallied(tgid, fd)) {
            return 0;   /* over a connection the agent's sample left out: only its socket is tallied */
        }
    }
    if (fresh.fd < 0 && call->dir == DIR_HANDSHAKE)
        return 0;   /* no socket to time it for, nor a role yet: the first read or write says */
    if (fresh.fd < 0) {
        if (!new_conn_id(&fresh.state.conn_id))
            return 0;
        /* Which end it is, from HTTP/1's order: the client speaks first. */
        fresh.state.client = call->dir == DIR_WRITE;
        count(COUNTER_TLS_UNTIED);
    }
    bpf_map_update_elem(&tls_sessions, &key, &fresh, BPF_ANY);
    return bpf_map_lookup_elem(&tls_sessions, &key);
}

/* rustls has no library: it is compiled into each Rust program, and it
 * moves no bytes itself (the program calls read_tls/write_tls on its own
 * socket). Its plaintext is read at <Reader as io::Read>::read and
 * <Writer as io::Write>::write, whose receivers borrow the connection: the
 * first word of each (Reader.received_plaintext, Writer.sink) is a pointer
 * into it, stable while the connection lives but not the same for the two
 * halves. Each pointer is tied, when first seen moving plaintext, to the
 * socket the thread read last: the ciphertext just read for a read, the
 * handshake's or the request's last read for a write, the way every rustls
 * I/O driver (tokio-rustls, its blocking StreamOwned, hyper-rustls) runs
 * one connection's turn on one thread. Both halves then share the socket's
 * session, keyed by its connection id (RUSTLS_SESSION), so a response is
 * classified against the request its connection read. */
struct rustls_key {
    u32 pid;
    u32 pad;
    u64 ptr;
};
struct rustls_conn {
    u64 conn_id;
    s32 fd;
    u32 pad;
};
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, struct rustls_key);
    __type(value, struct rustls_conn);
} rustls_conns SEC(".maps");

/* The socket under a rustls call's connection pointer: remembered, while it
 * is still the same connection, or else the one the thread read last (then
 * remembered). Sets the call's session and fd; 0 where no socket is known. */
static __always_inline int rustls_socket_of(u32 tgid, struct tls_call *call, s32 last_read_fd)
{
    struct rustls_key key = {.pid = tgid, .ptr = call->session};
    struct rustls_conn conn = {.fd = -1};
    struct rustls_conn *known = bpf_map_lookup_elem(&rustls_conns, &key);
    if (known)
        conn = *known;
    struct sock_key skey = {.pid = tgid, .fd = conn.fd};
    struct conn_state *sock = conn.fd >= 0 ? bpf_map_lookup_elem(&socks, &skey) : 0;
    if (!sock || sock->conn_id != conn.conn_id) {
        /* First seen, or the connection it named closed and the memory was
         * reused. A socket that carried plain HTTP is never a rustls
         * connection's: a gateway that read a request from its client and
         * writes it on over a new rustls connection keeps both. */
        skey.fd = last_read_fd;
        sock = last_read_fd >= 0 ? bpf_map_lookup_elem(&socks, &skey) : 0;
        if (!sock || (sock->http_seen && !sock->tls)) {
            count(COUNTER_TLS_UNTIED);
            return 0;
        }
        conn.fd = last_read_fd;
        conn.conn_id = sock->conn_id;
        bpf_map_update_elem(&rustls_conns, &key, &conn, BPF_ANY);
    }
    call->session = RUSTLS_SESSION(conn.conn_id);
    call->fd = conn.fd;
    return 1;
}

static __always_inline int tls_call_begin(u32 caller, u64 caller_id, u64 session, u64 buf, u64 len_out,
                                          u16 dir, s32 fd, u32 result)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid) || !session)
        return 0;
    struct tls_call_key key = {.pid = tgid, .caller = caller, .id = caller_id};
    struct tls_call call = {.session = session, .buf = buf, .len_out = len_out, .ts_ns = bpf_ktime_get_ns(),
                            .dir = dir, .fd = fd, .result = result};
    if (bpf_map_update_elem(&tls_calls, &key, &call, BPF_ANY) != 0) {
        count(COUNTER_IO_UNTRACKED);
        return 0;
    }
#ifdef PENDING_IN_TASK_STORAGE
    if (caller == TLS_CALLER_THREAD) {
        struct thread_io *thread = bpf_task_storage_get(&pending_task, bpf_get_current_task_btf(), 0,
                                                                 BPF_LOCAL_STORAGE_GET_F_CREATE);
        if (thread) {
            thread->tls_in_call = 1;
            thread->tls_nested_fd = -1;
            thread->tls_wire_ns = 0;
        }
    }
#endif
    return 0;
}

/* A handshake that completed (it returned 1; a memory BIO's returns
 * WANT_READ until then): an event with the time, for the connect -> TLS ->
 * request sum of an outbound call (analyzers/client_calls.py). */
static __always_inline int tls_handshake_done(u32 tgid, u64 id, struct tls_call *call, s32 nested_fd,
                                              s32 last_read_fd)
{
    struct tls_session *session = tls_session_of(tgid, call, nested_fd, last_read_fd);
    if (!session)
        return 0;
    struct conn_event *ev = conn_event_reserve(EVENT_TLS_HANDSHAKE, bpf_ktime_get_ns(), id,
                                               session->state.conn_id, session->fd,
                                               session->state.client ? CONN_ROLE_CLIENT : CONN_ROLE_SERVER);
    return ev ? conn_event_submit(ev) : 0;
}

/* The call's return: `ret` is what the function returned (bytes, or 1 for
 * the _ex forms, which store the count through len_out), `ret2` the second
 * return register (a Rust Result's count). */
static __always_inline int tls_call_end(void *ctx, u32 caller, u64 caller_id, long ret, u64 ret2)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_target(tgid))
        return 0;
    struct tls_call_key key = {.pid = tgid, .caller = caller, .id = caller_id};
    struct tls_call *found = bpf_map_lookup_elem(&tls_calls, &key);
    if (!found)
        return 0;
    struct tls_call call = *found;
    bpf_map_delete_elem(&tls_calls, &key);
    s32 nested_fd = -1, last_read_fd = -1;
    u64 wire_ns = 0;
#ifdef PENDING_IN_TASK_STORAGE
    if (caller == TLS_CALLER_THREAD) {
        struct thread_io *thread = bpf_task_storage_get(&pending_task, bpf_get_current_task_btf(), 0, 0);
        if (thread) {
            nested_fd = thread->tls_nested_fd;
            wire_ns = thread->tls_wire_ns;
            last_read_fd = thread->last_read_fd - 1;
            thread->tls_in_call = 0;
        }
    }
#endif
    if (call.dir == DIR_HANDSHAKE) {
        if (ret == 1)
            return tls_handshake_done(tgid, id, &call, nested_fd, last_read_fd);
        tls_note_carrier(tgid, &call, nested_fd, last_read_fd);   /* a step that did not finish it */
        return 0;
    }
    long bytes = ret;
    if (call.result == TLS_RESULT_COUNT_OUT) {
        u64 n = 0;
        if (ret == 1)
            bpf_probe_read_user(&n, sizeof(n), (void *)call.len_out);
        bytes = ret == 1 ? (long)n : 0;
    } else if (call.result == TLS_RESULT_RUST) {
        u64 result[2] = {ret, ret2};
        if (call.len_out && bpf_probe_read_user(result, sizeof(result), (void *)call.len_out))
            result[0] = 1;
        bytes = (u8)result[0] == 0 ? (long)result[1] : 0;
    }
    if (bytes <= 0) {
        /* would block, close_notify, an error: no plaintext moved */
        tls_note_carrier(tgid, &call, nested_fd, last_read_fd);
        return 0;
    }
    if (call.result == TLS_RESULT_RUST && !rustls_socket_of(tgid, &call, last_read_fd))
        return 0;
    struct tls_session *session = tls_session_of(tgid, &call, nested_fd, last_read_fd);
    if (!session)
        return 0;
    struct pending_io io = {};
    fill_pending(&io, call.ts_ns, call.buf, 0, session->fd, call.dir, 0, &session->state);
    io.session = call.session;
    io.wire_ns = call.dir == DIR_WRITE ? wire_ns : 0;
    return classify_io(ctx, id, io, bytes, bpf_ktime_get_ns(), 1);
}

/* OpenSSL 1.1 and 3.x: int SSL_read(SSL *, void *, int), SSL_write(SSL *,
 * const void *, int); int SSL_read_ex(SSL *, void *, size_t, size_t *),
 * SSL_write_ex(...): 1 on success. One return program for all four: the
 * call record says which it was. */
static __always_inline u64 current_tid(void)
{
    return (u32)bpf_get_current_pid_tgid();
}

/* (SSL *, buf, num[, size_t *count]): the count's pointer is the _ex forms' fourth argument. */
static __always_inline int openssl_call_begin(struct pt_regs *ctx, u16 dir, int ex)
{
    return tls_call_begin(TLS_CALLER_THREAD, current_tid(), PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx),
                          ex ? PT_REGS_PARM4(ctx) : 0, dir, -1, ex ? TLS_RESULT_COUNT_OUT : TLS_RESULT_COUNT);
}

SEC("uprobe")
int tls_ssl_read_enter(struct pt_regs *ctx) { return openssl_call_begin(ctx, DIR_READ, 0); }
SEC("uprobe")
int tls_ssl_read_ex_enter(struct pt_regs *ctx) { return openssl_call_begin(ctx, DIR_READ, 1); }
SEC("uprobe")
int tls_ssl_write_enter(struct pt_regs *ctx) { return openssl_call_begin(ctx, DIR_WRITE, 0); }
SEC("uprobe")
int tls_ssl_write_ex_enter(struct pt_regs *ctx) { return openssl_call_begin(ctx, DIR_WRITE, 1); }

SEC("uprobe")
int tls_ssl_return(struct pt_regs *ctx)
{
    return tls_call_end(ctx, TLS_CALLER_THREAD, current_tid(), (long)(int)PT_REGS_RC(ctx), 0);
}

/* int SSL_do_handshake(SSL *), SSL_connect(SSL *), SSL_accept(SSL *): 1 once done. */
SEC("uprobe")
int tls_ssl_handshake_enter(struct pt_regs *ctx)
{
    return tls_call_begin(TLS_CALLER_THREAD, current_tid(), PT_REGS_PARM1(ctx), 0, 0, DIR_HANDSHAKE, -1,
                          TLS_RESULT_COUNT);
}

/* rustls: <Reader as io::Read>::read(&mut self, buf: &mut [u8]) and
 * <Writer as io::Write>::write(&mut self, buf: &[u8]), both returning
 * io::Result<usize>: the receiver, the buffer's address and length in the
 * first three argument registers, the Result in RAX:RDX. Code from an older
 * rustc returns the Result through a hidden first argument instead, which
 * shifts the others by one: the _sret programs (collector/binaries/
 * tls_libraries.py tells which from the code). The session is the
 * connection pointer the receiver holds first (rustls_socket_of). */
static __always_inline int rustls_call_begin(u64 self, u64 buf, u64 result_slot, u16 dir)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 conn = 0;
    if (!is_target(tgid) || bpf_probe_read_user(&conn, sizeof(conn), (void *)self))
        return 0;
    return tls_call_begin(TLS_CALLER_THREAD, current_tid(), conn, buf, result_slot, dir, -1, TLS_RESULT_RUST);
}

SEC("uprobe")
int tls_rustls_read_enter(struct pt_regs *ctx)
{
    return rustls_call_begin(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, DIR_READ);
}
SEC("uprobe")
int tls_rustls_write_enter(struct pt_regs *ctx)
{
    return rustls_call_begin(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, DIR_WRITE);
}
SEC("uprobe")
int tls_rustls_read_enter_sret(struct pt_regs *ctx)
{
    return rustls_call_begin(PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), PT_REGS_PARM1(ctx), DIR_READ);
}
SEC("uprobe")
int tls_rustls_write_enter_sret(struct pt_regs *ctx)
{
    return rustls_call_begin(PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), PT_REGS_PARM1(ctx), DIR_WRITE);
}
SEC("uprobe")
int tls_rustls_return(struct pt_regs *ctx)
{
    return tls_call_end(ctx, TLS_CALLER_THREAD, current_tid(), (long)ctx->ax, ctx->dx);
}

/* void SSL_free(SSL *): its handle may come back for another connection. */
SEC("uprobe")
int tls_ssl_free(struct pt_regs *ctx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid))
        return 0;
    struct tls_key key = {.pid = tgid, .session = PT_REGS_PARM1(ctx)};
    struct tls_session *session = bpf_map_lookup_elem(&tls_sessions, &key);
    if (session && session->state.h2)
        h2_connection_closed(session->state.conn_id);
    bpf_map_delete_elem(&tls_sessions, &key);
    return 0;
}
/* Go crypto/tls: (*Conn).Read and (*Conn).Write, at their entry and at each
 * of their return instructions (never a uretprobe: it breaks goroutine
 * stacks), under Go's register ABI (collector/binaries/go_binary.py): the receiver
 * in RAX, the buffer in RBX, n in RAX at the return, the goroutine in R14.
 * The fd comes from the *tls.Conn itself, through the struct offsets user
 * space read from the binary's DWARF, per process. */
struct go_tls_offsets {
    u32 tls_conn_conn;   /* crypto/tls.Conn.conn, a net.Conn interface */
    u32 iface_data;      /* its data pointer: the *net.TCPConn */
    u32 tcp_conn_conn;   /* net.TCPConn's embedded net.conn */
    u32 conn_fd;         /* net.conn.fd: *net.netFD */
    u32 netfd_pfd;       /* net.netFD.pfd: internal/poll.FD */
    u32 pfd_sysfd;       /* internal/poll.FD.Sysfd: the fd, a Go int */
};
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u32);
    __type(value, struct go_tls_offsets);
} go_tls_offsets SEC(".maps");

static __always_inline s32 go_conn_fd(u32 tgid, u64 conn)
{
    struct go_tls_offsets *off = bpf_map_lookup_elem(&go_tls_offsets, &tgid);
    if (!off)
        return -1;
    u64 tcp_conn = 0, netfd = 0;
    s64 sysfd = -1;
    if (bpf_probe_read_user(&tcp_conn, sizeof(tcp_conn), (void *)(conn + off->tls_conn_conn + off->iface_data)) ||
        bpf_probe_read_user(&netfd, sizeof(netfd), (void *)(tcp_conn + off->tcp_conn_conn + off->conn_fd)) ||
        bpf_probe_read_user(&sysfd, sizeof(sysfd), (void *)(netfd + off->netfd_pfd + off->pfd_sysfd)))
        return -1;
    return sysfd >= 0 && sysfd < 0x7fffffff ? (s32)sysfd : -1;
}

static __always_inline int go_tls_enter(struct pt_regs *ctx, u16 dir)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!is_target(tgid))
        return 0;
    return tls_call_begin(TLS_CALLER_GOROUTINE, ctx->r14, ctx->ax, ctx->bx, 0, dir, go_conn_fd(tgid, ctx->ax),
                          TLS_RESULT_COUNT);
}

SEC("uprobe")
int tls_go_read_enter(struct pt_regs *ctx) { return go_tls_enter(ctx, DIR_READ); }
SEC("uprobe")
int tls_go_write_enter(struct pt_regs *ctx) { return go_tls_enter(ctx, DIR_WRITE); }

SEC("uprobe")
int tls_go_return(struct pt_regs *ctx)
{
    return tls_call_end(ctx, TLS_CALLER_GOROUTINE, ctx->r14, (long)ctx->ax, 0);
}

/* ---------------------------------------------------------------- the parts of other probe sets */
#include "net.bpf.c"        /* the network set: when the bytes leave the host */
#include "host_wide.bpf.c"  /* the host-wide set: adoption, sampling and tallies */

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
 * This file holds the maps and the syscall hooks, read top to bottom: the
 * connection table, pending I/O, accept, connect and close, then the read
 * and write hooks. Two parts of the same object follow, in files of their
 * own: the tail-call chain that classifies a syscall's bytes
 * (classifier_chain.bpf.c), and the TLS library probes, which hand their
 * plaintext to the chain's kprobe-type copy (tls.bpf.c). How bytes are read
 * is in the headers beside this file (scratch, scan_bytes, gather,
 * body_windows), and what they mean in bpf/protocols/, one protocol each,
 * all working on struct scratch. A new protocol is a header there plus a
 * branch in classify_request and classify_response, where the chain
 * dispatches on a syscall's first bytes.
 */
#include "common.bpf.h"
#include "process_tree.bpf.h"   /* the target set follows fork() and exit */
#include "scratch.bpf.h"        /* struct scratch: what the chain's programs share */
#include "scan_bytes.bpf.h"     /* word-at-a-time comparisons and loads */
#include "protocols/http1.bpf.h"          /* request line, status line, header block */
#include "protocols/sse.bpf.h"            /* SSE lines of a body window */
#include "protocols/stream_fields.bpf.h"  /* the JSON fields a stream states about itself */
#include "protocols/event_stream.bpf.h"   /* AWS event streams (Bedrock): messages of a body window */
#include "protocols/stream_end.bpf.h"     /* how a write ends: its last bytes */
#include "protocols/chunk_framing.bpf.h"  /* chunk framing known from iovec lengths */
#include "gather.bpf.h"         /* a syscall's bytes into the head: buffer or iovecs */
#include "body_windows.bpf.h"   /* a long write, a window at a time */
#include "protocols/http2.bpf.h"          /* HTTP/2 frames, across syscalls and iovecs */
#include "protocols/trace_context.bpf.h"  /* W3C traceparent / tracestate values of a request */
#include "protocols/zmtp.bpf.h"           /* ZeroMQ between an engine's processes (vLLM's API server and EngineCore) */

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

/* ---------------------------------------------------------------- the classifier chain and the TLS probes
 *
 * classifier_chain.bpf.c: classify_io and the tail-call programs the hooks
 * above hand a syscall's bytes to (HTTP/1, HTTP/2 frames, engine IPC, trace
 * context); tls.bpf.c: the TLS libraries' uprobes, which hand their
 * plaintext to the chain's copy. Parts of this object, not objects of their
 * own: every program works on the maps above. */
#include "classifier_chain.bpf.c"
#include "tls.bpf.c"

/* ---------------------------------------------------------------- the parts of other probe sets */
#include "net.bpf.c"        /* the network set: when the bytes leave the host */
#include "host_wide.bpf.c"  /* the host-wide set: adoption, sampling and tallies */

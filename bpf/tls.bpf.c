/* tls.bpf.c: the TLS set's uprobes, a part of sock.bpf.c.
 *
 * Included by sock.bpf.c after the classifier chain, whose copy
 * (classifiers_tls) these probes hand plaintext to; not an object of its
 * own, for the same maps. Loaded only with the TLS set on
 * (collector/attach/probe_sets/tls.py).
 */

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

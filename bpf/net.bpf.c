/* net.bpf.c: when the bytes of a traced connection leave the host.
 *
 * Tracepoints only (no kprobes), and only their arguments: no kernel struct
 * is read. The problem is that the transmit tracepoints (net:net_dev_queue,
 * net:net_dev_xmit) name an skb and a device but no socket, and the TCP
 * tracepoint that names a socket on the receive path (tcp:tcp_probe) fires
 * for incoming segments. A TCP data segment of socket S is transmitted in
 * one of three contexts, and two of them tell us S:
 *
 *   1. inside the server's own write()/send() on S (nothing held back):
 *      the writing thread has a pending write in sock.bpf.c's `pending` map,
 *      which names the connection;
 *   2. right after an incoming ACK on S released held data (Nagle, a full
 *      congestion or receive window): tcp_probe fires for S at the start of
 *      the receive processing, and the transmit follows on the same CPU in
 *      the same softirq (or in release_sock() of the socket's owner);
 *   3. from a timer (retransmission, tail-loss probe) or the TCP small-queues
 *      tasklet: not attributed (retransmissions are counted on their own).
 *
 * So tcp_probe leaves a per-CPU note "the last segment received here was on
 * S at time t"; net_dev_queue ties an skb to a connection by case 1 or 2 and
 * remembers it by skb address; net_dev_xmit (the driver took it) sends one
 * event with both times. A socket is learned as S from sock:sock_send_length
 * and sock:sock_recv_length, which fire in the target's thread while
 * sock.bpf.c's pending map still says which connection that thread is on.
 *
 * Part of sock.bpf.o: sock.bpf.c includes it at its end (it reads the
 * pending I/O through pending_peek, struct pending_io and DIR_WRITE). Its
 * programs are loaded only with the network set on (collector/attach/
 * probe_sets/network.py); the tracepoint records' fields are relocated for
 * the running kernel (CO-RE).
 */

/* A transmit counts as ACK-clocked only this soon after tcp_probe on the
 * same CPU: the call chain from tcp_rcv_established() to dev_queue_xmit()
 * takes microseconds; a longer gap means the note is stale. */
#define NET_ACK_WINDOW_NS 200000ULL

#define TCP_STATE_CLOSE 7

struct net_sock_info {
    u64 conn_id;
    u32 pid;
    u32 _pad;
};

struct net_cpu_note {
    u64 conn_id;     /* 0: the last segment received on this CPU was on an untraced socket */
    u64 ts_ns;
    u32 pid;         /* the target owning conn_id */
    u32 retransmit;  /* tcp_retransmit_skb fired for conn_id and its transmit is still to come */
};

struct net_queued {
    u64 conn_id;
    u64 queue_ns;
    u32 pid;
    u16 via;
    u16 flags;
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);
    __type(value, struct net_sock_info);
} net_socks SEC(".maps");   /* struct sock * -> conn */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);
    __type(value, struct net_queued);
} net_skbs SEC(".maps");       /* skb * -> segment */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct net_cpu_note);
} net_cpu SEC(".maps");

static __always_inline void net_fill_header(struct event_header *hdr, u32 type, u64 ts_ns, u32 pid)
{
    /* Most of these fire in softirq context, where "current" is whatever
     * task was interrupted: the target pid comes from the socket instead. */
    hdr->type = type;
    hdr->pid = pid;
    hdr->tid = 0;
    hdr->cpu = bpf_get_smp_processor_id();
    hdr->ts_ns = ts_ns;
}

static __always_inline int net_learn_socket(u64 sk, int ret)
{
    if (ret <= 0)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    struct pending_io *io = pending_peek(id);
    if (!io || !io->conn_id)
        return 0;
    struct net_sock_info info = {.conn_id = io->conn_id, .pid = id >> 32};
    bpf_map_update_elem(&net_socks, &sk, &info, BPF_ANY);
    return 0;
}

SEC("tracepoint/sock/sock_send_length")
int sock_send_length(struct trace_event_raw_sock_msg_length *args)
{
    if (args->protocol != 6 /* IPPROTO_TCP */)
        return 0;
    return net_learn_socket((u64)args->sk, args->ret);
}

SEC("tracepoint/sock/sock_recv_length")
int sock_recv_length(struct trace_event_raw_sock_msg_length *args)
{
    if (args->protocol != 6 /* IPPROTO_TCP */)
        return 0;
    return net_learn_socket((u64)args->sk, args->ret);
}

/* Socket addresses are reused once freed: forget a socket when it closes so
 * that a later, unrelated socket at the same address is not taken for it.
 * Called from sock.bpf.c's sock:inet_sock_set_state program (one program per
 * tracepoint in an object), while net_socket_state is on. */
static __always_inline void net_socket_state_changed(u64 sk, int newstate)
{
    if (newstate == TCP_STATE_CLOSE)
        bpf_map_delete_elem(&net_socks, &sk);
}

SEC("tracepoint/tcp/tcp_probe")
int tcp_probe(struct trace_event_raw_tcp_probe *args)
{
    u64 now = bpf_ktime_get_ns();
    u64 sk = (u64)args->skaddr;
    struct net_sock_info *info = bpf_map_lookup_elem(&net_socks, &sk);
    u32 zero = 0;
    struct net_cpu_note *note = bpf_map_lookup_elem(&net_cpu, &zero);
    if (note) {
        note->conn_id = info ? info->conn_id : 0;
        note->pid = info ? info->pid : 0;
        note->ts_ns = now;
        note->retransmit = 0;
    }
    if (!info)
        return 0;
    struct net_ack_event ev = {};
    net_fill_header(&ev.hdr, EVENT_NET_ACK, now, info->pid);
    ev.conn_id = info->conn_id;
    ev.snd_nxt = args->snd_nxt;
    ev.snd_una = args->snd_una;
    ev.snd_cwnd = args->snd_cwnd;
    ev.ssthresh = args->ssthresh;
    ev.snd_wnd = args->snd_wnd;
    ev.srtt_us = args->srtt;
    ev.rcv_wnd = args->rcv_wnd;
    ev.data_len = args->data_len;
    return send_event(&ev, sizeof(ev));
}

SEC("tracepoint/tcp/tcp_retransmit_skb")
int tcp_retransmit_skb(struct trace_event_raw_tcp_retransmit_skb *args)
{
    u64 sk = (u64)args->skaddr;
    struct net_sock_info *info = bpf_map_lookup_elem(&net_socks, &sk);
    if (!info)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 zero = 0;
    struct net_cpu_note *note = bpf_map_lookup_elem(&net_cpu, &zero);
    if (note) {
        /* The retransmitted skb is queued right after this, on this CPU. */
        note->conn_id = info->conn_id;
        note->pid = info->pid;
        note->ts_ns = now;
        note->retransmit = 1;
    }
    struct net_retransmit_event ev = {};
    net_fill_header(&ev.hdr, EVENT_NET_RETRANSMIT, now, info->pid);
    ev.conn_id = info->conn_id;
    ev.state = args->state;
    if (bpf_core_field_exists(args->err))   /* Linux 6.9+ */
        ev.err = args->err;
    return send_event(&ev, sizeof(ev));
}

SEC("tracepoint/net/net_dev_queue")
int net_dev_queue(struct trace_event_raw_net_dev_template *args)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 zero = 0;
    struct net_cpu_note *note = bpf_map_lookup_elem(&net_cpu, &zero);
    if (!note)
        return 0;
    struct net_queued q = {.queue_ns = now};
    struct pending_io *io = pending_peek(id);
    if (io && note->ts_ns > io->ts_ns) {
        /* A segment was received on this CPU after this thread's write
         * began: we are in a softirq run on top of the write (loopback and
         * veth deliver in place), and the note is the better witness. */
        io = 0;
    }
    if (io && io->dir == DIR_WRITE) {
        q.conn_id = io->conn_id;
        q.pid = id >> 32;
        q.via = NET_VIA_WRITE;
    } else if (note->conn_id && now - note->ts_ns < NET_ACK_WINDOW_NS) {
        q.conn_id = note->conn_id;
        q.pid = note->pid;
        q.via = NET_VIA_ACK;
        if (note->retransmit) {
            q.flags |= NET_FLAG_RETRANSMIT;
            note->retransmit = 0;
        }
    }
    if (!q.conn_id)
        return 0;
    u64 skb = (u64)args->skbaddr;
    bpf_map_update_elem(&net_skbs, &skb, &q, BPF_ANY);
    count(COUNTER_NET_QUEUED);
    return 0;
}

SEC("tracepoint/net/net_dev_xmit")
int net_dev_xmit(struct trace_event_raw_net_dev_xmit *args)
{
    u64 skb = (u64)args->skbaddr;
    struct net_queued *found = bpf_map_lookup_elem(&net_skbs, &skb);
    if (!found)
        return 0;
    struct net_queued q = *found;
    bpf_map_delete_elem(&net_skbs, &skb);
    count(COUNTER_NET_XMITTED);
    struct net_xmit_event ev = {};
    net_fill_header(&ev.hdr, EVENT_NET_XMIT, bpf_ktime_get_ns(), q.pid);
    ev.conn_id = q.conn_id;
    ev.queue_ns = q.queue_ns;
    ev.len = args->len;
    ev.rc = args->rc;
    ev.via = q.via;
    ev.flags = q.flags;
    /* __data_loc: the low 16 bits are the string's offset in the record. */
    u32 name_at = args->__data_loc_name & 0xFFFF;
    bpf_probe_read_kernel_str(ev.dev, sizeof(ev.dev), (void *)args + name_at);
    return send_event(&ev, sizeof(ev));
}

/* host_wide.bpf.c: `record --all` and `agent`: which processes become targets
 * without a pid from the user.
 *
 * A process is adopted (its bit set in common.bpf.h's `targets`) when it
 * starts to serve a stream socket: when it puts a TCP socket into LISTEN
 * (sock:inet_sock_set_state fires in the listen() caller's context, with
 * the local port) or when it accept()s (TCP or Unix stream: accept() only
 * works on connection-oriented sockets, so a successful accept is the
 * kernel's own test of that). From then on it is a target like a `-p` pid:
 * its children follow by fork, its I/O goes through sock.bpf.c, and the
 * classifier keeps only connections whose first bytes are a request line.
 * Processes already listening when tracing starts are found in /proc by
 * collector/processes/host_wide.py; the same module releases adopted processes that
 * serve only non-HTTP connections (host_wide_rejected below).
 *
 * Cost when nothing matches: the hot hooks (read, write, close, sched) are
 * untouched and still turn a non-target away with one array lookup; the
 * filter below runs only on listen() and on accept() of a process that is
 * not yet a target, both rare next to reads and writes.
 *
 * Sampling (the agent's CPU budget): each new accepted connection of a
 * target is followed in full or only counted, decided here by a hash of its
 * connection id against a threshold user space moves (host_wide_config).
 * Unfollowed connections get no socket-table entry, so their I/O costs the
 * target-path lookup only and sends nothing.
 *
 * Part of sock.bpf.o: sock.bpf.c includes it at its end, declares the hooks
 * below, and calls them where a process listens or accepts and where a
 * connection moves bytes. Each hook returns at once while host_wide_on (a
 * read-only setting the loader writes) is 0, and the verifier then drops it.
 */

#define HOST_WIDE_MAX_PORTS 16
#define HOST_WIDE_COMM_LEN 16

struct host_wide_config {
    u32 self_tgid;          /* the recorder itself (it may serve /metrics): never adopted */
    u32 n_ports;            /* 0: any port; otherwise only listeners on these local ports */
    u16 ports[HOST_WIDE_MAX_PORTS];
    u32 comm_len;           /* 0: any process name; otherwise an exact task comm */
    char comm[HOST_WIDE_COMM_LEN];
    u64 cgroup_id;          /* 0: any cgroup; otherwise a cgroup v2 id ... */
    u32 cgroup_level;       /* ... at this depth of the current task's ancestry */
    u32 follow_threshold;   /* connections followed: hash(conn_id) < this (0xffffffff: all) */
};

struct host_wide_adoption {
    u64 ts_ns;
    u16 port;               /* the listener's local port (0: unknown, an accept) */
    u16 how;                /* HOST_WIDE_LISTEN or HOST_WIDE_ACCEPT (sock.bpf.c) */
    u32 _pad;
};

enum host_wide_counter {
    HOST_WIDE_CONNS_ACCEPTED = 0,   /* connections targets accepted (every one, followed or not) */
    HOST_WIDE_CONNS_FOLLOWED = 1,   /* of which followed in full */
    HOST_WIDE_ADOPTED = 2,          /* processes adopted */
    HOST_WIDE_FILTERED = 3,         /* listen/accept by a process the filters turned away */
    HOST_WIDE_COUNTER_MAX = 4,
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct host_wide_config);
} host_wide_config SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, HOST_WIDE_COUNTER_MAX);
    __type(key, u32);
    __type(value, u64);
} host_wide_counters SEC(".maps");
/* Adopted since attach; user space reads and deletes entries as it lists them. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, u32);
    __type(value, struct host_wide_adoption);
} host_wide_adopted SEC(".maps");
/* Released by user space (no HTTP seen on its connections): never adopted again. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, u32);
    __type(value, u32);
} host_wide_rejected SEC(".maps");

static __always_inline void host_wide_count(u32 index)
{
    u64 *value = bpf_map_lookup_elem(&host_wide_counters, &index);
    if (value)
        *value += 1;
}

static __always_inline int host_wide_passes(struct host_wide_config *cfg, u32 tgid, u16 port)
{
    if (tgid == cfg->self_tgid || bpf_map_lookup_elem(&host_wide_rejected, &tgid))
        return 0;
    if (cfg->n_ports) {
        int found = 0;
#pragma unroll
        for (int i = 0; i < HOST_WIDE_MAX_PORTS; i++)
            if (i < cfg->n_ports && cfg->ports[i] == port && port)
                found = 1;
        if (!found)
            return 0;
    }
    if (cfg->comm_len) {
        char comm[HOST_WIDE_COMM_LEN] = {};
        bpf_get_current_comm(comm, sizeof(comm));
#pragma unroll
        for (int i = 0; i < HOST_WIDE_COMM_LEN; i++)
            if (comm[i] != cfg->comm[i])
                return 0;
    }
    if (cfg->cgroup_id && bpf_get_current_ancestor_cgroup_id(cfg->cgroup_level) != cfg->cgroup_id)
        return 0;
    return 1;
}

/* Makes the current process a target if the filters let it; 1 when it is one now.
 * port: the local port of the socket it listens on, 0 when unknown (accept),
 * which no --port filter matches. */
static __always_inline int host_wide_adopt(u32 tgid, u16 port, u16 how)
{
    if (!host_wide_on)
        return 0;
    u32 zero = 0;
    struct host_wide_config *cfg = bpf_map_lookup_elem(&host_wide_config, &zero);
    if (!cfg)
        return 0;
    if (!host_wide_passes(cfg, tgid, port)) {
        host_wide_count(HOST_WIDE_FILTERED);
        return 0;
    }
    add_target(tgid);
    /* The thread that listens or accepts is the one whose syscalls follow. */
    add_target((u32)bpf_get_current_pid_tgid());
    struct host_wide_adoption adoption = {.ts_ns = bpf_ktime_get_ns(), .port = port, .how = how};
    bpf_map_update_elem(&host_wide_adopted, &tgid, &adoption, BPF_ANY);
    host_wide_count(HOST_WIDE_ADOPTED);
    return 1;
}

/* Whether the target's new accepted connection is followed in full. */
static __always_inline int host_wide_follow(u64 conn_id)
{
    if (!host_wide_on)
        return 1;
    u32 zero = 0;
    struct host_wide_config *cfg = bpf_map_lookup_elem(&host_wide_config, &zero);
    host_wide_count(HOST_WIDE_CONNS_ACCEPTED);
    /* A multiplicative hash spreads consecutive ids over the range. */
    u32 hash = (u32)((conn_id * 0x9E3779B97F4A7C15ULL) >> 32);
    if (cfg && cfg->follow_threshold != 0xffffffffU && hash >= cfg->follow_threshold)
        return 0;
    host_wide_count(HOST_WIDE_CONNS_FOLLOWED);
    return 1;
}

/* ---------------------------------------------------------------- tallies
 *
 * Exact counts and latency histograms for every connection a target
 * accepts after attach, followed in full or not: under the agent's CPU
 * budget only a sample is followed, and these keep what the sample cannot,
 * the true totals and distributions (exported by collector/
 * connection_tallies.py). They are kept at the syscall level, so that they
 * need no parsing, cost one hash update per read or write that moved
 * bytes, and hold for TLS ciphertext as for plaintext:
 *
 *   a turn begins when a read returns request bytes after the last turn's
 *   response writes (or as the connection's first read), and is the
 *   response writes that follow until the next such read or close.
 *
 * On HTTP/1.x one turn is one request and its response (keep-alive
 * included). On HTTP/2 and other multiplexed protocols turns are not
 * requests: the tallies say how the connection's traffic alternated, and
 * the followed sample's own request metrics are the ones to read there.
 * A read is timed at its exit (when the request bytes were there), a write
 * at its entry, as the full path times them. Turn state lives per (process,
 * fd); a turn still open when its process exits without close() is never
 * counted. */

#define TALLY_BUCKETS 64   /* log2 of nanoseconds: bucket k holds values in [2^(k-1), 2^k) */

enum tally_histogram {
    TALLY_TURN_NS = 0,          /* a turn's first request read to its last response write */
    TALLY_FIRST_WRITE_NS = 1,   /* its first request read to its first response write */
    TALLY_WRITE_GAP_NS = 2,     /* between consecutive response writes of one turn */
    TALLY_HISTOGRAMS = 3,
};

enum tally_counter {
    TALLY_CONNECTIONS = 0,      /* accepted connections tallied */
    TALLY_TURNS = 1,            /* turns answered by at least one write */
    TALLY_UNANSWERED = 2,       /* turns closed with no response write */
    TALLY_WRITES = 3,           /* response writes */
    TALLY_COUNTERS = 4,
};

struct tally_turn {
    u64 start_ns;        /* 0: no request read yet on this connection */
    u64 first_write_ns;
    u64 last_write_ns;
    u32 writes;
    u32 pad;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, TALLY_HISTOGRAMS * TALLY_BUCKETS);
    __type(key, u32);
    __type(value, u64);
} tally_buckets SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, TALLY_HISTOGRAMS);
    __type(key, u32);
    __type(value, u64);
} tally_sums_ns SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, TALLY_COUNTERS);
    __type(key, u32);
    __type(value, u64);
} tally_counters SEC(".maps");
/* As large as socks: every live connection of the targets can be tallied. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct sock_key);
    __type(value, struct tally_turn);
} tally_turns SEC(".maps");

static __always_inline void tally_count(u32 index)
{
    u64 *value = bpf_map_lookup_elem(&tally_counters, &index);
    if (value)
        *value += 1;
}

static __always_inline void tally_observe(u32 histogram, u64 ns)
{
    /* bucket k holds [2^(k-1), 2^k), 0 in bucket 1: bcc's bpf_log2l(), which made the
     * recordings' histograms before the move to libbpf */
    u32 bucket = log2_floor(ns) + 1;
    if (bucket >= TALLY_BUCKETS)
        bucket = TALLY_BUCKETS - 1;
    u32 index = histogram * TALLY_BUCKETS + bucket;
    u64 *count = bpf_map_lookup_elem(&tally_buckets, &index);
    if (count)
        *count += 1;
    u64 *sum = bpf_map_lookup_elem(&tally_sums_ns, &histogram);
    if (sum)
        *sum += ns;
}

/* A turn is over: into the histograms, or counted unanswered. */
static __always_inline void tally_fold(struct tally_turn *turn)
{
    if (!turn->start_ns)
        return;
    if (!turn->writes) {
        tally_count(TALLY_UNANSWERED);
        return;
    }
    tally_count(TALLY_TURNS);
    tally_observe(TALLY_TURN_NS, turn->last_write_ns - turn->start_ns);
    tally_observe(TALLY_FIRST_WRITE_NS, turn->first_write_ns - turn->start_ns);
}

static __always_inline void host_wide_tally_open(u32 tgid, s32 fd)
{
    if (!host_wide_on)
        return;
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct tally_turn fresh = {};
    bpf_map_update_elem(&tally_turns, &key, &fresh, BPF_ANY);
    tally_count(TALLY_CONNECTIONS);
}

static __always_inline int host_wide_tallied(u32 tgid, s32 fd)
{
    if (!host_wide_on)
        return 0;
    struct sock_key key = {.pid = tgid, .fd = fd};
    return bpf_map_lookup_elem(&tally_turns, &key) != 0;
}

/* A read that returned bytes (t_ns: its exit) or a write (t_ns: its entry). */
static __always_inline void host_wide_tally(u32 tgid, s32 fd, u16 dir, u64 t_ns)
{
    if (!host_wide_on)
        return;
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct tally_turn *turn = bpf_map_lookup_elem(&tally_turns, &key);
    if (!turn)
        return;
    if (dir == DIR_READ) {
        if (turn->start_ns && !turn->writes)
            return;   /* more of the same request */
        tally_fold(turn);
        turn->start_ns = t_ns;
        turn->writes = 0;
        return;
    }
    if (dir != DIR_WRITE || !turn->start_ns)
        return;   /* a write before any request (a server's greeting) starts no turn */
    if (turn->writes)
        tally_observe(TALLY_WRITE_GAP_NS, t_ns - turn->last_write_ns);
    else
        turn->first_write_ns = t_ns;
    turn->last_write_ns = t_ns;
    turn->writes += 1;
    tally_count(TALLY_WRITES);
}

static __always_inline void host_wide_tally_close(u32 tgid, s32 fd)
{
    if (!host_wide_on)
        return;
    struct sock_key key = {.pid = tgid, .fd = fd};
    struct tally_turn *turn = bpf_map_lookup_elem(&tally_turns, &key);
    if (!turn)
        return;
    tally_fold(turn);
    bpf_map_delete_elem(&tally_turns, &key);
}

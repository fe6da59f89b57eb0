/* inferprobe.h: every event the BPF programs send to user space.
 *
 * This is the one place the byte layout of an event is defined. It is
 * included by the BPF programs (built ahead by clang, scripts/build_bpf.sh); scripts/gen_layout.py
 * compiles it with the host C compiler and writes its structs, enums and
 * integer #defines into collector/model/layout_generated.py, the Python mirror
 * (rerun it after any change here: tests/collector/test_layout_generated.py
 * fails until then).
 *
 * Rules: fixed-width __u/__s types only, every struct opens with
 * struct event_header, no pointers, explicit padding, no bitfields.
 */
#ifndef INFERPROBE_H
#define INFERPROBE_H

/* The BPF programs have vmlinux.h's types; the host compiler (gen_layout.py) takes linux/types.h. */
#if !defined(__KERNEL__) && !defined(__VMLINUX_H__)
#include <linux/types.h>
#endif

#define INFERPROBE_LAYOUT_VERSION 5

/* How much of a socket buffer the kernel side looks at to classify it. The
 * bytes stay in a per-CPU scratch buffer: only derived fields (method, path,
 * status, lengths, counts, flags) are copied into an event. */
#define SCAN_HEAD_BYTES 512
#define SCAN_TAIL_BYTES 64
/* How far bpf/sock.bpf.c scans a long write for token events (user space and
 * the tests read these too). Windows scanned after the first in a long plain
 * write, each SCAN_HEAD_BYTES with WINDOW_OVERLAP of the one before:
 * 512 + 24 * 480 = 12032 bytes, about forty OpenAI-size events a server
 * coalesced into one write when the client read slowly. Each window is one
 * more tail call (the kernel allows 33 per chain) and ~0.23 us: 30 events
 * in one 8.7 KB write cost 4.3 us in its
 * exit program, one event alone 0.38 us, so the coalesced write still costs
 * less than the 30 it replaces (measured with kernel.bpf_stats_enabled). */
#define MAX_BODY_WINDOWS 24
/* A vectored write's windows take two tail calls each (scan_body and
 * gather_window): after the four before the first body scan, twelve fit in
 * the 33 the kernel allows: 6272 bytes. */
#define MAX_VECTORED_WINDOWS 12
/* A window starts this many bytes before the one before ends, so that a line
 * start cut by the end of one ("data: [DONE]" is 12 bytes) and a JSON count
 * ("completion_tokens":1234567 is 27) are whole in the next. */
#define WINDOW_OVERLAP 32
#define PATH_MAX_BYTES 64
/* A longer path keeps its ends: its first PATH_HEAD_BYTES and its last
 * PATH_MAX_BYTES - PATH_HEAD_BYTES, with path_len its whole length (layout
 * 5), for the end names the operation (Bedrock's /model/<model id>/invoke-
 * with-response-stream). Its end is looked for within PATH_SCAN_BYTES; a
 * path running past that keeps its first PATH_MAX_BYTES only. */
#define PATH_HEAD_BYTES 32
#define PATH_SCAN_BYTES 255
/* The request body's "model" value and a named SSE event's name: protocol
 * identifiers, never prompt or completion text (docs/report-json.md). */
#define MODEL_MAX_BYTES 64
#define EVENT_NAME_MAX_BYTES 32

/* Each probe set owns a range of type numbers so that sets can grow
 * independently: 1-15 sockets and USDT, 16-31 locks and scheduling,
 * 32-47 stacks and profiling, 48-63 GPU, 64-79 network. */
enum event_type {
    EVENT_CONN_OPEN = 1,   /* accept()/accept4() returned a socket, or a target connect()ed one (ts: the call) */
    EVENT_CONN_CLOSE = 2,  /* close() of a tracked socket */
    EVENT_SOCK_READ = 3,   /* read-family syscall on a tracked socket */
    EVENT_SOCK_WRITE = 4,  /* write-family syscall on a tracked socket */
    EVENT_USDT = 5,        /* an inferprobe USDT probe fired in the server */
    EVENT_CONN_CONNECTED = 6, /* a client connection's TCP handshake completed (sock:inet_sock_set_state) */
    EVENT_CONN_PEER = 9,   /* the peer of an accepted connection whose accept() gave no address, at its first read */
    EVENT_TLS_HANDSHAKE = 7,  /* a TLS handshake on a connection completed (SSL_do_handshake & co. returned 1) */
    EVENT_TLS_TIED = 10,   /* a TLS session untied at its first call (a client's write over a memory BIO) was
                            * tied to its socket at its first read: conn_id is the session's, fd the socket's */
    EVENT_CPU_SAMPLE = 32,    /* one on-CPU stack sample (only with per-phase tagging) */
    EVENT_OFFCPU_SAMPLE = 33, /* one off-CPU period of a target thread (ditto) */
    EVENT_NET_XMIT = 64,   /* a segment of a traced connection reached the device (net.bpf.c) */
    EVENT_NET_ACK = 65,    /* tcp:tcp_probe on a traced connection: an incoming segment */
    EVENT_NET_RETRANSMIT = 66, /* tcp:tcp_retransmit_skb on a traced connection */
    EVENT_FUTEX_WAIT = 16, /* a target thread waited in futex() at least the floor */
    EVENT_OFFCPU = 17,     /* a target thread was off CPU at least the floor */
    EVENT_GPU_CALL = 48,     /* a CUDA wait, copy, allocation or query call returned */
    EVENT_GPU_LAUNCHES = 49, /* a run of kernel/graph launches on one thread (gpu_launches_event) */
    EVENT_GPU_FENCE_WAIT = 50, /* dma_fence_wait_start .. _end in a target thread */
    EVENT_GPU_DRM_JOB = 51,  /* gpu_scheduler:drm_sched_job: a target thread queued a GPU job */
    EVENT_LLAMA_STEP = 80,   /* llama.cpp: one llama_decode() call, entry or return (llama.bpf.c) */
    EVENT_H2_FRAMES = 96,    /* the HTTP/2 frames one syscall (or TLS call) carried (h2_frames_event) */
    EVENT_H2_HEADER_PIECE = 97, /* a piece of a header block: h2_header_pieces ring only, never recorded */
    EVENT_H2_HEADERS = 98,   /* a header block's listed fields, decoded in user space (h2_headers_event) */
    EVENT_TRACE_CONTEXT = 8, /* a request's W3C traceparent / tracestate header values (trace_context_event) */
    EVENT_GPU_API = 52,      /* CUPTI shim: a launch/copy/memset API call entered, with its correlation id */
    EVENT_GPU_ACTIVITY = 53, /* CUPTI shim: one kernel, copy or memset as the GPU ran it (gpu_activity_event) */
    EVENT_GPU_CLOCK = 54,    /* CUPTI shim: a CUPTI timestamp paired with CLOCK_MONOTONIC */
    EVENT_GPU_KERNEL_NAME = 55, /* CUPTI shim: a kernel name id's name */
    EVENT_GPU_SHIM_STATUS = 56, /* CUPTI shim: what it is doing (collecting, no device, ...), one sentence */
    EVENT_H2_CONN_CLOSED = 99,  /* an HTTP/2 connection closed: h2_header_pieces ring only (h2_conn_closed) */
    EVENT_ENGINE_IPC = 11,   /* what crossed an engine's ZeroMQ connection between its processes (engine_ipc_event) */
};

/* The USDT probes of provider "inferprobe" (probes/, docs/usdt-probes.md).
 * usdt_event.args holds the probe's arguments in their documented order;
 * unused slots are 0. */
enum usdt_probe {
    USDT_REQUEST_START = 1,     /* req_id, prompt_tokens, conn_fd */
    USDT_REQUEST_QUEUED = 2,    /* req_id, queue_depth */
    USDT_REQUEST_SCHEDULED = 3, /* req_id, batch_size */
    USDT_PREFILL_START = 4,     /* req_id, prompt_tokens */
    USDT_PREFILL_END = 5,       /* req_id, prompt_tokens */
    USDT_DECODE_STEP_START = 6, /* step_id, batch_size, tokens_in_batch */
    USDT_DECODE_STEP_END = 7,   /* step_id, batch_size, tokens_in_batch */
    USDT_TOKEN_EMIT = 8,        /* req_id, token_index */
    USDT_REQUEST_END = 9,       /* req_id, output_tokens, status */
    USDT_QUEUE_DEPTH = 10,      /* waiting, running */
    USDT_KV_USAGE = 11,         /* used, capacity */
};
#define USDT_MAX_ARGS 3

/* What the first bytes of a socket buffer were. */
enum http_kind {
    HTTP_KIND_DATA = 0,         /* continuation: body bytes or unparsed */
    HTTP_KIND_REQUEST = 1,      /* starts with "<METHOD> <path> HTTP/1.x" */
    HTTP_KIND_RESPONSE = 2,     /* starts with "HTTP/1.x <status>" */
    HTTP_KIND_EOF = 3,          /* read returned 0: the peer closed its side */
    HTTP_KIND_ERROR = 4,        /* the syscall failed (bytes holds -errno) */
};

enum http_method {
    HTTP_METHOD_UNKNOWN = 0,
    HTTP_METHOD_GET = 1,
    HTTP_METHOD_POST = 2,
    HTTP_METHOD_PUT = 3,
    HTTP_METHOD_DELETE = 4,
    HTTP_METHOD_HEAD = 5,
    HTTP_METHOD_OPTIONS = 6,
    HTTP_METHOD_PATCH = 7,
};

/* io_event.flags */
#define HTTP_FLAG_HEADERS_END    0x0001 /* the blank line ending the headers was inside the scan window */
#define HTTP_FLAG_CHUNKED        0x0002 /* Transfer-Encoding: chunked */
#define HTTP_FLAG_EVENT_STREAM   0x0004 /* Content-Type: text/event-stream */
#define HTTP_FLAG_SSE_DONE       0x0008 /* "data: [DONE]" in this write */
#define HTTP_FLAG_CHUNKED_END    0x0010 /* the last chunk "0\r\n\r\n" ends this write */
#define HTTP_FLAG_CONN_CLOSE     0x0020 /* Connection: close */
#define HTTP_FLAG_HAS_LENGTH     0x0040 /* content_length is valid */
#define HTTP_FLAG_VECTORED       0x0080 /* readv/writev/sendmsg/recvmsg: the first MAX_IOVECS iovecs were scanned */
#define HTTP_FLAG_BEGAN_UNSEEN   0x0100 /* the syscall was under way when tracing began: ts_ns is its exit */
#define HTTP_FLAG_NDJSON_STREAM  0x0200 /* Content-Type: application/x-ndjson, ndjson, jsonl, x-jsonlines */
#define HTTP_FLAG_LAST_CHUNK     0x0400 /* the last chunk's "0\r\n" line, without the blank line that ends the body */
#define HTTP_FLAG_BLANK_LINE_END 0x0800 /* the write ends with an empty line ("\r\n\r\n", or is "\r\n" alone) */
#define HTTP_FLAG_OUTPUT_TOKENS  0x1000 /* output_tokens holds a count the stream states */
#define HTTP_FLAG_INPUT_TOKENS   0x2000 /* input_tokens holds a count the stream states */
#define HTTP_FLAG_MODEL          0x4000 /* model holds the request body's "model" value */
#define HTTP_FLAG_JSON_DONE      0x8000 /* "done": true in this write, NDJSON's end marker (Ollama) */

/* io_event.stream_flags: stream shapes the sixteen HTTP flags have no room for */
#define STREAM_FLAG_AWS_EVENTS   0x01 /* Content-Type: application/vnd.amazon.eventstream (Bedrock): sse_events
                                       * counts its token messages (bpf/protocols/event_stream.bpf.h) */
#define STREAM_FLAG_EXCEPTION    0x02 /* an event stream message of :message-type exception in this write:
                                       * its :exception-type (e.g. throttlingException) in event_name */

struct event_header {
    __u32 type;     /* enum event_type: must be first */
    __u32 pid;      /* thread group id (what ps calls the pid) */
    __u32 tid;      /* thread id */
    __u32 cpu;
    __u64 ts_ns;    /* CLOCK_MONOTONIC (bpf_ktime_get_ns) at syscall entry */
};

struct conn_event {
    struct event_header hdr;
    __u64 conn_id;      /* unique for the recording; fds get reused, ids do not */
    __s32 fd;
    __u16 family;       /* AF_INET, AF_INET6, AF_UNIX, 0 when unknown */
    __u16 peer_port;    /* host byte order */
    __u8 peer_addr[16]; /* IPv4 in the first 4 bytes, IPv6 in all 16 */
    __u16 role;         /* enum conn_role */
    __u16 local_port;   /* EVENT_CONN_CONNECTED: the client's own port, host order (0: unknown) */
    __s32 result;       /* EVENT_CONN_OPEN of a client: connect()'s return (0, -EINPROGRESS, -errno) */
};

struct io_event {
    struct event_header hdr;
    __u64 conn_id;
    __u64 exit_ns;          /* CLOCK_MONOTONIC at syscall exit */
    __s64 bytes;            /* syscall return: bytes moved, or -errno */
    __s64 content_length;   /* valid when HTTP_FLAG_HAS_LENGTH */
    __s32 fd;
    __u16 kind;             /* enum http_kind */
    __u16 flags;            /* HTTP_FLAG_* */
    __u16 status;           /* HTTP status code for HTTP_KIND_RESPONSE */
    __u16 header_bytes;     /* bytes up to and including the blank line, when HEADERS_END */
    __u16 sse_events;       /* SSE "data:" lines of unnamed or *delta events in the scanned body */
    __u8 method;            /* enum http_method for HTTP_KIND_REQUEST */
    __u8 path_len;          /* over PATH_MAX_BYTES: path holds its two ends (PATH_HEAD_BYTES) */
    char path[PATH_MAX_BYTES]; /* request path without the query string */
    __u32 output_tokens;    /* valid with HTTP_FLAG_OUTPUT_TOKENS: the last such count in the write */
    __u32 input_tokens;     /* valid with HTTP_FLAG_INPUT_TOKENS */
    __u16 json_lines;       /* NDJSON lines (objects or arrays) the write completes */
    __u16 named_events;     /* SSE events named other than *delta (message_start, ping, ...): not tokens */
    __u8 model_len;         /* with HTTP_FLAG_MODEL */
    __u8 event_name_len;    /* the first of the named_events; a request's Host name (http1.bpf.h copy_host) */
    char model[MODEL_MAX_BYTES];
    char event_name[EVENT_NAME_MAX_BYTES];
    __u8 transport;         /* enum transport: what carried the bytes */
    __u8 role;              /* enum conn_role of the connection */
    __u8 retry_count;       /* a request's x-stainless-retry-count value + 1 (SDK retries), 0: none */
    __u8 joined_pieces;     /* earlier reads (writes) of this request's head held and joined in front
                             * of this one's bytes (bpf/sock.bpf.c, request_heads_open); 0: none */
    __u8 stream_flags;      /* STREAM_FLAG_* */
    __u8 pad_retry[5];
    __u64 wire_ns;          /* TLS: CLOCK_MONOTONIC at the start of the first socket syscall of the
                             * library call (the write that carried the plaintext); 0 if none was seen */
    __u64 first_piece_ns;   /* with joined_pieces: when the first piece moved (a read's exit, a write's entry) */
};

/* conn_event.role, io_event.role: which end of the connection the target is. */
enum conn_role {
    CONN_ROLE_SERVER = 0,   /* it accepted the connection: it reads requests and writes responses */
    CONN_ROLE_CLIENT = 1,   /* it connect()ed: it writes requests and reads responses (outbound calls) */
};

/* io_event.transport: who handed the bytes to the classifier. */
enum transport {
    TRANSPORT_SOCKET = 0,   /* a socket syscall: the bytes as they crossed the kernel */
    TRANSPORT_TLS = 1,      /* a TLS library call (OpenSSL SSL_read/SSL_write, Go crypto/tls): plaintext */
};

struct usdt_event {
    struct event_header hdr;
    __u32 probe;            /* enum usdt_probe */
    __u32 nargs;
    __s64 args[USDT_MAX_ARGS];
};

/* ---------------------------------------------------------------- stacks
 * bpf/profile.bpf.c (on-CPU, perf cpu-clock) and bpf/offcpu.bpf.c (sched_switch)
 * count samples per stack_key in the kernel; user space reads the counts and
 * the stack maps once, at stop. When per-phase tagging is asked for, every
 * sample is also streamed as a stack_sample_event (it needs a timestamp). */

/* stack_key.flags */
#define STACK_FLAG_PREEMPTED 0x0001 /* off-CPU: runnable but preempted, not blocked */

struct stack_key {
    __u32 pid;              /* thread group id */
    __u32 tid;
    __s32 user_stack_id;    /* negative: -errno of bpf_get_stackid (no stack) */
    __s32 kernel_stack_id;  /* negative: none (the sample hit user mode) or lost */
    __u32 flags;            /* STACK_FLAG_* */
    __s32 python_stack_id;  /* >0: entry of python_stacks (bpf/python_stacks.bpf.c); 0: no Python
                               frames; <0: -errno, the Python stack was taken but not kept */
};

struct offcpu_value {
    __u64 total_us;         /* blocked time of all the periods, in microseconds */
    __u64 periods;          /* how many off-CPU periods */
};

struct stack_sample_event {
    struct event_header hdr;  /* ts_ns: sample time (on-CPU) or switch-out time (off-CPU) */
    __s32 user_stack_id;
    __s32 kernel_stack_id;
    __u32 flags;              /* STACK_FLAG_* */
    __s32 python_stack_id;    /* as in stack_key */
    __u64 weight;             /* 1 for an on-CPU sample; blocked microseconds off-CPU */
};

/* Indexes of each stack set's own per-CPU counter array (profile_counters,
 * offcpu_counters), so the sets do not spend the shared counters' slots. */
enum stack_counter_index {
    STACK_COUNTER_SAMPLES = 0,     /* samples (or off-CPU periods) of target threads recorded */
    STACK_COUNTER_COLLISIONS = 1,  /* a stack hashed to a slot holding another stack: stack lost */
    STACK_COUNTER_LOST = 2,        /* bpf_get_stackid failed otherwise: user stack missing */
    STACK_COUNTER_KEYS_FULL = 3,   /* the counts table was full: sample dropped */
    STACK_COUNTER_SHORT = 4,       /* off-CPU periods under the threshold: not recorded */
    STACK_COUNTER_UNMATCHED = 5,   /* off-CPU: switch-out state lost (table full) */
    STACK_COUNTER_PYTHON_STACKS = 6,  /* samples that carry a Python stack */
    STACK_COUNTER_PYTHON_LOST = 7,    /* a Python stack taken but not kept (id collision, map full) */
    STACK_COUNTER_MAX = 8,
};

/* net_xmit_event.via: how the segment was tied to its connection. */
enum net_via {
    NET_VIA_WRITE = 1,  /* sent inside the server's own write() on that socket */
    NET_VIA_ACK = 2,    /* sent right after tcp_probe saw an incoming segment on it (ACK clocked) */
};

/* net_xmit_event.flags */
#define NET_FLAG_RETRANSMIT 0x0001  /* tcp_retransmit_skb fired for this socket just before */

#define NET_DEV_NAME_BYTES 16

struct net_xmit_event {
    struct event_header hdr;  /* ts_ns: net:net_dev_xmit (the driver took it); pid: the target */
    __u64 conn_id;
    __u64 queue_ns;           /* net:net_dev_queue: TCP handed it to the device layer */
    __u32 len;                /* frame bytes with every header (a GSO frame: all its segments) */
    __s32 rc;                 /* the driver's return code (0: sent) */
    __u16 via;                /* enum net_via */
    __u16 flags;              /* NET_FLAG_* */
    __u32 _pad;
    char dev[NET_DEV_NAME_BYTES];
};

struct net_ack_event {
    struct event_header hdr;  /* ts_ns: tcp:tcp_probe; pid: the target; tid 0 (softirq) */
    __u64 conn_id;
    __u32 snd_nxt;            /* the values tcp_probe reports, before this segment is processed */
    __u32 snd_una;
    __u32 snd_cwnd;
    __u32 ssthresh;
    __u32 snd_wnd;            /* the peer's receive window, bytes */
    __u32 srtt_us;
    __u32 rcv_wnd;
    __u16 data_len;           /* payload bytes of the incoming segment */
    __u16 _pad;
};

struct net_retransmit_event {
    struct event_header hdr;  /* pid: the target; tid 0 */
    __u64 conn_id;
    __s32 state;              /* TCP state (1 established) */
    __s32 err;                /* tcp_retransmit_skb's result, 0 when sent */
};

/* ------------------------------------------------------------ locks set (16-31)
 * bpf/locks.bpf.c. A wait is streamed only when it lasted at least the floor;
 * shorter ones are summed in kernel maps (exact totals, no events). */

/* Words of user stack the kernel scans for return addresses at a long wait
 * (for the waiter at futex exit, for the waker at its FUTEX_WAKE). Only
 * words that point into the targets' executable mappings leave the kernel:
 * code addresses, never data. */
#define LOCK_SCAN_WORDS 64
#define LOCK_SCAN_HITS 8
#define LOCK_EXEC_GRANULE_SHIFT 16  /* the scan knows code by 64 KiB granule */
#define LOCK_EXEC_GRANULES 262144   /* granules of the targets' executable mappings (16 GiB) */

struct futex_wait_event {
    struct event_header hdr;  /* ts_ns: the wait began (futex entry) */
    __u64 uaddr;              /* the futex word (process-private address) */
    __u64 duration_ns;        /* futex entry to exit */
    __u64 ip;                 /* user instruction pointer at the syscall */
    __u64 waker_ip;           /* the waker's ip at its FUTEX_WAKE (0: unknown) */
    __s32 stack_id;           /* frame-pointer user stack in lock_stacks, <0: none */
    __s32 waker_stack_id;
    __u32 waker_tid;          /* thread whose FUTEX_WAKE on uaddr came last before the exit */
    __u32 op;                 /* futex op with the PRIVATE / CLOCK_REALTIME flags masked */
    __u32 val;                /* the expected value passed to the wait */
    __s32 ret;                /* syscall return: 0, or -errno (-EAGAIN, -ETIMEDOUT, -EINTR) */
    __u16 nscan;              /* valid entries in scan[] */
    __u16 waker_nscan;
    __u32 flags;              /* FUTEX_WAIT_FLAG_* */
    __u64 scan[LOCK_SCAN_HITS];        /* candidate return addresses, innermost first */
    __u64 waker_scan[LOCK_SCAN_HITS];
    __s32 python_stack_id;        /* the waiter's Python stack (bpf/python_stacks.bpf.c): >0 an id,
                                     0 none, <0 taken but not kept */
    __s32 waker_python_stack_id;  /* the waker's, taken at its FUTEX_WAKE */
};

#define FUTEX_WAIT_FLAG_WAITV    0x1  /* futex_waitv(): uaddr is the first waiter's futex */
#define FUTEX_WAIT_FLAG_FUTEX2   0x2  /* futex_wait() (futex2 syscall) */
#define FUTEX_WAIT_FLAG_SCANNED  0x4  /* long enough for the stack scan */
/* The futex word is a semaphore (glibc sem_t: the value word at offset 0) that
 * a thread took with a sem_trywait returning 0, with no sem_post or sem_init
 * on it since: SEM_OWN when that thread is the waiter itself (only another
 * thread's post can wake it: a signal, not mutual exclusion), SEM_HELD when
 * it is another thread. Neither: not known (blocking takes are not seen). */
#define FUTEX_WAIT_FLAG_SEM_OWN  0x8
#define FUTEX_WAIT_FLAG_SEM_HELD 0x10

/* Why a thread was off CPU (offcpu_event.reason). */
enum offcpu_reason {
    OFFCPU_FUTEX = 1,      /* sleeping inside a futex wait */
    OFFCPU_IO = 2,         /* uninterruptible sleep (disk, page faults, D state) */
    OFFCPU_SLEEP = 3,      /* other interruptible sleep: poll, socket reads, nanosleep */
    OFFCPU_PREEMPTED = 4,  /* switched out while runnable: all of it is runqueue delay */
};

struct offcpu_event {
    struct event_header hdr;  /* ts_ns: switched out */
    __u64 blocked_ns;         /* switched out to woken (0 when preempted) */
    __u64 runq_ns;            /* woken (or preempted) to running again */
    __u32 reason;             /* enum offcpu_reason */
    __u32 waker_tid;          /* thread that woke it (0: unknown or preempted) */
    __s32 waker_stack_id;     /* the waker's frame-pointer user stack, <0: none */
    __u32 waker_pid;
};

enum lock_counter {
    LOCK_COUNTER_WAITS = 0,          /* futex waits of target threads */
    LOCK_COUNTER_WAIT_NS = 1,        /* their total duration */
    LOCK_COUNTER_SHORT_WAITS = 2,    /* below the floor: counted, not streamed */
    LOCK_COUNTER_SHORT_WAIT_NS = 3,
    LOCK_COUNTER_SCANS = 4,          /* stack scans done (waiters and wakers) */
    LOCK_COUNTER_STACK_MISSING = 5,  /* bpf_get_stackid failed */
    LOCK_COUNTER_OFFCPU_SHORT = 6,   /* off-CPU periods below the floor */
    LOCK_COUNTER_MAP_FULL = 7,       /* a per-thread or per-address map was full */
    LOCK_COUNTER_KLOCK_WAITS = 8,    /* lock:contention_begin..end in target threads */
    LOCK_COUNTER_KLOCK_NS = 9,
    LOCK_COUNTER_SEM_TAKES = 10,     /* sem_trywait returned 0 (a taker recorded) */
    LOCK_COUNTER_MAX = 12,
};

/* The CUDA library functions the gpu probe set hooks (collector/model/gpu_catalog.py
 * has their symbol names). The ranges are the categories the BPF side acts on:
 * 1-15 launches, 16-31 waits, 32-47 copies, 48-59 memory, 60-63 queries. */
enum gpu_function {
    GPU_FN_CU_LAUNCH_KERNEL = 1,
    GPU_FN_CU_LAUNCH_KERNEL_EX = 2,
    GPU_FN_CU_GRAPH_LAUNCH = 3,
    GPU_FN_CUDA_LAUNCH_KERNEL = 4,
    GPU_FN_CUDA_LAUNCH_KERNEL_EX = 5,   /* cudaLaunchKernelExC */
    GPU_FN_CUDA_GRAPH_LAUNCH = 6,
    GPU_FN_CU_STREAM_SYNCHRONIZE = 16,
    GPU_FN_CU_EVENT_SYNCHRONIZE = 17,
    GPU_FN_CU_CTX_SYNCHRONIZE = 18,
    GPU_FN_CU_STREAM_WAIT_EVENT = 19,
    GPU_FN_CUDA_STREAM_SYNCHRONIZE = 20,
    GPU_FN_CUDA_EVENT_SYNCHRONIZE = 21,
    GPU_FN_CUDA_DEVICE_SYNCHRONIZE = 22,
    GPU_FN_CUDA_STREAM_WAIT_EVENT = 23,
    GPU_FN_CU_MEMCPY = 32,
    GPU_FN_CU_MEMCPY_ASYNC = 33,
    GPU_FN_CU_MEMCPY_DTOH = 34,
    GPU_FN_CU_MEMCPY_DTOH_ASYNC = 35,
    GPU_FN_CU_MEMCPY_HTOD = 36,
    GPU_FN_CU_MEMCPY_HTOD_ASYNC = 37,
    GPU_FN_CU_MEMCPY_DTOD = 38,
    GPU_FN_CU_MEMCPY_DTOD_ASYNC = 39,
    GPU_FN_CUDA_MEMCPY = 40,
    GPU_FN_CUDA_MEMCPY_ASYNC = 41,
    GPU_FN_CU_MEM_ALLOC = 48,
    GPU_FN_CU_MEM_FREE = 49,
    GPU_FN_CU_MEM_ALLOC_ASYNC = 50,
    GPU_FN_CU_MEM_FREE_ASYNC = 51,
    GPU_FN_CUDA_MALLOC = 52,
    GPU_FN_CUDA_FREE = 53,
    GPU_FN_CUDA_MALLOC_ASYNC = 54,
    GPU_FN_CUDA_FREE_ASYNC = 55,
    GPU_FN_CUDA_GET_DEVICE_COUNT = 60,
    GPU_FN_MAX = 64,
};
/* Where each category of gpu_function starts (the ranges above); user space
 * (collector/model/gpu_catalog.py) branches on the same numbers. */
#define GPU_FN_FIRST_WAIT 16
#define GPU_FN_FIRST_COPY 32
#define GPU_FN_FIRST_MEMORY 48
#define GPU_FN_FIRST_QUERY 60

/* gpu_call_event.copy_kind: the values of cudaMemcpyKind. */
enum gpu_copy_kind {
    GPU_COPY_HTOH = 0,
    GPU_COPY_HTOD = 1,
    GPU_COPY_DTOH = 2,
    GPU_COPY_DTOD = 3,
    GPU_COPY_DEFAULT = 4,  /* direction inferred by the driver from the pointers (unified addressing) */
};

/* Why a gpu_launches_event was sent. */
enum gpu_flush_reason {
    GPU_FLUSH_CALL = 1,    /* the thread entered a wait, copy or memory call: a step boundary */
    GPU_FLUSH_CAP = 2,     /* the run reached the configured number of launches */
    GPU_FLUSH_AGE = 3,     /* the next launch came after the run's age limit */
    GPU_FLUSH_END = 4,     /* still open when recording stopped (read from the map, not sent) */
};

/* What a drm/dma_fence tracepoint event is. */
enum gpu_drm_what {
    GPU_DRM_SCHED_JOB = 1, /* gpu_scheduler:drm_sched_job */
};

struct gpu_call_event {
    struct event_header hdr; /* ts_ns: entry of the outermost hooked call on the thread */
    __u64 exit_ns;           /* its return */
    __u64 bytes;             /* copies: bytes asked for; allocations: size */
    __u64 addr;              /* allocations: the address returned; frees: the address freed;
                                waits: the stream or event handle (0 for context/device syncs) */
    __s32 ret;               /* CUresult / cudaError_t: 0 is success */
    __u16 function;          /* enum gpu_function */
    __u8 copy_kind;          /* enum gpu_copy_kind, copies only */
    __u8 pad;
};

struct gpu_launches_event {
    struct event_header hdr; /* ts_ns: entry of the first launch of the run */
    __u64 last_ns;           /* entry of the last launch of the run */
    __u64 launch_ns;         /* time inside the runtime's launch calls of the run (their
                                entry to return; driver launch calls have no return probe) */
    __u32 kernels;           /* kernel launches (cu/cudaLaunchKernel, ...Ex) */
    __u32 graphs;            /* graph launches (cu/cudaGraphLaunch) */
    __u16 reason;            /* enum gpu_flush_reason */
    __u16 pad16;
    __u32 pad32;
};

struct gpu_fence_event {
    struct event_header hdr; /* ts_ns: dma_fence_wait_start */
    __u64 exit_ns;           /* dma_fence_wait_end */
    __u64 context;           /* the fence's timeline (context) and sequence number */
    __u64 seqno;
};

struct gpu_drm_event {
    struct event_header hdr;
    __u32 what;              /* enum gpu_drm_what */
    __u32 pad;
};

/* conn_state.local_ipc (bpf/sock.bpf.c): what a Unix-domain socket joins. */
enum local_ipc {
    LOCAL_IPC_NONE = 0,      /* not a Unix-domain socket */
    LOCAL_IPC_PROCESSES = 1, /* processes of this host (or a peer not known): vLLM's ZMQ */
    LOCAL_IPC_SELF_PAIR = 2, /* a socketpair whose other end the same process holds, seeded by user space
                              * (collector/processes/unix_peers.py): a wake-up channel, such as asyncio's self-pipe */
};

/* Indexes of the per-CPU counters array (user space sums them). */
enum counter_index {
    COUNTER_EVENTS_SENT = 0,    /* events submitted to the ring buffer */
    COUNTER_EVENTS_LOST = 1,    /* ring buffer full: event dropped */
    COUNTER_IO_SKIPPED = 2,     /* socket I/O on connections that never carried HTTP */
    COUNTER_USDT_BAD_ARGS = 3,  /* a USDT argument could not be read */
    COUNTER_REQUESTS = 4,       /* request lines sent (a live count without decoding) */
    COUNTER_IO_UNTRACKED = 5,   /* the per-thread pending map was full: a syscall not followed */
    COUNTER_CONNS_UNRECOGNISED = 6, /* closed connections that moved bytes but never a request line
                                     * nor TLS plaintext the classifier read (TLS not hooked? HTTP/2?) */
    COUNTER_TLS_UNTIED = 7,     /* TLS sessions whose socket could not be found: no peer, no network data */
    COUNTER_H2_LOST_SYNC = 8,   /* HTTP/2 connections whose frames could no longer be followed (bpf/protocols/http2.bpf.h) */
    COUNTER_H2_PIECES_LOST = 9, /* HTTP/2 header block pieces the h2_header_pieces ring had no room for */
    COUNTER_CONNS_LOCAL_IPC = 10, /* Unix-domain connections that moved bytes but never a request line,
                                   * closed or given up on: processes of this host talking (vLLM's ZMQ) */
    COUNTER_CONNS_TLS_NO_PLAINTEXT = 11, /* connections whose bytes went unrecognised but a hooked TLS library
                                          * read over (a handshake, a pool's connection opened ahead and
                                          * never used): ciphertext with no plaintext to read, not lost requests */
    COUNTER_CONNS_SELF_PAIR = 12, /* ends of a socketpair whose both ends one process holds (asyncio's
                                   * self-pipe, woken by call_soon_threadsafe) that moved bytes: no IPC */
    COUNTER_REQUEST_HEADS_JOINED = 13, /* requests whose line or header block came in more than one read
                                        * (write) and were joined in the kernel before being classified */
    COUNTER_NET_QUEUED = 14,    /* segments of traced connections seen at net_dev_queue */
    COUNTER_NET_XMITTED = 15,   /* ... and again at net_dev_xmit (the rest: dropped or re-segmented) */
    COUNTER_CONNS_ENGINE_IPC = 16,  /* closed connections followed as ZeroMQ (ZMTP) streams (bpf/protocols/zmtp.bpf.h) */
    COUNTER_ENGINE_IPC_LOST_SYNC = 17, /* ZMTP streams whose frames could no longer be followed */
    COUNTER_ENGINE_IPC_UNREAD = 18, /* messages of a followed stream that are not in the layout the walk
                                     * reads (vLLM 0.32's): skipped by their frames, not read */
    COUNTER_MAX = 20,           /* room for the other probe sets' counters */
};

/* ---------------------------------------------------------------- engine IPC
 * bpf/protocols/zmtp.bpf.h: what crosses an inference engine's ZeroMQ connections
 * between its own processes, read where the syscalls move it. vLLM V1's API
 * server hands each request to EngineCore as an ADD message, and EngineCore
 * sends each step's outputs back (msgpack, vllm/v1/engine/__init__.py). Only
 * ids, counts and flags leave the kernel: never a token id or text. */
#define ENGINE_ID_MAX_BYTES 48

enum engine_ipc_kind {
    ENGINE_IPC_ADD = 1,     /* a request handed to the engine: id, count = its prompt tokens */
    ENGINE_IPC_OUTPUT = 2,  /* one request's entry in a step's outputs: id, count = its new tokens */
    ENGINE_IPC_STEP = 3,    /* a step's outputs were all read: count = the entries in it */
};

#define ENGINE_IPC_FLAG_FINISHED 0x01  /* OUTPUT: the entry has a finish reason (the request's last) */
#define ENGINE_IPC_FLAG_ID_CUT   0x02  /* the id was longer than ENGINE_ID_MAX_BYTES: its start only */
#define ENGINE_IPC_FLAG_PREEMPTED 0x08 /* OUTPUT: its events say the engine preempted the request */

struct engine_ipc_event {
    struct event_header hdr;  /* ts_ns: the syscall that moved the message's last read byte (a read's exit, a
                               * write's entry); pid/tid: the process and thread of that end */
    __u64 conn_id;
    __u32 message;   /* the message's number on its connection and direction: a step's entries share it */
    __u16 kind;      /* enum engine_ipc_kind */
    __u8 dir;        /* 0: the process read it, 1: it wrote it (enum io_dir) */
    __u8 flags;      /* ENGINE_IPC_FLAG_* */
    __u32 count;
    __u16 index;     /* OUTPUT: the entry's place in its step's outputs */
    __u8 id_len;
    __u8 pad;
    /* OUTPUT: the engine's own clock for the request, where the entry carries
     * its events (vLLM: the first output after it was queued or scheduled):
     * the IEEE-754 bits of a time.monotonic() value (CLOCK_MONOTONIC, seconds),
     * big-endian as sent; 0 when absent. QUEUED is when the engine's loop took
     * the request in, SCHEDULED when a step first took it (the first one). */
    __u64 queued_bits;
    __u64 scheduled_bits;
    char id[ENGINE_ID_MAX_BYTES]; /* the engine's request id (vLLM: the API's id and 8 characters of its own) */
};

/* llama.cpp's llama_decode(ctx, batch) through uprobes (bpf/llama.bpf.c,
 * docs/engines.md): one engine step. The batch's tokens are summarised as
 * runs: consecutive tokens of one sequence with consecutive positions (how
 * llama-server lays a batch out: one run per slot). */
#define LLAMA_MAX_RUNS 16

enum llama_step_phase {
    LLAMA_STEP_ENTER = 1,  /* llama_decode() was called: runs hold the batch */
    LLAMA_STEP_RETURN = 2, /* llama_decode() returned: ret holds its result */
    LLAMA_STEP_SYNC = 3,   /* llama_synchronize(ctx) returned: ctx set, ret = ns it waited */
};

struct llama_run {
    __s32 seq_id;     /* seq_id[first token][0]: llama-server's slot id */
    __s32 pos0;       /* position of its first token (0: a sequence starting afresh) */
    __s32 n_tokens;   /* tokens in the run */
    __s32 last_logits;/* logits[] of its last token: 1 when the step samples a token for it */
};

struct llama_step_event {
    struct event_header hdr;
    __u32 phase;      /* enum llama_step_phase */
    __s32 n_tokens;   /* batch.n_tokens */
    __u32 n_runs;     /* runs filled (<= LLAMA_MAX_RUNS) */
    __u32 truncated;  /* 1: the batch had more runs than LLAMA_MAX_RUNS, or one was unreadable */
    __s64 ret;        /* llama_decode()'s result (return phase) */
    __u64 ctx;        /* the llama_context pointer: one engine */
    struct llama_run runs[LLAMA_MAX_RUNS];
};

/* W3C trace context (bpf/protocols/trace_context.bpf.h, docs/trace-context.md): the
 * values of a request's traceparent and tracestate headers, wherever they
 * stand in its header block, also past the head and in later reads or
 * writes of the same request. The only header values besides the
 * x-stainless-retry-count digits that leave the kernel; each is cut at its
 * line's end, so nothing of the next header is copied. */
#define TRACEPARENT_MAX_BYTES 64   /* version 00 is 55 bytes; longer (later versions) is flagged cut */
#define TRACESTATE_MAX_BYTES 256   /* W3C asks vendors to propagate at least 512: longer is flagged cut */
#define TRACE_HEADER_BYTES 16384   /* how far into a request's header block the kernel looks */

/* trace_context_event.flags */
#define TRACE_CONTEXT_FLAG_TRACEPARENT     0x01 /* traceparent holds the header's value */
#define TRACE_CONTEXT_FLAG_TRACESTATE      0x02 /* tracestate holds the header's value */
#define TRACE_CONTEXT_FLAG_TRACEPARENT_CUT 0x04 /* its value ran past TRACEPARENT_MAX_BYTES or the bytes seen */
#define TRACE_CONTEXT_FLAG_TRACESTATE_CUT  0x08 /* its value ran past TRACESTATE_MAX_BYTES or the bytes seen */
#define TRACE_CONTEXT_FLAG_LATER_IO        0x10 /* found in a read/write after the one with the request line */
#define TRACE_CONTEXT_FLAG_HEADERS_END     0x20 /* the blank line ending the headers was reached */

struct trace_context_event {
    struct event_header hdr;  /* ts_ns: entry of the read/write that carried the headers */
    __u64 conn_id;
    __u64 exit_ns;            /* that read/write's exit: ties the event to its io_event */
    __u32 header_offset;      /* where the traceparent line starts in the request (0: none) */
    __u16 flags;              /* TRACE_CONTEXT_FLAG_* */
    __u16 tracestate_len;
    __u8 traceparent_len;
    __u8 role;                /* enum conn_role */
    __u8 pad[6];
    char traceparent[TRACEPARENT_MAX_BYTES];
    char tracestate[TRACESTATE_MAX_BYTES];
};

/* ------------------------------------------------------------ HTTP/2 (96-111)
 * bpf/protocols/http2.bpf.h walks the frames of a connection that began with the
 * HTTP/2 preface (h2c, or h2 over TLS), per direction, across syscalls and
 * iovecs. One h2_frames_event per syscall (more when it carries more than
 * H2_FRAMES_PER_EVENT frames) lists the parts of frames it carried: only
 * frame headers and what the classifier derived (gRPC message ends, an SSE
 * "data:" line start), never payload bytes. Header blocks (HPACK) go to
 * user space through a ring of their own, h2_header_pieces, which nothing
 * records: collector/ingest/h2_header_blocks.py decodes them at once and keeps
 * only the fields docs/http2.md lists, as an h2_headers_event. */
#define H2_FRAMES_PER_EVENT 16
#define H2_HEADER_PIECE_BYTES 4096

enum h2_frame_type {
    H2_FRAME_DATA = 0,
    H2_FRAME_HEADERS = 1,
    H2_FRAME_PRIORITY = 2,
    H2_FRAME_RST_STREAM = 3,
    H2_FRAME_SETTINGS = 4,
    H2_FRAME_PUSH_PROMISE = 5,
    H2_FRAME_PING = 6,
    H2_FRAME_GOAWAY = 7,
    H2_FRAME_WINDOW_UPDATE = 8,
    H2_FRAME_CONTINUATION = 9,
};

/* Frame flags (RFC 9113 section 6). */
#define H2_FRAME_FLAG_END_STREAM  0x01
#define H2_FRAME_FLAG_END_HEADERS 0x04
#define H2_FRAME_FLAG_PADDED      0x08
#define H2_FRAME_FLAG_PRIORITY    0x20

/* h2_frame.part: what of its frame one syscall carried. */
#define H2_PART_FLAG_CONTINUED 0x01  /* the frame began in an earlier syscall (or iovec run) */
#define H2_PART_FLAG_ENDS      0x02  /* its last byte is in this syscall: END_STREAM takes effect */
#define H2_PART_FLAG_GRPC      0x04  /* DATA of a stream whose payload is gRPC length-prefixed messages */
#define H2_PART_FLAG_SSE_DATA  0x08  /* DATA whose payload starts with an SSE "data:" line */
#define H2_PART_FLAG_UNWALKED  0x10  /* DATA whose messages were not followed (padded, or framing lost) */
#define H2_PART_FLAG_SSE_DONE  0x20  /* DATA whose payload holds "data: [DONE]", the end marker (at its start
                                      * when not SCANNED) */
#define H2_PART_FLAG_SCANNED   0x40  /* DATA of a text stream whose lines were scanned as an HTTP/1 body's:
                                      * messages holds its token events (SSE, else NDJSON lines) */
#define H2_PART_FLAG_JSON_DONE 0x80  /* SCANNED DATA holding "done": true, NDJSON's end marker (Ollama) */

struct h2_frame {
    __u32 stream_id;
    __u32 length;      /* the payload length its header states */
    __u32 value;       /* RST_STREAM: error code; GOAWAY: last stream id; DATA: payload bytes in this part */
    __u8 type;         /* enum h2_frame_type (others: extension frames, skipped) */
    __u8 flags;        /* H2_FRAME_FLAG_* as sent */
    __u8 part;         /* H2_PART_FLAG_* */
    __u8 messages;     /* DATA of gRPC: messages this part completes; SCANNED DATA: its token
                        * events (capped at 255) */
};

#define H2_FLAG_PREFACE   0x0001  /* this syscall carried the connection preface */
#define H2_FLAG_LOST_SYNC 0x0002  /* the walk gave up here: the connection is no longer followed */
#define H2_FLAG_MORE      0x0004  /* more frames of this syscall follow in another event */
#define H2_FLAG_BEGAN_UNSEEN 0x0008 /* as HTTP_FLAG_BEGAN_UNSEEN */

struct h2_frames_event {
    struct event_header hdr;  /* type EVENT_H2_FRAMES; ts_ns: the syscall's (or TLS call's) entry */
    __u64 conn_id;
    __u64 exit_ns;
    __s64 bytes;
    __s32 fd;
    __u16 flags;              /* H2_FLAG_* */
    __u8 transport;           /* enum transport */
    __u8 role;                /* enum conn_role */
    __u8 dir;                 /* 0: the target read these bytes, 1: it wrote them */
    __u8 n_frames;
    __u8 pad[6];
    __u64 wire_ns;            /* as io_event.wire_ns */
    struct h2_frame frames[H2_FRAMES_PER_EVENT];
};

/* One piece of a header block (a HEADERS, CONTINUATION or PUSH_PROMISE
 * frame's payload as far as one syscall carried it). Sent through the
 * h2_header_pieces ring only, never recorded: it holds header values. */
struct h2_header_piece {
    struct event_header hdr;  /* type EVENT_H2_HEADER_PIECE */
    __u64 conn_id;
    __u64 exit_ns;
    __u32 stream_id;
    __u32 frame_length;       /* the frame's payload length */
    __u32 offset;             /* where in that payload this piece starts */
    __u16 len;                /* bytes of the piece in `bytes` */
    __u8 frame_type;          /* HEADERS, CONTINUATION or PUSH_PROMISE */
    __u8 frame_flags;
    __u8 dir;
    __u8 role;
    __u8 transport;
    __u8 truncated;           /* the piece was longer than H2_HEADER_PIECE_BYTES */
    __u8 bytes[H2_HEADER_PIECE_BYTES];
};

/* h2_headers_event.flags */
#define H2_HEADERS_FLAG_END_STREAM   0x0001 /* its HEADERS frame ended the stream (trailers; a bodiless request) */
#define H2_HEADERS_FLAG_TABLE_LOST   0x0002 /* the HPACK table of this direction cannot be followed: no fields */
#define H2_HEADERS_FLAG_HAS_STATUS   0x0004
#define H2_HEADERS_FLAG_GRPC_STATUS  0x0008 /* grpc_status holds grpc-status */
#define H2_HEADERS_FLAG_PUSH_PROMISE 0x0010 /* a server push's promised request: not a request of the peer */

/* h2_headers_event.content: the content-type's kind (never its text). */
enum h2_content {
    H2_CONTENT_NONE = 0,
    H2_CONTENT_GRPC = 1,          /* application/grpc, application/grpc+proto, ... */
    H2_CONTENT_EVENT_STREAM = 2,  /* text/event-stream */
    H2_CONTENT_NDJSON = 3,
    H2_CONTENT_JSON = 4,
    H2_CONTENT_OTHER = 5,
    H2_CONTENT_AWS_EVENT_STREAM = 6,  /* application/vnd.amazon.eventstream (Bedrock) */
};

#define H2_TRACEPARENT_BYTES 55

/* A header block, decoded in user space (collector/ingest/h2_header_blocks.py) from
 * h2_header_pieces: the fields docs/http2.md lists, nothing else. Written to
 * recordings like a kernel event. */
struct h2_headers_event {
    struct event_header hdr;  /* type EVENT_H2_HEADERS; pid, tid, ts_ns of the syscall that completed the block */
    __u64 conn_id;
    __u64 exit_ns;
    __u32 stream_id;
    __u16 flags;              /* H2_HEADERS_FLAG_* */
    __u16 status;             /* :status */
    __s32 grpc_status;        /* with H2_HEADERS_FLAG_GRPC_STATUS */
    __u32 grpc_message_len;   /* grpc-message: its length only */
    __u8 method;              /* enum http_method of :method */
    __u8 dir;
    __u8 role;
    __u8 transport;
    __u8 content;             /* enum h2_content */
    __u8 path_len;
    __u8 traceparent_len;
    __u8 pad;
    char path[PATH_MAX_BYTES];         /* :path without the query string */
    char traceparent[H2_TRACEPARENT_BYTES + 1];
    __u16 tracestate_len;
    __u16 pad_tracestate;
    char tracestate[TRACESTATE_MAX_BYTES];  /* W3C tracestate as sent, cut at TRACESTATE_MAX_BYTES */
    __u32 tracestate_cut;                   /* 1: it was longer */
    __u64 first_piece_ns;     /* when the syscall that carried the block's first bytes moved them
                               * (a read's exit, a write's entry): where a request began */
};

/* ------------------------------------------------------------ CUPTI shim
 * The records of probes/cupti/inferprobe_cupti.c (USDT provider
 * "inferprobe_gpu"), read by bpf/gpu.bpf.c; docs/gpu.md has the probes. */

enum gpu_activity_kind {
    GPU_ACTIVITY_KERNEL = 1,
    GPU_ACTIVITY_MEMCPY = 2,
    GPU_ACTIVITY_MEMSET = 3,
};

/* The shim's status codes (inferprobe_cupti_start()'s return value). */
enum gpu_shim_status {
    GPU_SHIM_NOT_STARTED = 0,
    GPU_SHIM_COLLECTING = 1,
    GPU_SHIM_NO_DEVICE = 2,
    GPU_SHIM_CUPTI_ERROR = 3,
    GPU_SHIM_STOPPED = 4,
};

#define GPU_KERNEL_NAME_BYTES 192
#define GPU_SHIM_STATUS_BYTES 256
/* The shim names at most 4096 kernels; later ones share this id. */
#define GPU_OTHER_KERNEL_NAME_ID 0xffff

struct gpu_api_event {
    struct event_header hdr;  /* type EVENT_GPU_API; tid, ts_ns: the launching thread at the call's entry */
    __u64 correlation_id;     /* CUPTI's id of the call, also in its work's gpu_activity_event */
    __u32 cbid;               /* CUPTI callback id (cupti_runtime_cbid.h / cupti_driver_cbid.h) */
    __u32 domain;             /* CUpti_CallbackDomain: 1 driver API, 2 runtime API */
};

struct gpu_activity_event {
    struct event_header hdr;  /* type EVENT_GPU_ACTIVITY; ts_ns: when the shim handed the record over */
    __u64 gpu_start;          /* CUPTI clock (gpu_clock_event maps it to CLOCK_MONOTONIC) */
    __u64 gpu_end;
    __u64 correlation_id;
    __u64 shape;              /* kernels: grid x | y << 21 | z << 42; copies and memsets: bytes */
    __u32 device;
    __u32 stream;
    __u32 kind;               /* enum gpu_activity_kind */
    __u32 name_id;            /* kernels: gpu_kernel_name_event id; copies: CUpti_ActivityMemcpyKind */
};

struct gpu_clock_event {
    struct event_header hdr;  /* type EVENT_GPU_CLOCK */
    __u64 cupti_ns;           /* cuptiGetTimestamp() */
    __u64 mono_before_ns;     /* CLOCK_MONOTONIC right before it */
    __u64 mono_after_ns;      /* and right after */
};

struct gpu_kernel_name_event {
    struct event_header hdr;  /* type EVENT_GPU_KERNEL_NAME */
    __u32 name_id;
    __u32 len;                /* bytes of name, without its NUL */
    char name[GPU_KERNEL_NAME_BYTES];  /* demangled where the process has libstdc++, cut to fit */
};

struct gpu_shim_status_event {
    struct event_header hdr;  /* type EVENT_GPU_SHIM_STATUS */
    __s32 status;             /* enum gpu_shim_status */
    __s32 cupti_result;       /* CUptiResult of the failing call, 0 otherwise */
    __u32 len;
    __u32 pad;
    char text[GPU_SHIM_STATUS_BYTES];  /* one sentence */
};

/* On the h2_header_pieces ring after a connection's last piece: user space
 * drops its HPACK tables (they would otherwise live as long as the recorder). */
struct h2_conn_closed {
    struct event_header hdr;  /* type EVENT_H2_CONN_CLOSED */
    __u64 conn_id;
};

#endif /* INFERPROBE_H */

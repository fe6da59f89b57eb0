/* inferprobe.h: every event the BPF programs send to user space.
 *
 * This is the one place the byte layout of an event is defined. It is
 * included by the BPF programs (compiled by bcc) and, in the contract test
 * tests/collector/test_event_layout.py, by a host C program whose sizeof /
 * offsetof output is compared with the ctypes mirrors in collector/events.py.
 *
 * Rules: fixed-width __u/__s types only, every struct opens with
 * struct event_header, no pointers, explicit padding, no bitfields.
 */
#ifndef INFERPROBE_H
#define INFERPROBE_H

#ifndef __KERNEL__
#include <linux/types.h>
#endif

#define INFERPROBE_LAYOUT_VERSION 1

/* How much of a socket buffer the kernel side looks at to classify it. The
 * bytes stay in a per-CPU scratch buffer: only derived fields (method, path,
 * status, lengths, counts, flags) are copied into an event. */
#define SCAN_HEAD_BYTES 512
#define SCAN_TAIL_BYTES 32
#define PATH_MAX_BYTES 64

/* Each probe set owns a range of type numbers so that sets can grow
 * independently: 1-15 sockets and USDT, 16-31 locks and scheduling,
 * 32-47 stacks and profiling, 48-63 GPU, 64-79 network. */
enum event_type {
    EVENT_CONN_OPEN = 1,   /* accept()/accept4() returned a socket */
    EVENT_CONN_CLOSE = 2,  /* close() of a tracked socket */
    EVENT_SOCK_READ = 3,   /* read-family syscall on a tracked socket */
    EVENT_SOCK_WRITE = 4,  /* write-family syscall on a tracked socket */
    EVENT_USDT = 5,        /* an inferprobe USDT probe fired in the server */
    EVENT_FUTEX_WAIT = 16, /* a target thread waited in futex() at least the floor */
    EVENT_OFFCPU = 17,     /* a target thread was off CPU at least the floor */
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
#define HTTP_FLAG_VECTORED       0x0080 /* readv/writev/sendmsg/recvmsg: only the first iovec was scanned */

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
    __u16 sse_events;       /* "data:" lines starting in the scanned part of the body */
    __u8 method;            /* enum http_method for HTTP_KIND_REQUEST */
    __u8 path_len;
    char path[PATH_MAX_BYTES]; /* request path without the query string */
};

struct usdt_event {
    struct event_header hdr;
    __u32 probe;            /* enum usdt_probe */
    __u32 nargs;
    __s64 args[USDT_MAX_ARGS];
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
};

#define FUTEX_WAIT_FLAG_WAITV    0x1  /* futex_waitv(): uaddr is the first waiter's futex */
#define FUTEX_WAIT_FLAG_FUTEX2   0x2  /* futex_wait() (futex2 syscall) */
#define FUTEX_WAIT_FLAG_SCANNED  0x4  /* long enough for the stack scan */

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
    LOCK_COUNTER_MAX = 12,
};

/* Indexes of the per-CPU counters array (user space sums them). */
enum counter_index {
    COUNTER_EVENTS_SENT = 0,    /* events submitted to the ring buffer */
    COUNTER_EVENTS_LOST = 1,    /* ring buffer full: event dropped */
    COUNTER_IO_SKIPPED = 2,     /* socket I/O on connections that never carried HTTP */
    COUNTER_USDT_BAD_ARGS = 3,  /* a USDT argument could not be read */
    COUNTER_MAX = 16,           /* room for the other probe sets' counters */
};

#endif /* INFERPROBE_H */

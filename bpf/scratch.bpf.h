/* scratch.bpf.h: the per-CPU scratch area the classification chain works in.
 *
 * Holds struct scratch (the copied bytes, the io_event being filled in, and
 * what each scanner leaves for the next program of the chain), its size, and
 * the user-space iovec layout it copies. Needs only inferprobe.h (through
 * common.bpf.h) for struct io_event and the scan sizes. Every other header of
 * the classifier works on a struct scratch; sock.bpf.c declares the map that
 * holds it (scratch_area: the maps are all sock.bpf.c's).
 *
 * A new protocol that needs state of its own between the programs of the
 * chain adds its fields here, with a comment naming the header that uses
 * them (as the stream_fields.bpf.h fields below do).
 */
#ifndef INFERPROBE_SCRATCH_BPF_H
#define INFERPROBE_SCRATCH_BPF_H

/* The scratch buffer is twice the scan window so that a copy of up to
 * SCAN_HEAD_BYTES starting anywhere below SCAN_HEAD_BYTES stays inside it:
 * that is what lets the verifier accept variable offsets (masked below). */
#define SCRATCH_BYTES (2 * SCAN_HEAD_BYTES)
#define SCRATCH_MASK (SCRATCH_BYTES - 1)
/* Iovecs copied into the head: hyper (Rust) writes each chunk as three (size
 * line, data, CRLF), so two token chunks it queued and wrote at once, or a
 * token, [DONE] and the last chunk, take six or seven; Node, corked, writes
 * four chunks as sixteen. Sixteen where each iovec's copy is verified once
 * (gather_step, a global function: HAVE_BPF_LOOP); eight where it is inlined
 * sixteen times over (the verifier gives up on sixteen). */
#ifdef HAVE_BPF_LOOP
#define MAX_IOVECS 16
#else
#define MAX_IOVECS 8
#endif
#define H2_NO_PART 0xff

/* What a connection's response body is (conn_state.body, pending_io.body,
 * scratch.body), from its headers (remember_body in sock.bpf.c). */
#define BODY_CHUNKED    0x1   /* Transfer-Encoding: chunked: find_framing may apply (chunk_framing.bpf.h) */
#define BODY_AWS_EVENTS 0x2
#define AWS_MAX_HEADERS_SLOTS 16   /* event_stream.bpf.h's AWS_MAX_HEADERS */   /* an AWS event stream: scan_event_stream reads it (event_stream.bpf.h) */

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
    u32 scan_at;     /* next_match(): the next word a body scan looks at */
    u64 scan_found;  /* ... and what it found in the last word it stopped at */
    u32 joined;      /* bytes of earlier reads (writes) of a request's head joined in front of the
                      * syscall's own in the head (sock.bpf.c, join_open_head): 0 for most */
    u64 tls_session; /* TLS: the session whose plaintext this is (event_conn), 0 for a socket */
    u32 request_side; /* the bytes are the request half: a server's read, a client's write */
    u32 http_seen;
    u32 body;        /* BODY_* of the connection's response (conn_state) */
    u32 length_at;   /* where the Content-Length value starts, 0 if none */
    u32 type_at;     /* where the Content-Type value starts, 0 if none */
    u32 retry_at;    /* where an x-stainless-retry-count value starts, 0 if none (http1.bpf.h) */
    u32 host_at;     /* where a request's Host value starts, 0 if none (http1.bpf.h) */
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
    u32 fields_saw_window;  /* scan_fields scanned this window */
    u32 fields_fresh_from;  /* where the bytes begin that scan_fields has not seen: WINDOW_OVERLAP in a
                             * window after one it scanned, else 0 (next_body_window) */
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
    /* An AWS event stream's window (event_stream.bpf.h): where headers are
     * looked for up to, where a metadata message's payload may start (+ 1; 0:
     * none) and whether it goes on into the next window, and a message's
     * prelude or payload prefix read for a closer look. */
    u32 es_limit;
    u32 es_usage_from;
    u32 es_usage_next;
    u8 es_peek[48];
    u32 es_hits;                        /* length bytes found in the window ... */
    u32 es_hit_at[AWS_MAX_HEADERS_SLOTS]; /* ... and where, the first AWS_MAX_HEADERS */
    u32 tail_read;      /* bytes of the write's end read into tail[] */
    u32 tail_pass;      /* scan_fields is reading the tail, copied into the head */
    /* HTTP/2 (http2.bpf.h): the syscall's bytes as the frame walk sees them
     * (its buffer or iovec array, left as classify_io found them), the
     * segment it is in, and the event it fills. */
    u64 h2_buf;
    u64 h2_total;
    u32 zmtp;           /* the connection's conn_state.zmtp, for scan_zmtp (the buffer: h2_buf, h2_total) */
    u64 h2_seg_base;
    u32 h2_vlen;
    u32 h2_seg_len;
    u32 h2_seg_off;
    u32 h2_skip;        /* bytes to step over first: the preface */
    u32 h2_runs;        /* runs of the h2_frames program for this syscall */
    u32 h2_part;        /* the current frame's part in h2ev.frames, H2_NO_PART if none yet */
    u32 h2_iov_at;      /* the next of the iovecs read into iovs[] */
    u32 h2_iov_cached;  /* how many iovs[] holds */
    /* A DATA payload of a text stream to scan (sock.bpf.c, h2_scan_data):
     * where it lies in user memory, how long, its part in h2ev.frames, and
     * how many this syscall scanned. */
    u64 h2_scan_at;
    u32 h2_scan_len;
    u32 h2_scan_part;
    u32 h2_scans;
    u32 h2_scan_aws;    /* its stream is an AWS event stream: scan_event_stream reads it */
    struct h2_frames_event h2ev;
    struct user_iovec iovs[MAX_IOVECS];   /* copy_iovecs: the next iovecs, read at once */
    /* copy_iovecs' walk, for gather_step (gather.bpf.h): the iovec at, how
     * many were read into iovs[], the bytes still moved past the head's and
     * where the head is filled to, the skip of the first, and how far the
     * walk went (the iovecs done). */
    u32 gather_k;
    u32 gather_count;
    u64 gather_remaining;
    u64 gather_first_skip;
    u32 gather_copied;
    u32 gather_walked;
    u64 frame_word[MAX_IOVECS];           /* find_framing: a framing buffer's bytes, 0: read it */
    u8 frame_role[MAX_IOVECS];            /* enum frame_role, for framing_chains */
};

/* The state the body scanners (sse.bpf.h, stream_fields.bpf.h,
 * body_windows.bpf.h) carry from window to window, cleared before they scan
 * a new buffer: a syscall's (classify_io) or an HTTP/2 DATA payload's
 * (h2_scan_data in sock.bpf.c). */
static __always_inline void reset_body_scans(struct scratch *s)
{
    s->window_start = 0;
    s->windows = 0;
    s->more = 0;
    s->body_start = 0;
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
    s->fields_saw_window = 0;
    s->fields_fresh_from = 0;
    s->named_events = 0;
    s->head[SCRATCH_BYTES - 1] = 0;   /* what a line end at 0 finds before it (stream_fields.bpf.h) */
}

#endif /* INFERPROBE_SCRATCH_BPF_H */

/* http2.bpf.h: HTTP/2 framing (RFC 9113), for the h2_frames program of sock.bpf.c.
 *
 * An HTTP/2 connection is a byte stream of frames, each a 9-byte header
 * (24-bit payload length, type, flags, 31-bit stream id) and its payload.
 * A syscall may end anywhere: inside a frame header, inside a payload, and
 * a vectored one in the middle of either at every iovec. So the walk keeps,
 * per connection and direction (struct h2_dir, in sock.bpf.c's h2_conns
 * map), where it is in the current frame, and resumes there at the next
 * syscall or iovec. It reads only the frame headers (9 bytes each), the
 * 5-byte prefix of each gRPC message (its length), the first 5 bytes of a
 * DATA payload (an SSE "data:" line?) and the 4 bytes of RST_STREAM and
 * GOAWAY that say which stream and why. Payload bytes are never copied
 * anywhere else; header blocks go to user space for HPACK (sock.bpf.c,
 * h2_header_pieces), because their dynamic table cannot be followed in the
 * kernel.
 *
 * gRPC messages (a 1-byte compressed flag, a 4-byte big-endian length, the
 * message) run across DATA frames of their stream, so what is left of the
 * current message is kept per stream (h2_stream_state) while frames of
 * other streams come between.
 *
 * Needs struct scratch (scratch.bpf.h) and inferprobe.h's h2 structs. No
 * map calls here: the maps, and the code that touches them, are sock.bpf.c's.
 */
#ifndef INFERPROBE_HTTP2_BPF_H
#define INFERPROBE_HTTP2_BPF_H

/* "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n": the client's first 24 bytes. */
#define H2_PREFACE_BYTES 24
#define H2_PREFACE_0 0x5448202a20495250ULL   /* "PRI * HT" little-endian */
#define H2_PREFACE_1 0x0a0d302e322f5054ULL   /* "TP/2.0\r\n" */
#define H2_PREFACE_2 0x0a0d0a0d4d530a0dULL   /* "\r\nSM\r\n\r\n" */

/* Walk steps per program run, and runs per syscall (tail calls of the
 * program to itself): a step reads one frame header, one gRPC message
 * prefix, steps over one payload, or takes the next iovec. 16 x 24 steps
 * cover a write of ~150 coalesced small gRPC messages; a syscall that
 * needs more is given up (H2_FLAG_LOST_SYNC), never half-read. */
#define H2_STEPS 24
#define H2_MAX_RUNS 16
/* DATA payloads of text streams scanned per syscall (sock.bpf.c, h2_scan_data). */
#define H2_DATA_SCANS 4

/* Where the walk is in one direction of a connection. */
struct h2_dir {
    u32 frame_left;      /* payload bytes of the current frame still to come */
    u32 frame_len;
    u32 stream_id;
    u8 type;
    u8 flags;
    u8 hdr_have;         /* bytes of the next frame header seen so far (0..8) */
    u8 lost;             /* the walk gave up: this direction is no longer followed */
    /* DATA of the current frame's stream (h2_stream_state while the frame lasts): */
    u32 msg_left;        /* bytes left of the current gRPC message */
    u8 shape;            /* enum h2_data_shape */
    u8 prefix_have;      /* bytes of the next message prefix seen so far (0..4) */
    u8 padded;           /* the frame is PADDED: its messages are not followed */
    u8 stored_clean;     /* h2_streams holds the stream's shape and no partial message */
    u8 hdr[32];          /* the frame header being assembled (room for a masked copy) */
    u8 prefix[32];       /* the gRPC message prefix being assembled (room for a masked copy) */
};

struct h2_conn {
    struct h2_dir dir[2];   /* [0]: what the target reads, [1]: what it writes */
};

/* What a stream's DATA payloads are, learnt from its first DATA byte. */
enum h2_data_shape {
    H2_SHAPE_UNKNOWN = 0,
    H2_SHAPE_GRPC = 1,   /* length-prefixed messages: the first byte is the compressed flag, 0 or 1 */
    H2_SHAPE_TEXT = 2,   /* anything else (SSE, JSON, bytes) */
    H2_SHAPE_AWS_EVENTS = 3,  /* AWS event stream messages (Bedrock; event_stream.bpf.h): a prelude, not a flag */
};

/* A stream's first DATA bytes, 16 of them, are an AWS event stream message's
 * prelude and first header: a total length (big-endian, its first byte 0
 * like a gRPC message's flag) of at least the prelude, headers, CRC, a
 * headers length within it, and a header name starting with ':' (:event-type,
 * :exception-type, ...). A gRPC message's bytes 4-7 are its length's last
 * byte and its first three bytes of protobuf, which make that headers length
 * larger than the total it would be in. */
static __always_inline int h2_aws_prelude(const u8 *b)
{
    u32 total = (u32)b[0] << 24 | (u32)b[1] << 16 | (u32)b[2] << 8 | b[3];
    u32 headers = (u32)b[4] << 24 | (u32)b[5] << 16 | (u32)b[6] << 8 | b[7];
    return b[0] == 0 && headers >= 4 && headers + 16 <= total && b[12] >= 2 && b[12] < 64 && b[13] == ':';
}

struct h2_stream_key {
    u64 conn_id;
    u32 stream_id;
    u32 dir;
};

struct h2_stream_state {
    u32 msg_left;
    u8 shape;
    u8 prefix_have;
    u8 pad[2];
    u8 prefix[8];
};

static __always_inline int h2_is_preface(struct scratch *s)
{
    return s->n >= H2_PREFACE_BYTES && load8(s->head, 0) == H2_PREFACE_0 &&
           load8(s->head, 8) == H2_PREFACE_1 && load8(s->head, 16) == H2_PREFACE_2;
}

/* The first bytes of the preface and nothing after them yet (a server
 * that reads the preface in pieces): held until the rest comes. */
static __always_inline int h2_opens_preface(struct scratch *s)
{
    u32 n = s->n;
    if (n == 0 || n >= H2_PREFACE_BYTES)
        return 0;
    u64 expect[3] = {H2_PREFACE_0, H2_PREFACE_1, H2_PREFACE_2};
#pragma unroll
    for (u32 w = 0; w < 3; w++) {
        u32 at = w * 8;
        if (at >= n)
            break;
        u64 mask = n - at >= 8 ? ~0ULL : (1ULL << (8 * (n - at))) - 1;
        if ((load8(s->head, at) & mask) != (expect[w] & mask))
            return 0;
    }
    return 1;
}

/* The walk's input: the syscall's plain buffer, or its iovecs one at a time. */
static __always_inline void h2_walk_begin(struct scratch *s, u32 skip)
{
    s->h2_skip = skip;
    s->h2_seg_off = 0;
    s->h2_iov_at = 0;
    s->h2_iov_cached = 0;
    if (s->h2_vlen) {
        s->iov_next = s->h2_buf;
        s->iovs_left = s->h2_vlen;
        s->bytes_left = s->h2_total;
        s->h2_seg_base = 0;
        s->h2_seg_len = 0;
    } else {
        s->iovs_left = 0;
        s->bytes_left = 0;
        s->h2_seg_base = s->h2_buf;
        s->h2_seg_len = s->h2_total > 0x7fffffff ? 0x7fffffff : (u32)s->h2_total;
    }
}

/* The next iovec as the segment being walked; 0 when none is left. The
 * iovec array is read MAX_IOVECS at a time into s->iovs: gRPC writes a
 * message as several iovecs (frame header, prefix, message), and one read
 * per iovec cost more than the walk itself. */
static __always_inline int h2_next_segment(struct scratch *s)
{
    if (!s->iovs_left || !s->bytes_left)
        return 0;
    if (s->h2_iov_at >= s->h2_iov_cached) {
        u32 n = s->iovs_left < MAX_IOVECS ? s->iovs_left : MAX_IOVECS;
        if (n == 0 || n > MAX_IOVECS ||
            bpf_probe_read_user(s->iovs, n * sizeof(struct user_iovec), (void *)s->iov_next))
            return 0;
        s->h2_iov_at = 0;
        s->h2_iov_cached = n;
    }
    struct user_iovec iov = s->iovs[s->h2_iov_at & (MAX_IOVECS - 1)];
    s->h2_iov_at++;
    s->iov_next += sizeof(iov);
    s->iovs_left--;
    u64 len = iov.len < s->bytes_left ? iov.len : s->bytes_left;
    s->bytes_left -= len;
    s->h2_seg_base = iov.base;
    s->h2_seg_len = len > 0x7fffffff ? 0x7fffffff : (u32)len;
    s->h2_seg_off = 0;
    return 1;
}

/* Bytes of the syscall the walk has not reached. */
static __always_inline int h2_bytes_remain(struct scratch *s)
{
    return s->h2_seg_off < s->h2_seg_len || (s->iovs_left && s->bytes_left);
}

static __always_inline u32 h2_be24(const u8 *b)
{
    return ((u32)b[0] << 16) | ((u32)b[1] << 8) | b[2];
}

static __always_inline u32 h2_be32(const u8 *b)
{
    return ((u32)b[0] << 24) | ((u32)b[1] << 16) | ((u32)b[2] << 8) | b[3];
}

/* Reads up to `want` bytes at `at` into `into` + `have` (have < 16, want <=
 * 9): the part of a frame header or message prefix this segment holds.
 * Returns how many. */
static __always_inline u32 h2_take_bytes(u8 *into, u32 have, u32 want, u64 at, u32 avail)
{
    u64 got = avail < want ? avail : want;
    u64 offset = have;
    /* Masks the compiler could prove redundant and drop, kept for the
     * verifier, which tracks these registers' 64-bit bounds only. */
    asm volatile("%0 &= 15" : "+r"(got));
    asm volatile("%0 &= 15" : "+r"(offset));
    if (got == 0 || bpf_probe_read_user(into + offset, got, (void *)at))
        return 0;
    return (u32)got;
}

/* What an SSE payload starts with: a "data:" line (H2_PART_FLAG_SSE_DATA),
 * and whether that is the end marker "data: [DONE]" (H2_PART_FLAG_SSE_DONE). */
static __always_inline u8 h2_sse_start(u64 at, u32 avail)
{
    if (avail < 5)
        return 0;
    u64 word[2] = {};
    bpf_probe_read_user(word, avail < 16 ? (avail & 15) : 16, (void *)at);
    if ((word[0] & 0xffffffffffULL) != 0x3a61746164ULL)   /* "data:" little-endian */
        return 0;
    int done = (word[0] == 0x445b203a61746164ULL && (word[1] & 0xffffffff) == 0x5d454e4fULL) ||  /* "data: [D" "ONE]" */
               (word[0] == 0x4f445b3a61746164ULL && (word[1] & 0xffffff) == 0x5d454eULL);        /* "data:[DO" "NE]" */
    return done ? H2_PART_FLAG_SSE_DATA | H2_PART_FLAG_SSE_DONE : H2_PART_FLAG_SSE_DATA;
}

#endif /* INFERPROBE_HTTP2_BPF_H */

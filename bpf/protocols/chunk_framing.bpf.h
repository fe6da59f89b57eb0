/* chunk_framing.bpf.h: HTTP/1 chunk framing known from iovec lengths alone.
 *
 * Holds find_framing (mark_framing, framing_chains, hex_word): which of a
 * vectored write's iovecs are chunk-size lines and CRLFs, so that
 * copy_iovecs (gather.bpf.h) writes their bytes into the head instead of
 * reading them. Needs struct scratch and MAX_IOVECS (scratch.bpf.h) and
 * stay_in_memory (scan_bytes.bpf.h). Applies only on a connection whose
 * response headers said chunked (remember_chunked in sock.bpf.c).
 */
#ifndef INFERPROBE_CHUNK_FRAMING_BPF_H
#define INFERPROBE_CHUNK_FRAMING_BPF_H

/* Chunk framing known from the iovec lengths alone. A server that frames
 * its chunks itself hands each piece of the framing to writev() or
 * sendmsg() as a buffer of its own:
 *   Node's http module: [size, "\r\n", payload, "\r\n"]
 *   hyper, asyncio's writelines(), h11: [size "\r\n", payload, "\r\n"]
 * and a helper call costs ~70 ns here whatever it copies, so reading those
 * 2-byte buffers was most of what a Node token chunk cost. Where the
 * lengths fit that pattern exactly (the size buffer as long as the
 * payload's length in hex, with or without its CRLF; the CRLFs two bytes),
 * the framing is written into the head as the server must have written it
 * (the size in lowercase hex: only its length matters to the scans, and no
 * hex digit starts a field they look for) and only the payload is read.
 * They must also chain from the first iovec (framing_chains), on a
 * connection whose response headers said chunked (remember_chunked). Any
 * other shape is read byte for byte. */
static __always_inline u32 hex_digits(u64 len)
{
    return len < 0x10 ? 1 : len < 0x100 ? 2 : len < 0x1000 ? 3 : len < 0x10000 ? 4 : 0;
}

/* A buffer of `size_len` bytes can be the size line of a `payload`-byte
 * chunk: its hex digits, and its CRLF when `with_crlf`. A payload of 64 KiB
 * or more (hex_digits 0) never fits: an empty buffer, or a bare CRLF, is not
 * a size of no digits. */
static __always_inline int size_fits(u64 size_len, u64 payload, u32 with_crlf)
{
    u32 digits = hex_digits(payload);
    return digits && size_len == digits + (with_crlf ? 2 : 0);
}

#define CRLF_WORD 0x0a0dULL   /* "\r\n" as the little-endian bytes of a word */

/* `len` in `digits` lowercase hex digits, as the bytes of a word. No
 * branch: the verifier follows each one per iovec of the unrolled loop. */
static __always_inline u64 hex_word(u64 len, u32 digits)
{
    u64 word = 0;
#pragma unroll
    for (u32 j = 0; j < 4; j++) {
        u64 nibble = (len >> (4 * (3 - j))) & 0xf;
        word |= (nibble + '0' + 39 * ((nibble + 6) >> 4)) << (8 * j);   /* 10-15: 'a'-'f' */
    }
    return word >> (8 * ((4 - digits) & 3));   /* the last `digits` of four */
}

enum frame_role { ROLE_PAYLOAD = 0, ROLE_CRLF = 1, ROLE_SIZE = 2, ROLE_SIZE_CRLF = 3 };
enum frame_expect { EXPECT_SIZE = 0, EXPECT_CRLF_AFTER_SIZE, EXPECT_PAYLOAD, EXPECT_CRLF_AFTER_PAYLOAD };

/* Marks each of the first `count` iovecs of s->iovs that fits a framing
 * role by its length and its neighbours' (s->frame_role, s->frame_word:
 * the bytes it must hold). Every k is tried, the CRLFs of the chunk before
 * too (a CRLF never fits as a size: its payload would have to be 16-255
 * bytes with two more 2-byte buffers after it). Inlined (sock_hash.bpf.o),
 * no early exit: with one, or a `continue`, clang rolled the loop back up
 * and the verifier lost its bound. In a global function (find_framing in
 * sock.bpf.o) the verifier checks the loop once whatever its shape, so it
 * stops after the last iovec: a Node chunk's four, not all sixteen (the
 * rounds past `count` cost ~60 ns a write and change nothing). */
#ifdef HAVE_BPF_LOOP
#define FRAMING_STOP_AT(done) if (done) break
#else
#define FRAMING_STOP_AT(done)
#endif

static __always_inline void mark_framing(struct scratch *s, u32 count)
{
    __builtin_memset(s->frame_word, 0, sizeof(s->frame_word));
    __builtin_memset(s->frame_role, 0, sizeof(s->frame_role));
#pragma unroll
    for (u32 k = 0; k + 2 < MAX_IOVECS; k++) {
        FRAMING_STOP_AT(k + 2 >= count);   /* every test below needs k + 2 < count */
        u64 size_len = s->iovs[k].len, next = s->iovs[k + 1].len, after = s->iovs[k + 2].len;
        u32 four = k + 3 < count && k + 3 < MAX_IOVECS;
        if (k + 2 < count && four && next == 2 && after && size_fits(size_len, after, 0) &&
            s->iovs[(k + 3) & (MAX_IOVECS - 1)].len == 2) {
            s->frame_role[k] = ROLE_SIZE;
            s->frame_word[k] = hex_word(after, size_len);
            s->frame_role[k + 1] = ROLE_CRLF;
            s->frame_word[k + 1] = CRLF_WORD;
            s->frame_role[(k + 3) & (MAX_IOVECS - 1)] = ROLE_CRLF;
            s->frame_word[(k + 3) & (MAX_IOVECS - 1)] = CRLF_WORD;
        } else if (k + 2 < count && next && after == 2 && size_fits(size_len, next, 1)) {
            s->frame_role[k] = ROLE_SIZE_CRLF;
            s->frame_word[k] = hex_word(next, size_len - 2) | (CRLF_WORD << (8 * ((size_len - 2) & 3)));
            s->frame_role[k + 2] = ROLE_CRLF;
            s->frame_word[k + 2] = CRLF_WORD;
        }
        stay_in_memory();
    }
}

/* The roles must chain from the first iovec: chunk after chunk, each a
 * size (with or without its CRLF), its payload, a CRLF, and at most one
 * buffer after the last chunk that is read (Node's "0\r\n\r\n"). The
 * chunks may run on past the iovecs looked at (`more`). Anything else, such
 * as a body split into arbitrary pieces whose lengths happen to fit at
 * some k, is read byte for byte. */
static __always_inline int framing_chains(struct scratch *s, u32 count, u32 more)
{
    u32 expect = EXPECT_SIZE, broken = 0;
#pragma unroll
    for (u32 k = 0; k < MAX_IOVECS; k++) {
        FRAMING_STOP_AT(k >= count);   /* a round past count changes nothing */
        if (k < count) {
            u8 role = s->frame_role[k];
            if (expect == EXPECT_SIZE) {
                if (role == ROLE_SIZE)
                    expect = EXPECT_CRLF_AFTER_SIZE;
                else if (role == ROLE_SIZE_CRLF)
                    expect = EXPECT_PAYLOAD;
                else if (role != ROLE_PAYLOAD || k + 1 != count || more)
                    broken = 1;
            } else if (expect == EXPECT_CRLF_AFTER_SIZE) {
                broken |= role != ROLE_CRLF;
                expect = EXPECT_PAYLOAD;
            } else if (expect == EXPECT_PAYLOAD) {
                broken |= role != ROLE_PAYLOAD;
                expect = EXPECT_CRLF_AFTER_PAYLOAD;
            } else {
                broken |= role != ROLE_CRLF;
                expect = EXPECT_SIZE;
            }
        }
    }
    return !broken && (expect == EXPECT_SIZE || more);
}

/* The framing buffers of the first `count` iovecs, when they chain
 * (s->frame_word: 0 for every buffer to read). */
STEP_VERIFIED_ALONE int find_framing(struct scratch *s, u32 count, u32 more)
{
    if (!s)
        return 0;
    mark_framing(s, count);
    if (!framing_chains(s, count, more))
        __builtin_memset(s->frame_word, 0, sizeof(s->frame_word));
    return 0;
}

#endif /* INFERPROBE_CHUNK_FRAMING_BPF_H */

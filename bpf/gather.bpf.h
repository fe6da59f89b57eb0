/* gather.bpf.h: copying what a syscall moved into the scratch head.
 *
 * Holds copy_buffer (a plain buffer), copy_iovecs (readv, writev, sendmsg,
 * recvmsg: up to MAX_IOVECS iovecs, concatenated) and find_last_iovec (the
 * buffer holding a vectored write's last byte, for scan_tail). Protocol
 * blind, except that copy_iovecs lets find_framing (chunk_framing.bpf.h)
 * supply the framing buffers of a chunked body. Needs struct scratch
 * (scratch.bpf.h) and the framing header. Run by classify_io and the
 * gather_iovecs and gather_window programs (sock.bpf.c).
 */
#ifndef INFERPROBE_GATHER_BPF_H
#define INFERPROBE_GATHER_BPF_H

/* Copies up to SCAN_HEAD_BYTES of a plain buffer into the scratch head, and
 * remembers it as the last buffer touched, for the tail scan. */
static __always_inline void copy_buffer(struct scratch *s, u64 buf, u64 moved)
{
    u32 n = moved > SCAN_HEAD_BYTES ? SCAN_HEAD_BYTES : (u32)moved;
    if (n > 0 && n <= SCAN_HEAD_BYTES)
        bpf_probe_read_user(s->head, n, (void *)buf);
    s->n = n;
    s->last_base = buf;
    s->last_len = moved;
    s->tail_in_head = moved == n;
    s->bytes_left = 0;
    s->more = moved > n;
}

/* One iovec of copy_iovecs' walk (s->gather_*): copies what the syscall
 * moved through it into the head, as far as the head has room. Returns 1
 * where the walk ends: no iovec read is left, no byte moved is left, or the
 * head is full (then the iovec stays next, with s->iov_skip of its bytes
 * copied). Remembers the last buffer touched for the tail scan. */
static __always_inline int gather_one(struct scratch *s)
{
    u32 k = s->gather_k;
    u64 remaining = s->gather_remaining;
    u32 copied = s->gather_copied;
    if (k >= s->gather_count || k >= MAX_IOVECS || remaining == 0 || copied >= SCAN_HEAD_BYTES)
        return 1;
    u64 skip = k == 0 ? s->gather_first_skip : 0;
    /* The index masked as written: clang drops the mask after the check
     * above, which the inlined build's verifier does not tie to it. */
    u64 slot = k;
    asm volatile("" : "+r"(slot));
    slot &= MAX_IOVECS - 1;
    struct user_iovec iov = s->iovs[slot];
    u64 avail = iov.len > skip ? iov.len - skip : 0;
    u64 take = avail < remaining ? avail : remaining;
    s->gather_k = k + 1;
    s->gather_walked = k + 1;
    if (take == 0)
        return 0;   /* an empty iovec: nothing to copy */
    s->last_base = iov.base;
    s->last_len = skip + take;
    u32 room = SCAN_HEAD_BYTES - copied;
    u32 n = take > room ? room : (u32)take;
    u64 off = copied, size = n;
    /* Hide what the compiler knows so that the checks stay in the code as
     * written: the verifier needs them to bound off + size. */
    asm volatile("" : "+r"(off), "+r"(size));
    off &= SCAN_HEAD_BYTES - 1;
    if (size > SCAN_HEAD_BYTES)
        size = SCAN_HEAD_BYTES;
    u64 frame = s->frame_word[slot];
    if (frame)   /* one store; bytes past `size` are overwritten next, or lie past s->n */
        *(u64 *)&s->head[off] = frame >> (8 * (skip & 7));
    else if (size > 0)
        bpf_probe_read_user(&s->head[off], size, (void *)(iov.base + skip));
    s->gather_copied = copied + n;
    s->gather_remaining = remaining - n;
    s->tail_in_head = n == take;
    if (n < take) {
        s->iov_skip = skip + n;   /* the head is full inside this iovec: it comes next */
        s->gather_walked = k;
        return 1;
    }
    return 0;
}

/* Two iovecs of the walk per call: each call (with the tail-call counter
 * it carries) costs ~10 ns, and most vectored writes have 2-4 iovecs.
 * Returns 1 where the walk ends. */
STEP_VERIFIED_ALONE int gather_step(struct scratch *s)
{
    if (!s)
        return 1;
    return gather_one(s) || gather_one(s);
}

/* Vectored I/O: concatenates up to MAX_IOVECS iovecs not yet copied
 * (s->iov_next, s->iovs_left, s->bytes_left) into the head from `at` up to
 * SCAN_HEAD_BYTES, and leaves those fields describing the rest: for the next
 * window, or for find_last_iovec(). An iovec the head fills stays next, with
 * s->iov_skip of its bytes copied; `resume` starts past them.
 *
 * The iovec array is read in one bpf_probe_read_user(), not one per iovec:
 * each call costs ~40 ns here whatever its size (Node's 4-iovec chunk went
 * from 964 to 845 ns in its exit program, benchmarks/bench_syscalls.py). */
static __always_inline void copy_iovecs(struct scratch *s, u32 at, int resume)
{
    u64 buf = s->iov_next;
    u32 vlen = s->iovs_left;
    s->gather_first_skip = resume ? s->iov_skip : 0;
    s->gather_remaining = s->bytes_left;
    s->gather_copied = at;
    s->gather_walked = 0;
    s->gather_k = 0;
    s->tail_in_head = 0;
    s->iov_skip = 0;
    /* The kernel has just read these for the syscall: they are mapped, and a
     * failed read (never seen) copies nothing rather than garbage. */
    u32 count = vlen < MAX_IOVECS ? vlen : MAX_IOVECS;
    u64 array_bytes = (u64)count * sizeof(struct user_iovec);
    asm volatile("" : "+r"(array_bytes));
    if (array_bytes > sizeof(s->iovs))
        array_bytes = sizeof(s->iovs);
    if (array_bytes == 0 || bpf_probe_read_user(s->iovs, array_bytes, (void *)buf) != 0)
        count = 0;
    s->gather_count = count;
    if (s->body & BODY_CHUNKED)
        find_framing(s, count, vlen > count);
    else
        __builtin_memset(s->frame_word, 0, sizeof(s->frame_word));
#pragma unroll
    for (u32 k = 0; k < MAX_IOVECS; k += 2) {
        if (k >= count || gather_step(s))
            break;
    }
    u32 walked = s->gather_walked;
    s->n = s->gather_copied;
    s->iov_next = buf + walked * sizeof(struct user_iovec);
    s->iovs_left = vlen - walked;
    s->bytes_left = s->gather_remaining;
}

/* A vectored write's end can lie past the iovecs copy_iovecs() read: more
 * than MAX_IOVECS of them, or a head filled by the first. Walk the rest of
 * the array, without copying, to the buffer holding the last byte moved, so
 * that the tail is that buffer's end. Past IOV_WALK_MAX iovecs there is no
 * tail rather than a wrong one. */
#define IOV_WALK_MAX 64

/* Reads the iovec at `at` and takes what the syscall moved through it past
 * its first `skip` bytes, at most `remaining`: a buffer that took bytes
 * becomes the last one touched (an empty one leaves the one before).
 * Returns the bytes taken. */
static __always_inline u64 take_iovec(struct scratch *s, u64 at, u64 skip, u64 remaining,
                                      struct user_iovec *iov)
{
    bpf_probe_read_user(iov, sizeof(*iov), (void *)at);
    u64 avail = iov->len > skip ? iov->len - skip : 0;
    u64 take = avail < remaining ? avail : remaining;
    if (take) {
        s->last_base = iov->base;
        s->last_len = skip + take;
    }
    return take;
}

static __always_inline void find_last_iovec(struct scratch *s)
{
    u64 remaining = s->bytes_left;
    u64 next = s->iov_next;
    u32 left = s->iovs_left;
    if (!remaining)
        return;
    for (u32 k = 0; k < IOV_WALK_MAX; k++) {
        if (k >= left || !remaining)
            break;
        struct user_iovec iov = {};
        u64 take = take_iovec(s, next + k * sizeof(iov), k ? 0 : s->iov_skip, remaining, &iov);
        if (take)
            s->tail_in_head = 0;
        remaining -= take;
    }
    if (remaining)
        s->last_len = 0;
}

#endif /* INFERPROBE_GATHER_BPF_H */

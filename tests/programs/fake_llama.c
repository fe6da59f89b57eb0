/* A stand-in for llama.cpp's C API: exports llama_decode with llama.h's
 * struct llama_batch passed by value, and calls it with batches whose layout
 * is known, so tests/integration/engines/test_llama_uprobes.py can compare
 * what bpf/llama.bpf.c read with what was passed. Waits for a line on stdin
 * (the tracer attached), then runs the batches, printing one line per call:
 * "call <n_tokens> <t_enter_ns> <t_return_ns>" on CLOCK_MONOTONIC. */
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

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

__attribute__((noinline, visibility("default"))) int32_t llama_decode(void *ctx, llama_batch batch)
{
    volatile int32_t sink = batch.n_tokens;
    struct timespec pause = {0, 2000000};  /* 2 ms of "compute" */
    nanosleep(&pause, NULL);
    (void)ctx;
    return sink > 0 ? 0 : 1;
}

/* runs: (seq, pos0, n, sampled) */
static void run_batch(int n_runs, const int (*runs)[4])
{
    int total = 0;
    for (int r = 0; r < n_runs; r++)
        total += runs[r][2];
    llama_batch b = {0};
    b.n_tokens = total;
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
    uint64_t t0 = now_ns();
    int32_t rc = llama_decode((void *)0x1234, b);
    uint64_t t1 = now_ns();
    printf("call %d %llu %llu %d\n", total, (unsigned long long)t0, (unsigned long long)t1, rc);
    fflush(stdout);
    for (int k = 0; k < total; k++)
        free(b.seq_id[k]);
    free(b.token); free(b.pos); free(b.n_seq_id); free(b.seq_id); free(b.logits);
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
    run_batch(1, prefill);
    run_batch(2, mixed);
    run_batch(3, three);
    return 0;
}

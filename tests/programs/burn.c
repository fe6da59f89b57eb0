/* burn.c: three functions burning CPU in a 6:3:1 split of work, for the
 * on-CPU profiler test. Worker threads run short units of work, choosing
 * burn_a, burn_b or burn_c at random with probabilities 0.6, 0.3 and 0.1: a
 * fixed order would alias with the sampling period and bias the shares. Each
 * call is timed with the thread's own CPU clock, so the program reports the
 * truth the sampled shares are compared with. Four threads: more samples
 * on a busy two-core machine.
 *
 * Prints "READY <pid>" once running; on SIGTERM prints one line
 * "CPU burn_a=<s> burn_b=<s> burn_c=<s>" (thread CPU seconds, all threads)
 * and exits. Build with frame pointers so stacks are whole.
 *
 * With --hold it starts burning only once a line arrives on stdin: a test
 * says "go" after the tracer attached, so the four threads do not take both
 * cores from the BPF compile (three times slower with them).
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define UNIT_ITERS 60000UL /* roughly 0.1 ms of work */
#define THREADS 4

static volatile sig_atomic_t stop;
static volatile unsigned long sink;

static void on_term(int sig) { (void)sig; stop = 1; }

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define BURN_BODY(units)                                        \
    do {                                                        \
        unsigned long acc = sink;                               \
        for (unsigned long i = 0; i < (units) * UNIT_ITERS; i++) \
            acc = acc * 6364136223846793005UL + i;              \
        sink = acc;                                             \
    } while (0)

__attribute__((noinline)) void burn_a(unsigned long units) { BURN_BODY(units); }
__attribute__((noinline)) void burn_b(unsigned long units) { BURN_BODY(units); }
__attribute__((noinline)) void burn_c(unsigned long units) { BURN_BODY(units); }

struct worker_state {
    uint64_t rng;
    double spent[3];
};

static void *worker(void *arg)
{
    struct worker_state *st = arg;
    void (*fns[3])(unsigned long) = {burn_a, burn_b, burn_c};
    while (!stop) {
        st->rng ^= st->rng << 13; /* xorshift64 */
        st->rng ^= st->rng >> 7;
        st->rng ^= st->rng << 17;
        unsigned r = st->rng % 10;
        int which = r < 6 ? 0 : r < 9 ? 1 : 2;
        double t0 = thread_cpu_s();
        fns[which](1);
        st->spent[which] += thread_cpu_s() - t0;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t threads[THREADS];
    struct worker_state states[THREADS] = {{0}};
    char line[16];
    signal(SIGTERM, on_term);
    printf("READY %d\n", getpid());
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "--hold") == 0 && !fgets(line, sizeof(line), stdin))
        return 1;
    for (int i = 0; i < THREADS; i++) {
        states[i].rng = 0x9E3779B97F4A7C15ULL * (i + 1) ^ (uint64_t)time(NULL);
        pthread_create(&threads[i], NULL, worker, &states[i]);
    }
    while (!stop)
        pause();
    double spent[3] = {0, 0, 0};
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        for (int j = 0; j < 3; j++)
            spent[j] += states[i].spent[j];
    }
    printf("CPU burn_a=%.6f burn_b=%.6f burn_c=%.6f\n", spent[0], spent[1], spent[2]);
    return 0;
}

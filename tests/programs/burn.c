/* burn.c: three functions burning CPU in a fixed 6:3:1 split of work, for the
 * on-CPU profiler test. Each call is timed with the thread's own CPU clock,
 * so the program reports the truth the sampled shares are compared with.
 *
 * Prints "READY <pid>" once running; on SIGTERM prints one line
 * "CPU burn_a=<s> burn_b=<s> burn_c=<s>" (thread CPU seconds) and exits.
 * Built with frame pointers (-fno-omit-frame-pointer) so stacks are whole.
 */
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define UNIT_ITERS 370000UL /* about a third of a millisecond: no multiple of a 99 Hz period */

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

int main(void)
{
    double spent[3] = {0, 0, 0};
    signal(SIGTERM, on_term);
    printf("READY %d\n", getpid());
    fflush(stdout);
    while (!stop) {
        double t0 = thread_cpu_s();
        burn_a(6);
        double t1 = thread_cpu_s();
        burn_b(3);
        double t2 = thread_cpu_s();
        burn_c(1);
        double t3 = thread_cpu_s();
        spent[0] += t1 - t0;
        spent[1] += t2 - t1;
        spent[2] += t3 - t2;
    }
    printf("CPU burn_a=%.6f burn_b=%.6f burn_c=%.6f\n", spent[0], spent[1], spent[2]);
    return 0;
}

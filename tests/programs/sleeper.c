/* sleeper.c: a worker thread that sleeps 200 ms in wait_for_batch() and then
 * works briefly in do_batch(), over and over: the off-CPU profiler test
 * checks that wait_for_batch shows up weighted by the time it slept.
 *
 * The sleep is a raw nanosleep system call made inside wait_for_batch (x86-64
 * inline assembly), not glibc's nanosleep(): Debian's libc has no frame
 * pointers, so a frame-pointer walk from inside libc skips the function that
 * called it (docs/flamegraphs.md says more).
 *
 * Prints "READY <pid>"; on SIGTERM prints
 * "SLEPT periods=<n> mean_us=<us>" (the worker's own CLOCK_MONOTONIC
 * measurement of each sleep) and exits.
 */
#include <pthread.h>
#include <sys/syscall.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static volatile unsigned long sink;
static double slept_us;
static long periods;

static void on_term(int sig) { (void)sig; stop = 1; }

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

__attribute__((noinline)) void wait_for_batch(void)
{
    struct timespec d = {0, 200 * 1000 * 1000};
    double t0 = now_us();
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "0"((long)SYS_nanosleep), "D"(&d), "S"(0L)
                     : "rcx", "r11", "memory");
    (void)ret;
    slept_us += now_us() - t0;
    periods++;
}

__attribute__((noinline)) void do_batch(void)
{
    unsigned long acc = sink;
    for (unsigned long i = 0; i < 2000000UL; i++)
        acc = acc * 6364136223846793005UL + i;
    sink = acc;
}

static void *worker(void *arg)
{
    (void)arg;
    while (!stop) {
        wait_for_batch();
        do_batch();
    }
    return NULL;
}

int main(void)
{
    pthread_t t;
    signal(SIGTERM, on_term);
    pthread_create(&t, NULL, worker, NULL);
    printf("READY %d\n", getpid());
    fflush(stdout);
    while (!stop)
        pause();
    pthread_join(t, NULL);
    printf("SLEPT periods=%ld mean_us=%.1f\n", periods, periods ? slept_us / periods : 0.0);
    return 0;
}

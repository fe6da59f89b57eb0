/* usdt_flood: fires the inferprobe token_emit USDT probe N times, as fast as
 * it can, once a tracer has attached and a line arrives on stdin. bcc sets
 * the semaphore when it prepares the probe, before its program is compiled
 * and attached, so the semaphore alone does not say "traced yet".
 *
 * Used by the ring buffer tests and benchmarks/bench_collector.py as a
 * kernel-side event source of known size: every firing is one event that
 * the kernel either sends or counts as lost.
 *
 * usage: usdt_flood N   (prints "ready", waits for the semaphore and a line
 *                        on stdin, fires, prints "fired N ..."; exits at EOF)
 */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

unsigned short inferprobe_token_emit_semaphore __attribute__((unused))
    __attribute__((section(".probes")));

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    printf("ready\n");
    fflush(stdout);
    while (!*(volatile unsigned short *)&inferprobe_token_emit_semaphore)
        usleep(1000);
    char line[16];
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (volatile long i = 0; i < n; i++) {
        long req = 7, idx = i;
        STAP_PROBE2(inferprobe, token_emit, req, idx);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("fired %ld in %.3f s\n", n, (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    fflush(stdout);
    /* Stay until told: the recorder must not see its target exit early. */
    getchar();
    return 0;
}

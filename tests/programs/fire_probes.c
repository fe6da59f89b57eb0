/*
 * Fires every inferprobe probe through <inferprobe/usdt.h> on command; the
 * C/C++ twin of probe_child.py (protocol and values: usdt_trace.py). Built
 * by tests/probes/test_usdt_header.py as C and as C++, together with
 * fire_probes_tu2.c, which includes the header without defining the
 * semaphores.
 */
#define INFERPROBE_USDT_DEFINE_SEMAPHORES
#include <inferprobe/usdt.h>

#include <stdio.h>
#include <string.h>

/* usdt_trace.value(): distinct, wider than 32 bits, alternating sign. */
#define V(i, j) ((((i) + (j)) % 2 ? -1 : 1) * (int64_t)((((int64_t)(i) + 1) << 40) | (((int64_t)(j) + 1) << 20) | 0x5A5))

void fire_scheduler_state(int64_t waiting, int64_t running, int64_t used, int64_t capacity);

static void fire(void)
{
    INFERPROBE_REQUEST_START(V(0, 0), V(0, 1), V(0, 2));
    INFERPROBE_REQUEST_QUEUED(V(1, 0), V(1, 1));
    INFERPROBE_REQUEST_SCHEDULED(V(2, 0), V(2, 1));
    INFERPROBE_PREFILL_START(V(3, 0), V(3, 1));
    INFERPROBE_PREFILL_END(V(4, 0), V(4, 1));
    INFERPROBE_DECODE_STEP_START(V(5, 0), V(5, 1), V(5, 2));
    INFERPROBE_DECODE_STEP_END(V(6, 0), V(6, 1), V(6, 2));
    INFERPROBE_TOKEN_EMIT(V(7, 0), V(7, 1));
    INFERPROBE_REQUEST_END(V(8, 0), V(8, 1), V(8, 2));
    fire_scheduler_state(V(9, 0), V(9, 1), V(10, 0), V(10, 1));
    INFERPROBE_REQUEST_START(INT64_MAX, INT64_MIN, -1);
}

int main(void)
{
    char line[64];
    printf("ready 1 -\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "enabled\n") == 0)
            printf("enabled %d\n", INFERPROBE_ENABLED() ? 1 : 0);
        else if (strcmp(line, "fire\n") == 0) {
            fire();
            printf("fired 0\n");
        } else
            printf("unknown command\n");
        fflush(stdout);
    }
    return 0;
}

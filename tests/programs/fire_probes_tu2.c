/* A second translation unit: uses the semaphores fire_probes.c defines. */
#include <inferprobe/usdt.h>

void fire_scheduler_state(int64_t waiting, int64_t running, int64_t used, int64_t capacity);

void fire_scheduler_state(int64_t waiting, int64_t running, int64_t used, int64_t capacity)
{
    INFERPROBE_QUEUE_DEPTH(waiting, running);
    INFERPROBE_KV_USAGE(used, capacity);
}

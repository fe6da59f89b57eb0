/* The self-pipe trick over a socketpair, in C: a worker thread wakes the
 * main thread by writing a byte to one end, the main thread reads it from
 * the other (how C servers wake their event loops from other threads).
 * Prints READY with the pair made, waits for "go" on stdin, then 200
 * wake-ups 5 ms apart, prints "done N", and waits for a last line. */
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#define WAKEUPS 200

static int pair[2];

static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < WAKEUPS; i++) {
        char byte = 1;
        if (write(pair[0], &byte, 1) != 1)
            break;
        usleep(5000);
    }
    return NULL;
}

int main(void)
{
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0)
        return 1;
    printf("READY\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    pthread_t thread;
    pthread_create(&thread, NULL, worker, NULL);
    int woken = 0;
    while (woken < WAKEUPS) {
        char byte;
        if (read(pair[1], &byte, 1) != 1)
            break;
        woken++;
    }
    pthread_join(thread, NULL);
    printf("done %d\n", woken);
    fflush(stdout);
    fgets(line, sizeof(line), stdin);
    return 0;
}

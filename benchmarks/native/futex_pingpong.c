/* futex_pingpong: two threads hand a token back and forth through two
 * semaphores (each handoff is one FUTEX_WAKE and, usually, one FUTEX_WAIT).
 * Listens on a TCP port (so `inferprobe record` accepts it as a server),
 * prints "LISTENING <port>", then for every line "N" on stdin runs N
 * handoffs and prints the elapsed nanoseconds. */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

static sem_t ping, pong;
static long rounds;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *ponger(void *arg)
{
    (void)arg;
    for (;;) {
        sem_wait(&ping);
        sem_post(&pong);
    }
    return NULL;
}

int main(void)
{
    int srv = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    if (bind(srv, (struct sockaddr *)&addr, sizeof(addr)) || listen(srv, 1))
        return 1;
    getsockname(srv, (struct sockaddr *)&addr, &len);
    sem_init(&ping, 0, 0);
    sem_init(&pong, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, ponger, NULL);
    printf("LISTENING %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof(line), stdin)) {
        rounds = atol(line);
        long long t0 = now_ns();
        for (long i = 0; i < rounds; i++) {
            sem_post(&ping);
            sem_wait(&pong);
        }
        printf("%lld\n", now_ns() - t0);
        fflush(stdout);
    }
    return 0;
}

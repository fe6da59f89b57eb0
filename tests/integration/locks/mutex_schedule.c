/* mutex_schedule: an HTTP server whose request thread contends on a mutex
 * with a known schedule, and measures its own wait fraction.
 *
 * A holder thread loops: lock, hold HOLD_MS, unlock (in release_lock()),
 * pause PERIOD_MS - HOLD_MS. For "GET /run?sleep_us=W&cycles=N" the thread
 * that read the request runs N cycles of: pthread_mutex_lock (timed with
 * CLOCK_MONOTONIC), unlock, sleep W us; then it writes a response whose body
 * is the measured wait fraction: wait_ns / (response start - request read).
 * With W a bit below the holder's period each lock waits for the holder's
 * next release, so the fraction is about (PERIOD - W) / PERIOD.
 *
 * "GET /stream?tokens=N" is the other kind of wait: an engine thread makes a
 * token every TOKEN_MS and signals a condition variable; the request thread
 * waits on it for each token and writes it as an SSE event (like llama.cpp's
 * HTTP threads). That is a handoff, not contention.
 *
 * Build: cc -O1 -g -fno-omit-frame-pointer -pthread mutex_schedule.c
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PERIOD_MS 10
#define HOLD_MS 9
#define TOKEN_MS 5

static pthread_mutex_t token_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t token_ready = PTHREAD_COND_INITIALIZER;
static unsigned long tokens_made;

static void *engine(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec ts = {0, TOKEN_MS * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&token_lock);
        tokens_made++;
        pthread_cond_broadcast(&token_ready);
        pthread_mutex_unlock(&token_lock);
    }
    return NULL;
}

static void stream(int c, int tokens)
{
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Connection: close\r\n\r\n";
    write(c, head, strlen(head));
    pthread_mutex_lock(&token_lock);
    unsigned long seen = tokens_made;
    for (int i = 0; i < tokens; i++) {
        while (tokens_made == seen)
            pthread_cond_wait(&token_ready, &token_lock);
        seen = tokens_made;
        pthread_mutex_unlock(&token_lock);
        char chunk[64];
        int n = snprintf(chunk, sizeof(chunk), "data: {\"token\": %d}\n\n", i);
        write(c, chunk, n);
        pthread_mutex_lock(&token_lock);
    }
    pthread_mutex_unlock(&token_lock);
    write(c, "data: [DONE]\n\n", 14);
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Not inlined: the waker stack of every contended wait must name it. */
__attribute__((noinline)) void release_lock(void)
{
    pthread_mutex_unlock(&lock);
}

static void *holder(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        sleep_us(HOLD_MS * 1000);
        release_lock();
        sleep_us((PERIOD_MS - HOLD_MS) * 1000);
    }
    return NULL;
}

__attribute__((noinline)) long long contend(long sleep, int cycles)
{
    long long waited = 0;
    for (int i = 0; i < cycles; i++) {
        long long t0 = now_ns();
        pthread_mutex_lock(&lock);
        waited += now_ns() - t0;
        pthread_mutex_unlock(&lock);
        sleep_us(sleep);
    }
    return waited;
}

int main(void)
{
    int srv = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(srv, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    if (bind(srv, (struct sockaddr *)&addr, sizeof(addr)) || listen(srv, 16))
        return 1;
    getsockname(srv, (struct sockaddr *)&addr, &len);
    pthread_t t;
    pthread_create(&t, NULL, holder, NULL);
    pthread_create(&t, NULL, engine, NULL);
    printf("LISTENING %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (;;) {
        int c = accept(srv, NULL, NULL);
        if (c < 0)
            continue;
        char buf[1024];
        ssize_t n = read(c, buf, sizeof(buf) - 1);
        long long t_read = now_ns();
        if (n <= 0) {
            close(c);
            continue;
        }
        buf[n] = 0;
        if (strncmp(buf, "GET /stream", 11) == 0) {
            char *q = strstr(buf, "tokens=");
            stream(c, q ? atoi(q + 7) : 10);
            close(c);
            continue;
        }
        long sleep = 5000;
        int cycles = 20;
        char *q = strstr(buf, "sleep_us=");
        if (q)
            sleep = atol(q + 9);
        q = strstr(buf, "cycles=");
        if (q)
            cycles = atoi(q + 7);
        long long waited = contend(sleep, cycles);
        char body[128], head[256];
        int blen = snprintf(body, sizeof(body), "{\"wait_ns\": %lld, \"span_ns\": %lld}\n", waited,
                            now_ns() - t_read);
        int hlen = snprintf(head, sizeof(head),
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            "Content-Length: %d\r\nConnection: close\r\n\r\n", blen);
        memcpy(head + hlen, body, blen);
        write(c, head, hlen + blen);
        close(c);
    }
}

/* http_pingpong: the cheapest possible keep-alive HTTP server, and its client.
 *
 * `http_pingpong server` (the process to trace) accepts one connection and
 * answers every request with one write(). "GET /unary"
 * gets a small response with Content-Length; "GET /stream?n=K" gets the
 * headers, K SSE events ("data: tok\n\n") each in its own write(), and
 * the closing chunk, like a token stream. `http_pingpong client PORT` is
 * the client, a separate process so that it is not traced. Both sides are C doing nothing but the syscalls, so the time per request
 * is the kernel's plus whatever the tracer adds inside the server's
 * syscalls: the per-syscall cost of tracing, undiluted.
 *
 * The server prints "LISTENING <port>"; the client, for every stdin line
 * "unary N" or "stream N K", runs N requests and prints the elapsed ns.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* Reads until the request's blank line; returns 0 at EOF. */
static int read_request(int fd, char *buf, size_t size)
{
    size_t have = 0;
    while (have < size - 1) {
        ssize_t n = read(fd, buf + have, size - 1 - have);
        if (n <= 0)
            return 0;
        have += n;
        buf[have] = 0;
        if (strstr(buf, "\r\n\r\n"))
            return 1;
    }
    return 0;
}

static void serve(int fd)
{
    static const char unary[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                "Content-Length: 11\r\n\r\n{\"ok\":true}";
    static const char stream_head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                      "Transfer-Encoding: chunked\r\n\r\n";
    static const char event[] = "b\r\ndata: tok\n\n\r\n";
    static const char last[] = "0\r\n\r\n";
    char buf[1024];
    while (read_request(fd, buf, sizeof(buf))) {
        if (strncmp(buf, "GET /stream?n=", 14) == 0) {
            int k = atoi(buf + 14);
            if (write(fd, stream_head, sizeof(stream_head) - 1) < 0)
                return;
            for (int i = 0; i < k; i++)
                if (write(fd, event, sizeof(event) - 1) < 0)
                    return;
            if (write(fd, last, sizeof(last) - 1) < 0)
                return;
        } else if (write(fd, unary, sizeof(unary) - 1) < 0) {
            return;
        }
    }
}

/* Reads one response: for a stream, until the closing chunk. */
static int read_response(int fd, int stream)
{
    char buf[4096];
    size_t have = 0;
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
        if (n <= 0)
            return -1;
        have += n;
        buf[have] = 0;
        if (stream ? (have >= 5 && memcmp(buf + have - 5, "0\r\n\r\n", 5) == 0)
                   : (strstr(buf, "{\"ok\":true}") != NULL))
            return 0;
        if (have > sizeof(buf) - 256) {  /* keep only the tail: the terminator may straddle it */
            memmove(buf, buf + have - 4, 4);
            have = 4;
        }
    }
}

static void client(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char line[128], req[128];
    while (fgets(line, sizeof(line), stdin)) {
        long n = 0, k = 0;
        int stream = strncmp(line, "stream", 6) == 0;
        if (stream ? sscanf(line, "stream %ld %ld", &n, &k) != 2 : sscanf(line, "unary %ld", &n) != 1)
            continue;
        int len = stream ? snprintf(req, sizeof(req), "GET /stream?n=%ld HTTP/1.1\r\nHost: b\r\n\r\n", k)
                         : snprintf(req, sizeof(req), "GET /unary HTTP/1.1\r\nHost: b\r\n\r\n");
        long long t0 = now_ns();
        for (long i = 0; i < n; i++) {
            if (write(fd, req, len) != len || read_response(fd, stream) < 0)
                die("request");
        }
        printf("%lld\n", now_ns() - t0);
        fflush(stdout);
    }
}

static void server(void)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(addr);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(lfd, 4) < 0 ||
        getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0)
        die("listen");
    printf("LISTENING %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            die("accept");
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        serve(fd);
        close(fd);
    }
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "server") == 0)
        server();
    else if (argc == 3 && strcmp(argv[1], "client") == 0)
        client(atoi(argv[2]));
    else {
        fprintf(stderr, "usage: http_pingpong server | http_pingpong client PORT\n");
        return 2;
    }
    return 0;
}

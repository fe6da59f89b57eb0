/* http_pingpong: the cheapest possible keep-alive HTTP server, and its client.
 *
 * `http_pingpong server` (the process to trace) accepts one connection and
 * answers every request. "GET /unary" gets a small response with
 * Content-Length in one write(); "GET /stream?n=K&shape=S" gets the headers,
 * K chunked SSE events of an OpenAI-size token chunk, and the closing chunk,
 * like a token stream, each chunk written the way a server stack writes it:
 *   write    one write() of size line, event and CRLF (Go's net/http, h11)
 *   writev   writev([size, "\r\n", event, "\r\n"]) (Node's http module)
 *   sendmsg  sendmsg() of [size line, event, CRLF] (asyncio's writelines, hyper)
 *   writev16 four events per writev() of 16 iovecs (Node, corked)
 * `http_pingpong client PORT` is the client, a separate process so that it
 * is not traced. Both sides are C doing nothing but the syscalls, so the
 * time per request is the kernel's plus whatever the tracer adds inside the
 * server's syscalls: the per-syscall cost of tracing, undiluted.
 * `http_pingpong spin N` makes N one-byte read()s of /dev/zero and as many
 * write()s to /dev/null: syscalls of a process nobody traces, which the
 * probes still run on.
 *
 * The server prints "LISTENING <port>"; the client, for every stdin line
 * "unary N" or "stream N K SHAPE", runs N requests and prints the elapsed ns.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
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

/* An OpenAI chat completion chunk, 62 bytes as the issue measured Node's. */
#define EVENT "data: {\"choices\":[{\"delta\":{\"content\":\" tok\"},\"index\":0}]}\n\n"
#define EVENT_SIZE "3e"

static int write_all_iov(int fd, struct iovec *iov, int n, int use_sendmsg)
{
    if (use_sendmsg) {
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n};
        return sendmsg(fd, &msg, 0) < 0 ? -1 : 0;
    }
    return writev(fd, iov, n) < 0 ? -1 : 0;
}

/* One token chunk, or (writev16) four, in the shape's syscall. */
static int write_events(int fd, const char *shape, int count)
{
    static const char chunk[] = EVENT_SIZE "\r\n" EVENT "\r\n";
    static const char size_line[] = EVENT_SIZE "\r\n";
    struct iovec iov[16];
    int n = 0;
    if (strcmp(shape, "write") == 0)
        return write(fd, chunk, sizeof(chunk) - 1) < 0 ? -1 : 0;
    for (int e = 0; e < count; e++) {
        if (strcmp(shape, "sendmsg") == 0) {
            iov[n++] = (struct iovec){(void *)size_line, sizeof(size_line) - 1};
        } else {
            iov[n++] = (struct iovec){(void *)EVENT_SIZE, 2};
            iov[n++] = (struct iovec){(void *)"\r\n", 2};
        }
        iov[n++] = (struct iovec){(void *)EVENT, sizeof(EVENT) - 1};
        iov[n++] = (struct iovec){(void *)"\r\n", 2};
    }
    return write_all_iov(fd, iov, n, strcmp(shape, "sendmsg") == 0);
}

static void serve(int fd)
{
    static const char unary[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                "Content-Length: 11\r\n\r\n{\"ok\":true}";
    static const char stream_head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                      "Transfer-Encoding: chunked\r\n\r\n";
    static const char last[] = "0\r\n\r\n";
    char buf[1024];
    while (read_request(fd, buf, sizeof(buf))) {
        if (strncmp(buf, "GET /stream?n=", 14) == 0) {
            int k = atoi(buf + 14);
            char shape[16] = "write";
            const char *at = strstr(buf, "&shape=");
            if (at)
                sscanf(at + 7, "%15[a-z0-9]", shape);
            int per_write = strcmp(shape, "writev16") == 0 ? 4 : 1;
            if (write(fd, stream_head, sizeof(stream_head) - 1) < 0)
                return;
            for (int i = 0; i < k; i += per_write)
                if (write_events(fd, shape, per_write) < 0)
                    return;
            if (strcmp(shape, "write") == 0 ? write(fd, last, sizeof(last) - 1) < 0
                                            : write_all_iov(fd, &(struct iovec){(void *)last, 5}, 1,
                                                            strcmp(shape, "sendmsg") == 0) < 0)
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
    char line[128], req[160], shape[16];
    while (fgets(line, sizeof(line), stdin)) {
        long n = 0, k = 0;
        int stream = strncmp(line, "stream", 6) == 0;
        if (stream ? sscanf(line, "stream %ld %ld %15s", &n, &k, shape) != 3
                   : sscanf(line, "unary %ld", &n) != 1)
            continue;
        int len = stream ? snprintf(req, sizeof(req),
                                    "GET /stream?n=%ld&shape=%s HTTP/1.1\r\nHost: b\r\n\r\n", k, shape)
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

/* Syscalls of an untraced process: one-byte read()s from /dev/zero and
 * write()s to /dev/null, n of each. Prints the elapsed ns. */
static void spin(long n)
{
    int in = open("/dev/zero", O_RDONLY), out = open("/dev/null", O_WRONLY);
    char c;
    if (in < 0 || out < 0)
        die("/dev/zero, /dev/null");
    long long t0 = now_ns();
    for (long i = 0; i < n; i++)
        if (read(in, &c, 1) != 1 || write(out, &c, 1) != 1)
            die("spin");
    printf("%lld\n", now_ns() - t0);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "server") == 0)
        server();
    else if (argc == 3 && strcmp(argv[1], "spin") == 0)
        spin(atol(argv[2]));
    else if (argc == 3 && strcmp(argv[1], "client") == 0)
        client(atoi(argv[2]));
    else {
        fprintf(stderr, "usage: http_pingpong server | client PORT | spin N\n");
        return 2;
    }
    return 0;
}

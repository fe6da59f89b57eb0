/* A streaming server that ends its chunked body in pieces, as cpp-httplib
 * (llama.cpp's llama-server) does: each SSE event as one chunk in one write,
 * then "0\r\n", then "\r\n" in writes of their own, then shutdown(SHUT_WR)
 * and close(). POST /trailers ends instead with the last data chunk and
 * "0\r\n" in one write, then a trailer and the blank line in another.
 *
 * Body: JSON with "tokens" and "interval_ms" (read with strstr: the test
 * sends them). The events are llama.cpp's OpenAI-compatible chunks; the last
 * one carries "timings" with "predicted_n" and "usage".
 *
 * Usage: chunked_pieces LOG; prints the port. One JSON line per response to
 * LOG: the client's port, the path, CLOCK_MONOTONIC ns before each token write.
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

#define MAX_TOKENS 256

static long long monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

/* One chunk, size line and CRLF included, in one write (cpp-httplib's way). */
static void write_chunk(int fd, const char *data, const char *suffix)
{
    char buf[4096];
    int n = snprintf(buf, sizeof(buf), "%zx\r\n%s\r\n%s", strlen(data), data, suffix);
    write_all(fd, buf, (size_t)n);
}

static double number_after(const char *body, const char *key, double fallback)
{
    const char *at = strstr(body, key);
    if (!at)
        return fallback;
    at = strchr(at + strlen(key), ':');
    return at ? atof(at + 1) : fallback;
}

static void serve(int fd, FILE *log)
{
    /* The client's port, asked now: once the client has closed after our
     * shutdown(), the socket is closed too and getpeername() fails, which left
     * the last connection's port in the log (a CI failure blamed the tracer). */
    struct sockaddr_in peer = {0};
    socklen_t len = sizeof(peer);
    int peer_port = getpeername(fd, (struct sockaddr *)&peer, &len) == 0 ? ntohs(peer.sin_port) : -1;
    char req[65536];
    size_t got = 0;
    char *body = NULL;
    while (got < sizeof(req) - 1) {
        ssize_t n = read(fd, req + got, sizeof(req) - 1 - got);
        if (n <= 0)
            return;
        got += (size_t)n;
        req[got] = 0;
        char *end = strstr(req, "\r\n\r\n");
        if (end) {
            long length = (long)number_after(req, "Content-Length", 0);
            body = end + 4;
            if ((long)(req + got - body) >= length)
                break;
        }
    }
    if (!body)
        return;
    int trailers = strncmp(req, "POST /trailers ", 15) == 0;
    int tokens = (int)number_after(body, "\"tokens\"", 4);
    double interval_ms = number_after(body, "\"interval_ms\"", 2);
    if (tokens > MAX_TOKENS)
        tokens = MAX_TOKENS;

    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Transfer-Encoding: chunked\r\nServer: llama.cpp\r\n\r\n";
    write_all(fd, head, strlen(head));
    long long token_ns[MAX_TOKENS];
    char event[1024];
    for (int i = 0; i < tokens; i++) {
        struct timespec pause = {0, (long)(interval_ms * 1e6)};
        nanosleep(&pause, NULL);
        snprintf(event, sizeof(event),
                 "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"tok%d\"}}],"
                 "\"object\":\"chat.completion.chunk\"}\n\n", i);
        token_ns[i] = monotonic_ns();
        write_chunk(fd, event, "");
    }
    snprintf(event, sizeof(event),
             "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],"
             "\"usage\":{\"completion_tokens\":%d,\"prompt_tokens\":5,\"total_tokens\":%d},"
             "\"timings\":{\"prompt_n\":5,\"prompt_ms\":1.25,\"predicted_n\":%d,\"predicted_ms\":9.5}}\n\n",
             tokens, tokens + 5, tokens);
    if (trailers) {
        write_chunk(fd, event, "0\r\n");
        const char *rest = "X-Server-Timing: 1\r\n\r\n";
        write_all(fd, rest, strlen(rest));
    } else {
        write_chunk(fd, event, "");
        write_all(fd, "0\r\n", 3);
        write_all(fd, "\r\n", 2);
    }
    shutdown(fd, SHUT_WR);

    fprintf(log, "{\"peer_port\": %d, \"path\": \"%s\", \"token_ns\": [", peer_port,
            trailers ? "/trailers" : "/pieces");
    for (int i = 0; i < tokens; i++)
        fprintf(log, "%s%lld", i ? ", " : "", token_ns[i]);
    fprintf(log, "]}\n");
    fflush(log);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: chunked_pieces LOG\n");
        return 2;
    }
    FILE *log = fopen(argv[1], "a");
    int srv = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    if (!log || bind(srv, (struct sockaddr *)&addr, len) || listen(srv, 64) ||
        getsockname(srv, (struct sockaddr *)&addr, &len)) {
        perror("chunked_pieces");
        return 1;
    }
    printf("%d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (;;) {
        int fd = accept(srv, NULL, NULL);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        serve(fd, log);
        close(fd);
    }
}

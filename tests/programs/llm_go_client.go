// llm_go_client: streamed OpenAI-style calls with Go's net/http client, timed by the caller.
//
// Usage: llm_go_client BASE_URL CALLS TOKENS. The server is
// tests/servers/stream_shapes_fastapi.py (plain or HTTPS with a self-signed
// certificate, which this client does not check). Prints "ready" and waits
// for a line on stdin (a tracer attaches meanwhile; a warm-up call on a
// client of its own comes first), then makes CALLS calls
// on one http.Client (its pool reuses the connection), and prints one JSON
// line per call: when it began and returned and the CLOCK_MONOTONIC ns at
// which each token event's line reached the application. The prompt carries
// a marker and the Authorization header a secret that must reach no output
// of the tracer.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// CLOCK_MONOTONIC, the tracer's clock (Go's own monotonic reading is not exposed).
func monotonicNs() int64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Sec*1e9 + ts.Nsec
}

// One streamed call; what the application saw of it.
func call(client *http.Client, base string, k, tokens int) map[string]any {
	model := fmt.Sprintf("go-test-%d", k%2)
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "tokens": tokens, "interval_ms": 3,
		"messages": []map[string]string{{"role": "user", "content": "PRIVATE-MARKER-5e1d say something"}},
		"prompt":   "PRIVATE-MARKER-5e1d",
	})
	began := monotonicNs()
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-SECRET-b7c2e9")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	received := []int64{}
	scanner := bufio.NewScanner(resp.Body)
	for scanner.Scan() {
		line := scanner.Text()
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, "\"content\"") {
			received = append(received, monotonicNs())
		}
	}
	resp.Body.Close()
	return map[string]any{"model": model, "path": "/v1/chat/completions", "received_ns": received,
		"began_ns": began, "returned_ns": monotonicNs()}
}

func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the test's own certificate
	}}
}

func main() {
	base := os.Args[1]
	calls, _ := strconv.Atoi(os.Args[2])
	tokens, _ := strconv.Atoi(os.Args[3])
	// A warm-up call on a client of its own, as tests/programs/llm_sdk_client.py makes.
	call(newClient(), base, -1, 1)
	client := newClient()
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	for k := 0; k < calls; k++ {
		out, _ := json.Marshal(call(client, base, k, tokens))
		fmt.Println(string(out))
	}
}

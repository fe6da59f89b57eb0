// The LLM stream shapes on Go's net/http (Ollama's HTTP stack): the same
// endpoints, payloads and log as stream_shapes.js. Each event is written and
// flushed on its own, as Ollama and most Go gateways do.
//
// Usage: stream_shapes PAYLOADS.json LOG; prints the port.
//
// TLS mode: with STREAM_SHAPES_TLS_CERT and STREAM_SHAPES_TLS_KEY set (PEM
// files), the same endpoints are served over HTTPS, HTTP/1.1 only (see
// serveTLS). Without them, plain HTTP, as before.
package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

type shape struct {
	ContentType  string   `json:"content_type"`
	PromptTokens int      `json:"prompt_tokens"`
	Before       []string `json:"before"`
	Token        string   `json:"token"`
	After        []string `json:"after"`
}

type request struct {
	Model      string  `json:"model"`
	Prompt     string  `json:"prompt"`
	Tokens     int     `json:"tokens"`
	IntervalMs float64 `json:"interval_ms"`
}

var placeholder = regexp.MustCompile(`\{(\w+)\}`)

func fill(template string, vars map[string]string) string {
	return placeholder.ReplaceAllStringFunc(template, func(m string) string {
		return vars[m[1:len(m)-1]]
	})
}

// CLOCK_MONOTONIC, the clock the tracer stamps events with. Go's own
// monotonic reading is not exposed, so ask the kernel (a syscall: a few
// hundred ns, before each write).
func monotonicNs() int64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Sec*1e9 + ts.Nsec
}

func main() {
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		panic(err)
	}
	shapes := map[string]shape{}
	if err := json.Unmarshal(raw, &shapes); err != nil {
		panic(err)
	}
	logFile, err := os.OpenFile(os.Args[2], os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	var logMu sync.Mutex

	handler := func(w http.ResponseWriter, r *http.Request) {
		sh, ok := shapes[r.URL.Path]
		var body request
		if !ok || r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&body) != nil {
			http.NotFound(w, r)
			return
		}
		vars := map[string]string{"model": body.Model, "tokens": strconv.Itoa(body.Tokens),
			"prompt_tokens": strconv.Itoa(sh.PromptTokens)}
		w.Header().Set("Content-Type", sh.ContentType)
		flusher := w.(http.Flusher)
		send := func(s string) {
			w.Write([]byte(s))
			flusher.Flush()
		}
		for _, ev := range sh.Before {
			send(fill(ev, vars))
		}
		tokenNs, writtenNs := []int64{}, []int64{}
		prefix := body.Prompt
		if len(prefix) > 24 {
			prefix = prefix[:24]
		}
		for i := 0; i < body.Tokens; i++ {
			time.Sleep(time.Duration(body.IntervalMs * float64(time.Millisecond)))
			vars["text"] = fmt.Sprintf("%s %d", prefix, i)
			tokenNs = append(tokenNs, monotonicNs())
			send(fill(sh.Token, vars))
			writtenNs = append(writtenNs, monotonicNs()) // Flush has written it: the write's other bound
		}
		for _, ev := range sh.After {
			send(fill(ev, vars))
		}
		_, port, _ := net.SplitHostPort(r.RemoteAddr)
		peer, _ := strconv.Atoi(port)
		line, _ := json.Marshal(map[string]any{"peer_port": peer, "path": r.URL.Path, "token_ns": tokenNs,
			"token_written_ns": writtenNs})
		logMu.Lock()
		logFile.Write(append(line, '\n'))
		logMu.Unlock()
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	cert, key := os.Getenv("STREAM_SHAPES_TLS_CERT"), os.Getenv("STREAM_SHAPES_TLS_KEY")
	if cert != "" && key != "" {
		serveTLS(ln, http.HandlerFunc(handler), cert, key)
		return
	}
	http.Serve(ln, http.HandlerFunc(handler))
}

// serveTLS serves over crypto/tls, HTTP/1.1 only. Over TLS net/http offers
// HTTP/2 by ALPN and a client that speaks it (curl, Go's own client, httpx
// with h2) would take it; the tests of this server read HTTP/1.1 framing.
// A non-nil, empty TLSNextProto is net/http's documented switch that turns
// HTTP/2 off.
func serveTLS(ln net.Listener, handler http.Handler, cert, key string) {
	server := &http.Server{
		Handler:      handler,
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	if err := server.ServeTLS(ln, cert, key); err != nil {
		panic(err)
	}
}

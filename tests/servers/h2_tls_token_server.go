// SSE token streams over HTTP/2 on TLS (ALPN h2) from Go's net/http, which
// speaks h2 to any TLS client that offers it. POST /v1/chat/completions with
// {"tokens": N, "gap_ms": G}: one "data:" event per token, flushed on its
// own, then "data: [DONE]". Prints "LISTENING <port>".
//
// Usage: h2_tls_token_server CERT.pem KEY.pem
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	handler := func(w http.ResponseWriter, r *http.Request) {
		var ask struct {
			Tokens int `json:"tokens"`
			GapMs  int `json:"gap_ms"`
		}
		json.NewDecoder(r.Body).Decode(&ask)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		flusher := w.(http.Flusher)
		time.Sleep(20 * time.Millisecond)
		for i := 0; i < ask.Tokens; i++ {
			if i > 0 {
				time.Sleep(time.Duration(ask.GapMs) * time.Millisecond)
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"token%d\"}}]}\n\n", i)
			flusher.Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Printf("LISTENING %d\n", ln.Addr().(*net.TCPAddr).Port)
	server := &http.Server{Handler: http.HandlerFunc(handler)}
	if err := server.ServeTLS(ln, os.Args[1], os.Args[2]); err != nil {
		panic(err)
	}
}

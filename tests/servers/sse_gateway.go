// A gateway in front of an LLM server, as Go gateways are built: net/http's
// ReverseProxy, which passes a streamed response through as it comes
// (FlushInterval -1: flush after every write), over pooled keep-alive
// connections to its backend.
//
// Usage: sse_gateway BACKEND_PORT; prints its own port.
package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	backend, err := url.Parse("http://127.0.0.1:" + os.Args[1])
	if err != nil {
		panic(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(backend)
	proxy.FlushInterval = -1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	http.Serve(ln, proxy)
}

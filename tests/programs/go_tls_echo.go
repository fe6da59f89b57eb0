// A Go crypto/tls echo server that states, for each connection, the address
// of its *tls.Conn and the socket fd underneath: the ground truth the Go TLS
// tests (tests/integration/collector/binaries/test_go_binary_real.py) check the
// tracer's struct offsets and return-instruction probes against.
//
// The certificate is made in the process (a throwaway ECDSA key), so the
// test needs no files. Prints "LISTENING <port>", then per connection, after
// its handshake, "CONN <pointer> FD <fd>"; then echoes each record it reads
// (one tls.Conn.Read, one tls.Conn.Write) until the peer closes.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

func selfSigned() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	template := x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, &template, &template, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func socketFd(c *tls.Conn) int {
	raw, err := c.NetConn().(*net.TCPConn).SyscallConn()
	if err != nil {
		panic(err)
	}
	fd := -1
	raw.Control(func(f uintptr) { fd = int(f) })
	return fd
}

func serve(c *tls.Conn) {
	defer c.Close()
	if err := c.Handshake(); err != nil {
		return
	}
	fmt.Printf("CONN %p FD %d\n", c, socketFd(c))
	buf := make([]byte, 16384)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

func main() {
	config := &tls.Config{Certificates: []tls.Certificate{selfSigned()}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", config)
	if err != nil {
		panic(err)
	}
	fmt.Printf("LISTENING %d\n", ln.Addr().(*net.TCPAddr).Port)
	os.Stdout.Sync()
	for {
		c, err := ln.Accept()
		if err != nil {
			panic(err)
		}
		go serve(c.(*tls.Conn))
	}
}

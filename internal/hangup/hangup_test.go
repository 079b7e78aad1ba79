package hangup

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"
)

// A peer that hangs up cancels the command's context; a peer that only
// pipelines more bytes does not, and the bytes are still there to read.
func TestWatchCancelsOnHangUpOnly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	ctx, stop := Watch(context.Background(), server)
	client.Write([]byte("NOOP\r\n"))
	time.Sleep(3 * pollEvery)
	if ctx.Err() != nil {
		t.Fatal("pipelined bytes cancelled the command")
	}
	stop()
	if line, err := bufio.NewReader(server).ReadString('\n'); err != nil || line != "NOOP\r\n" {
		t.Fatalf("pipelined bytes lost: %q %v", line, err)
	}

	ctx, stop = Watch(context.Background(), server)
	defer stop()
	client.Close()
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("hang-up not noticed")
	}
}

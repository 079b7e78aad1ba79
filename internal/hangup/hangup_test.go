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
	case <-time.After(halfCloseGrace + 2*time.Second):
		t.Fatal("hang-up not noticed")
	}
}

// A peer that pipelines its last command and shuts down its sending side
// still waits for the reply: the command is not cancelled within
// halfCloseGrace, though it would be after it; a reset is at once.
func TestWatchHalfCloseWaitsForTheGrace(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pair := func() (client, server net.Conn) {
		client, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server, err = l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close(); server.Close() })
		return client, server
	}
	client, server := pair()
	client.Write([]byte("QUIT\r\n"))
	client.(*net.TCPConn).CloseWrite()
	r := bufio.NewReader(server)
	if line, err := r.ReadString('\n'); err != nil || line != "QUIT\r\n" {
		t.Fatalf("pipelined bytes lost: %q %v", line, err)
	}
	t0 := time.Now()
	ctx, stop := Watch(context.Background(), server)
	defer stop()
	time.Sleep(halfCloseGrace / 2)
	if ctx.Err() != nil {
		t.Fatal("a half-closed connection cancelled a command within the grace; its client may still read the reply")
	}
	if _, err := server.Write([]byte("221 bye\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(client).ReadString('\n'); err != nil || line != "221 bye\r\n" {
		t.Fatalf("reply not read by the half-closed client: %q %v", line, err)
	}
	<-ctx.Done()
	if d := time.Since(t0); d < halfCloseGrace {
		t.Fatalf("cancelled after %v, within the grace", d)
	}

	client, server = pair()
	ctx, stop = Watch(context.Background(), server)
	defer stop()
	client.(*net.TCPConn).SetLinger(0) // Close sends a reset
	client.Close()
	select {
	case <-ctx.Done():
	case <-time.After(halfCloseGrace / 2):
		t.Fatal("a reset connection was not taken for gone at once")
	}
}

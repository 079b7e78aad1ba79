package smtp

import (
	"bufio"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection, the server's
// wrapped as the listener wraps it.
func tcpPair(t *testing.T) (server *replyConn, client net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := replyListener{l}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*replyConn), client
}

// heldFor is how long the client waits to see that nothing was sent: a
// reply written to loopback arrives within microseconds.
const heldFor = 100 * time.Millisecond

func TestRepliesWaitForTheSessionsNextRead(t *testing.T) {
	srv, client := tcpPair(t)
	for _, r := range []string{"250 2.0.0 Roger, accepting mail from <a@b>\r\n", "250 2.0.0 I'll make sure <c@d> gets this\r\n", "354 2.0.0 Go ahead\r\n"} {
		if _, err := srv.Write([]byte(r)); err != nil {
			t.Fatal(err)
		}
	}
	client.SetReadDeadline(time.Now().Add(heldFor))
	if n, err := client.Read(make([]byte, 512)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("replies sent before the session read: %d bytes, %v", n, err)
	}
	// The session reads (the client's message): the three replies go
	// first, in one write.
	read := make(chan error, 1)
	go func() {
		_, err := srv.Read(make([]byte, 64))
		read <- err
	}()
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(client)
	for _, want := range []string{"250 2.0.0 Roger", "250 2.0.0 I'll", "354 2.0.0 Go"} {
		line, err := br.ReadString('\n')
		if err != nil || len(line) < len(want) || line[:len(want)] != want {
			t.Fatalf("got %q, %v; want %q...", line, err, want)
		}
	}
	client.Write([]byte("Subject: x\r\n"))
	if err := <-read; err != nil {
		t.Fatal(err)
	}
}

func TestCloseSendsHeldReplies(t *testing.T) {
	srv, client := tcpPair(t)
	srv.Write([]byte("221 2.0.0 Bye\r\n"))
	// crypto/tls's Close does this after its close_notify, under STARTTLS.
	srv.SetWriteDeadline(time.Now())
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(client).ReadString('\n')
	if line != "221 2.0.0 Bye\r\n" {
		t.Fatalf("got %q, %v after Close", line, err)
	}
}

func TestManyHeldRepliesAreWrittenOut(t *testing.T) {
	srv, client := tcpPair(t)
	reply := []byte("250 2.1.5 recipient ok\r\n")
	for n := 0; n <= maxHeldReplies; n += len(reply) {
		srv.Write(reply)
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := client.Read(make([]byte, 512)); n == 0 {
		t.Fatalf("nothing sent past %d held bytes: %v", maxHeldReplies, err)
	}
}

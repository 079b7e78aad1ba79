package smtp

import "testing"

func TestReceivedCount(t *testing.T) {
	msg := []byte("Received: a\r\n\tb\r\nRECEIVED: c\r\nSubject: Received: no\r\n\r\nReceived: body\r\n")
	if n := receivedCount(msg); n != 2 {
		t.Fatalf("%d Received headers, want 2", n)
	}
	if n := receivedCount([]byte("no header end")); n != 0 {
		t.Fatalf("%d", n)
	}
}

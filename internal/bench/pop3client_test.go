package bench

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// scripted starts a client against a server that answers each command
// line with the next canned reply.
func scripted(t testing.TB, greeting string, replies map[string]string) *popClient {
	t.Helper()
	cli, srv := net.Pipe()
	t.Cleanup(func() { cli.Close(); srv.Close() })
	go func() {
		srv.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(srv, greeting)
		r := bufio.NewReader(srv)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			reply, ok := replies[strings.TrimRight(line, "\r\n")]
			if !ok {
				reply = "-ERR unknown\r\n"
			}
			if _, err := io.WriteString(srv, reply); err != nil {
				return
			}
		}
	}()
	cli.SetDeadline(time.Now().Add(5 * time.Second))
	return newPOPClient(cli)
}

func TestPOPClientSession(t *testing.T) {
	long := strings.Repeat("x", 70000) // longer than the read buffer
	c := scripted(t, "+OK ready\r\n", map[string]string{
		"USER u@d":   "+OK\r\n",
		"PASS pw":    "+OK logged in\r\n",
		"STAT":       "+OK 2 320\r\n",
		"LIST":       "+OK 2 messages\r\n1 120\r\n2 200\r\n.\r\n",
		"RETR 1":     "+OK\r\nSubject: a\r\n\r\n..dot\r\n.\r\n",
		"RETR 2":     "+OK 200 octets\r\n" + long + "\r\n.." + long + "\r\n.\r\n",
		"DELE 1":     "+OK deleted\r\n",
		"QUIT":       "+OK bye\r\n",
		"PASS wrong": "-ERR [AUTH] invalid\r\n",
	})
	if err := c.greeting(); err != nil {
		t.Fatal(err)
	}
	if err := c.login("u@d", "pw"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.stat(); err != nil || n != 2 {
		t.Fatalf("stat = %d, %v", n, err)
	}
	nums, err := c.list()
	if err != nil || len(nums) != 2 || nums[0] != 1 || nums[1] != 2 {
		t.Fatalf("list = %v, %v", nums, err)
	}
	// "Subject: a\r\n" + "\r\n" + ".dot\r\n" after unstuffing.
	if n, err := c.retr(1); err != nil || n != 12+2+6 {
		t.Fatalf("retr 1 = %d, %v", n, err)
	}
	// A stuffed dot inside a long line is data; only a line-leading dot
	// is unstuffed.
	if n, err := c.retr(2); err != nil || n != int64(2*len(long)+1+4) {
		t.Fatalf("retr 2 = %d, %v (want %d)", n, err, 2*len(long)+1+4)
	}
	if err := c.dele(1); err != nil {
		t.Fatal(err)
	}
	var pe *popError
	if err := c.dele(9); !errors.As(err, &pe) {
		t.Fatalf("dele 9: %v, want -ERR", err)
	}
	if err := c.quit(); err != nil {
		t.Fatal(err)
	}
}

func TestPOPClientErrors(t *testing.T) {
	c := scripted(t, "* hello\r\n", nil)
	if err := c.greeting(); err == nil || classify(err) != ErrOther {
		t.Fatalf("bad greeting: %v", err)
	}
	c = scripted(t, "+OK\r\n", map[string]string{"USER a@b": "+OK\r\n"})
	c.greeting()
	err := c.login("a@b", "secret")
	if classify(err) != ErrPOP {
		t.Fatalf("login: %v", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %q shows the password", err)
	}
	c = scripted(t, "+OK\r\n", map[string]string{"RETR 1": "+OK\r\nabc\r\n"})
	c.greeting()
	c.conn.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.retr(1); classify(err) != ErrTimeout {
		t.Fatalf("retr of a message without its end: %v, want a timeout", err)
	}
}

// FuzzPOPClient feeds arbitrary server output to the client: it must fail
// or succeed, never panic or hang.
func FuzzPOPClient(f *testing.F) {
	f.Add("+OK\r\n+OK\r\n+OK\r\n+OK 2\r\n1 10\r\n2 20\r\n.\r\n+OK\r\n..x\r\n.\r\n")
	f.Add("+OK\r\n+OK\r\n+OK\r\n+OK\r\n-1 3\r\n.\r\n")
	f.Add("+OK\n+OK\n+OK\n+OK\n1\n.\n+OK\n.\n")
	f.Fuzz(func(t *testing.T, server string) {
		cli, srv := net.Pipe()
		defer cli.Close()
		go func() {
			defer srv.Close()
			go io.Copy(io.Discard, srv)
			io.WriteString(srv, server)
		}()
		cli.SetDeadline(time.Now().Add(time.Second))
		c := newPOPClient(cli)
		if c.greeting() != nil || c.login("u", "p") != nil {
			return
		}
		nums, err := c.list()
		if err != nil {
			return
		}
		for _, n := range nums {
			if n < 1 {
				t.Fatalf("message number %d accepted", n)
			}
			if _, err := c.retr(n); err != nil {
				return
			}
		}
	})
}

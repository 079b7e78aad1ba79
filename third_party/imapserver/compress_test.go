package imapserver

import (
	"bufio"
	"compress/flate"
	"encoding/hex"
	"io"
	"strings"
	"testing"
	"time"

	inflate "github.com/quillmail/quill/third_party/imapserver/internal/flate"
)

// TestCompressDeflate covers row 29: COMPRESS DEFLATE after login, with a
// client that ends each command with a partial flush (zlib's
// Z_PARTIAL_FLUSH, as Thunderbird does): each command is answered without
// waiting for the next. The client bytes were made by Python's zlib
// (compressobj(6, DEFLATED, -15), then flush(Z_PARTIAL_FLUSH) after each
// command).
func TestCompressDeflate(t *testing.T) {
	ts := newTestServer(t, func(o *Options) {
		o.Caps[CapCompressDeflate] = struct{}{}
		o.MaxCompressed = 2
	})
	pre, _ := ts.dial()
	if l := pre.cmd("A", "COMPRESS DEFLATE"); strings.HasPrefix(l[len(l)-1], "A OK") {
		t.Fatalf("COMPRESS before login: %q", l)
	}
	c := ts.login()
	if l := c.cmd("C", "CAPABILITY"); !strings.Contains(l[0], " COMPRESS=DEFLATE") {
		t.Fatalf("CAPABILITY: %q", l)
	}
	if l := c.cmd("B", "COMPRESS LZW"); !strings.HasPrefix(l[len(l)-1], "B BAD ") {
		t.Fatalf("COMPRESS LZW: %q", l)
	}
	c.expectCmd("Z", "COMPRESS DEFLATE", "Z OK DEFLATE active")
	c.br = bufio.NewReader(flate.NewReader(c.br))

	n1, _ := hex.DecodeString("f23354f0f3f70fe0e50208")               // "N1 NOOP\r\n"
	n2, _ := hex.DecodeString("203f230567c70047274f1fcf90485e2e8000") // "N2 CAPABILITY\r\n"
	c.write(string(n1))
	c.expect("N1 OK NOOP completed")
	c.write(string(n2))
	caps := c.readLine()
	if !strings.HasPrefix(caps, "* CAPABILITY ") || strings.Contains(caps, "COMPRESS") {
		t.Fatalf("CAPABILITY once compressed: %q", caps)
	}
	c.expect("N2 OK CAPABILITY completed")

	// A second COMPRESS is refused, through the compressed stream (a Go
	// writer, which sync-flushes).
	d := ts.login()
	d.expectCmd("Z", "COMPRESS deflate", "Z OK DEFLATE active")
	d.br = bufio.NewReader(flate.NewReader(d.br))
	fw, _ := flate.NewWriter(d.conn, flate.DefaultCompression)
	fw.Write([]byte("Z2 COMPRESS DEFLATE\r\nS SELECT INBOX\r\n"))
	fw.Flush()
	d.expect("Z2 NO [" + string(ResponseCodeCompressionActive) + "] DEFLATE is already active")
	if l := d.readUntilTagged("S"); l[len(l)-1] != "S OK [READ-WRITE] SELECT completed" {
		t.Fatalf("SELECT compressed: %q", l)
	}

	// Past MaxCompressed, COMPRESS is refused and the session goes on;
	// a slot comes back when a compressed connection ends.
	e := ts.login()
	e.expectCmd("Z", "COMPRESS DEFLATE", "Z NO [LIMIT] Too many compressed connections; go on without COMPRESS")
	e.expectCmd("N", "NOOP", "N OK NOOP completed")
	c.conn.Close()
	deadline := time.Now().Add(testTimeout)
	for {
		l := e.cmd("Z", "COMPRESS DEFLATE")
		if l[len(l)-1] == "Z OK DEFLATE active" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no slot after a compressed connection ended: %q", l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mbsyncChunks are what mbsync 1.4.4 sent after COMPRESS DEFLATE, one
// socket write each (captured through a proxy): commands 3 to 15, then
// APPEND with a 158-byte literal, each ended by a partial flush. The last
// ends a dynamic block whose following empty block is not all sent; a
// reader that looks 10 bits past the block's end (klauspost/compress) never
// returns the APPEND.
var mbsyncChunks = []string{
	"3256f073f4750d0e707476e5e50208",
	"2013051fcfe01005252505252d255e2e8000",
	"32550876f57175060a78fa39f94700450002",
	"c84c21d4d345c1cd35c4d943c1d0ca504103ccf571740fd6e4e50208",
	"207305671fff60a0310001",
	"6401d7e758949c9159960ad40910",
	"409630498000",
	"323480cbba1425a6951403250102",
	"c8d010260b10",
	"4086467059afd2bc6ca01c40",
	"00191ac3e40002",
	"c8d044c139c8d531c45541c92fbf2415a41120",
	"800c114e84090104",
	"e0720c5a1084c1307c1fec3f7cf730f2309321616145502168d055dd572de7a4396110fdf754e8d2e985878787d70f609da6db73f243f0f65938fb50b2336dc321432dd040d44d1b1b6c066b3e88764549de722894ac307ef552a9095392f5e5132bcb416361a09302293961d71577f40e0987280845b964c8045b147fc5ab975f46c71d9dd31b87a2ded79450721bce807d20544aa2b623fa0a",
}

func TestInflateReturnsEachPartialFlushedCommand(t *testing.T) {
	pr, pw := io.Pipe()
	lines := make(chan string, 32)
	go func() {
		r := bufio.NewReader(inflate.NewReader(pr))
		for {
			l, err := r.ReadString('\n')
			if l != "" {
				lines <- l
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	for i, h := range mbsyncChunks {
		b, _ := hex.DecodeString(h)
		pw.Write(b)
		// Each write ends a command (the last, the APPEND's literal too):
		// its first line must come out before the next write.
		select {
		case l := <-lines:
			if i == len(mbsyncChunks)-1 && !strings.HasPrefix(l, "16 APPEND") {
				t.Fatalf("last write: %q", l)
			}
		case <-time.After(testTimeout):
			t.Fatalf("write %d of %d: nothing came out", i+1, len(mbsyncChunks))
		}
		for len(lines) > 0 {
			<-lines
		}
	}
	pw.Close()
}

package mailauth

import (
	"bytes"
	"testing"
)

// FuzzHeaderHandling: the header readers never panic on a sender's
// message; stripping keeps the body and never adds a field naming us.
func FuzzHeaderHandling(f *testing.F) {
	f.Add([]byte("From: a@b.example\r\nAuthentication-Results: quill.test; dmarc=pass\r\n\r\nbody"))
	f.Add([]byte("From: x\r\nFrom: \"q@\" <y@z>\r\n nocolon\r\n\r\n"))
	f.Add([]byte("Authentication-Results: (c (nested)) quill.test 1;\r\n\tdkim=pass"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		fromDomains(msg)
		out := StripOwnResults(msg, "quill.test")
		if i := bytes.Index(msg, []byte("\r\n\r\n")); i >= 0 && !bytes.HasSuffix(out, msg[i+2:]) {
			t.Fatalf("body changed: %q -> %q", msg, out)
		}
		for _, f := range headerFields(out) {
			if n, v, ok := bytes.Cut([]byte(f), []byte(":")); ok && bytes.EqualFold(bytes.TrimSpace(n), []byte("Authentication-Results")) &&
				bytes.EqualFold([]byte(authservIDOf(string(v))), []byte("quill.test")) && bytes.Contains(msg, []byte("\r\n\r\n")) {
				t.Fatalf("kept a field naming us: %q", f)
			}
		}
	})
}

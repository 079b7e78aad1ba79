package mailauth

import (
	"bytes"
	"testing"
	"time"
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

// FuzzARC: a sender's ARC fields never panic the verifier, and sealing
// whatever it found yields a message whose newest set is well formed.
func FuzzARC(f *testing.F) {
	zone := map[string]string{}
	keys, err := NewKeys("fuzz.test", "f", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	for _, k := range keys {
		name, rec, _ := k.Record()
		zone[name] = rec
	}
	lookup := zoneLookup(zone)
	sealed, err := Seal([]byte(arcMsg), keys, "mx.fuzz.test; none", VerifyARC([]byte(arcMsg), lookup), time.Now())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sealed)
	f.Add([]byte("ARC-Seal: i=1; b=; cv=none\r\nARC-Message-Signature: i=1; h=from:from; bh=; b=; l=-1\r\nARC-Authentication-Results: i=1\r\n\r\n"))
	f.Add([]byte("ARC-Seal: i=99999999999999999999\r\nARC-Seal:\r\n\tb=;;=;\r\n\r\n"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		r := VerifyARC(msg, lookup)
		out, err := Seal(msg, keys, "mx.fuzz.test; none", r, time.Now())
		if err != nil {
			t.Fatalf("seal: %v", err)
		}
		if _, ok := r.SealCV(); !ok {
			return
		}
		fields, _ := splitMessage(out)
		if n, err := instanceOf(arcSeal, valueOf(fields[0])); err != nil || n != r.Sets+1 {
			t.Fatalf("new seal %q: instance %d (%v), want %d", fields[0], n, err, r.Sets+1)
		}
	})
}

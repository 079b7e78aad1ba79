package mailauth

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-msgauth/authres"
)

// arcKeys makes a domain's keys and a resolver that publishes them.
func arcKeys(t *testing.T, zone map[string]string, domain, sel string) []Key {
	t.Helper()
	keys, err := NewKeys(domain, sel, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		name, rec, err := k.Record()
		if err != nil {
			t.Fatal(err)
		}
		zone[name] = rec
	}
	return keys
}

func zoneLookup(zone map[string]string) func(string) ([]string, error) {
	return func(name string) ([]string, error) {
		if rec, ok := zone[name]; ok {
			return []string{rec}, nil
		}
		return nil, fmt.Errorf("no TXT record at %s", name)
	}
}

const arcMsg = "Received: from mx.origin.test by mx.fwd.test\r\n" +
	"From: Ann <ann@origin.test>\r\nTo: list@fwd.test\r\nSubject: the plan\r\n" +
	"Date: Tue, 24 Nov 2026 10:00:00 +0000\r\nMessage-ID: <1@origin.test>\r\n\r\n" +
	"First line  with  spaces \r\n\r\nlast line\r\n\r\n"

// seal adds one ARC set as a hop at domain would, after verifying the
// chain it found.
func seal(t *testing.T, msg []byte, keys []Key, lookup func(string) ([]string, error), authserv string) ([]byte, ARCResult) {
	t.Helper()
	chain := VerifyARC(msg, lookup)
	out, err := Seal(msg, keys, authserv+"; spf=pass smtp.mailfrom=ann@origin.test", chain, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return out, chain
}

func TestARCSealThenVerify(t *testing.T) {
	zone := map[string]string{}
	fwd := arcKeys(t, zone, "fwd.test", "a")
	recv := arcKeys(t, zone, "recv.test", "b")
	lookup := zoneLookup(zone)

	if r := VerifyARC([]byte(arcMsg), lookup); r.Value != authres.ResultNone || r.Sets != 0 {
		t.Fatalf("a message with no ARC fields: %+v, want none", r)
	}
	one, _ := seal(t, []byte(arcMsg), fwd, lookup, "mx.fwd.test")
	if !bytes.HasSuffix(one, []byte(arcMsg)) || !bytes.HasPrefix(one, []byte("ARC-Seal: i=1; a=rsa-sha256; ")) {
		t.Fatalf("sealed message does not start with the new seal and end with the message:\n%s", one)
	}
	if !bytes.Contains(one, []byte("cv=none")) || !bytes.Contains(one, []byte("ARC-Authentication-Results: i=1; mx.fwd.test; spf=pass")) {
		t.Fatalf("first set lacks cv=none or its results:\n%s", one)
	}
	r := VerifyARC(one, lookup)
	if r.Value != authres.ResultPass || r.Sets != 1 || r.OldestPass != 0 || r.Sealer != "fwd.test" {
		t.Fatalf("one set: %+v, want pass with 1 set sealed by fwd.test", r)
	}

	// A second hop that changes the subject (as a list would) seals a
	// chain that passed: the chain passes, and the oldest signature that
	// still holds is the second.
	changed := bytes.Replace(one, []byte("Subject: the plan"), []byte("Subject: [list] the plan"), 1)
	two, chain := seal(t, changed, recv, lookup, "mx.recv.test")
	if chain.Value != authres.ResultFail {
		t.Fatalf("the changed message's chain: %+v, want fail (its only message signature is broken)", chain)
	}
	// Sealed again unchanged: two good sets.
	two, chain = seal(t, one, recv, lookup, "mx.recv.test")
	if chain.Value != authres.ResultPass {
		t.Fatalf("chain before the second seal: %+v", chain)
	}
	if !bytes.Contains(two, []byte("ARC-Seal: i=2; a=rsa-sha256; t=")) || !bytes.Contains(two, []byte("cv=pass")) {
		t.Fatalf("second set:\n%s", two[:600])
	}
	if r := VerifyARC(two, lookup); r.Value != authres.ResultPass || r.Sets != 2 || r.OldestPass != 0 {
		t.Fatalf("two sets: %+v, want pass", r)
	}
	// The first hop's signature breaks when the body changes between
	// hops; the newest still holds, so the chain passes and says where.
	body := bytes.Replace(one, []byte("last line"), []byte("last line, with a footer"), 1)
	three, chain := seal(t, body, recv, lookup, "mx.recv.test")
	if chain.Value != authres.ResultFail || !strings.Contains(chain.Reason, "body hash") {
		t.Fatalf("a body changed after the first seal: %+v", chain)
	}
	if r := VerifyARC(three, lookup); r.Value != authres.ResultFail || !r.LatestFailed {
		t.Fatalf("a seal over a broken chain: %+v, want fail with cv=fail newest", r)
	}
	if cv, ok := VerifyARC(three, lookup).SealCV(); ok {
		t.Fatalf("a chain whose newest seal says cv=fail is sealed again (cv=%s)", cv)
	}
	if again, err := Seal(three, recv, "x; none", VerifyARC(three, lookup), time.Now()); err != nil || !bytes.Equal(again, three) {
		t.Fatalf("sealing a cv=fail chain changed the message (err %v)", err)
	}
}

func TestARCVerifyFindsTampering(t *testing.T) {
	zone := map[string]string{}
	fwd := arcKeys(t, zone, "fwd.test", "a")
	lookup := zoneLookup(zone)
	one, _ := seal(t, []byte(arcMsg), fwd, lookup, "mx.fwd.test")
	for _, c := range []struct{ name, old, new, reason string }{
		{"results rewritten", "spf=pass", "spf=fail", "ARC-Seal i=1: the signature does not verify"},
		{"body changed", "last line", "other line", "body hash"},
		{"signed header changed", "Subject: the plan", "Subject: a plan", "ARC-Message-Signature i=1: the signature does not verify"},
		{"seal says pass at i=1", "cv=none", "cv=pass", "must say cv=none"},
		{"instance renumbered", "i=1;", "i=2;", "no ARC set with i=1"},
		{"set incomplete", "ARC-Authentication-Results: i=1", "X-Old-Results: i=1", "lacks a field"},
		{"bad instance", "ARC-Seal: i=1", "ARC-Seal: i=x", "not a number"},
		{"beyond 50", "ARC-Seal: i=1", "ARC-Seal: i=51", "past the limit"},
	} {
		n := 1
		if c.name == "instance renumbered" {
			n = -1 // the whole set
		}
		bad := bytes.Replace(one, []byte(c.old), []byte(c.new), n)
		if bytes.Equal(bad, one) {
			t.Fatalf("%s: nothing replaced", c.name)
		}
		r := VerifyARC(bad, lookup)
		if r.Value != authres.ResultFail || !strings.Contains(r.Reason, c.reason) {
			t.Errorf("%s: %+v, want fail because %q", c.name, r, c.reason)
		}
	}
	// A duplicate set.
	dup := append([]byte(nil), one[:bytes.Index(one, []byte("ARC-Message-Signature"))]...)
	if r := VerifyARC(append(dup, one...), lookup); r.Value != authres.ResultFail || !strings.Contains(r.Reason, "two arc-seal") {
		t.Errorf("two seals with i=1: %+v", r)
	}
	// No key published, and a revoked one.
	if r := VerifyARC(one, zoneLookup(map[string]string{})); r.Value != authres.ResultFail || !strings.Contains(r.Reason, "key record") {
		t.Errorf("unpublished key: %+v", r)
	}
	revoked := map[string]string{}
	for k := range zone {
		revoked[k] = "v=DKIM1; k=rsa; p="
	}
	if r := VerifyARC(one, zoneLookup(revoked)); r.Value != authres.ResultFail || !strings.Contains(r.Reason, "revoked") {
		t.Errorf("revoked key: %+v", r)
	}
}

// A message whose chain is broken in form gets a set numbered after the
// highest instance present, sealed with cv=fail over itself alone.
func TestARCSealAfterABrokenChain(t *testing.T) {
	zone := map[string]string{}
	fwd := arcKeys(t, zone, "fwd.test", "a")
	lookup := zoneLookup(zone)
	one, _ := seal(t, []byte(arcMsg), fwd, lookup, "mx.fwd.test")
	broken := bytes.Replace(one, []byte("ARC-Authentication-Results: i=1"), []byte("ARC-Authentication-Results: i=3"), 1)
	out, chain := seal(t, broken, fwd, lookup, "mx.recv.test")
	if chain.Sets != 3 {
		t.Fatalf("broken chain: %+v, want Sets 3 (the highest instance)", chain)
	}
	if !bytes.HasPrefix(out, []byte("ARC-Seal: i=4; a=rsa-sha256; t=")) || !bytes.Contains(out[:200], []byte("cv=fail")) {
		t.Fatalf("seal after a broken chain:\n%s", out[:300])
	}
	// The cv=fail seal signs its own set alone (RFC 8617 §5.1.2).
	fields, _ := splitMessage(out)
	var own []string // seal, signature, results: the three fields on top
	for _, f := range fields[:3] {
		own = append(own, f)
	}
	tags, err := parseTags(valueOf(own[0]))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	h.Write([]byte(canonicalHeader(own[2], "relaxed")))
	h.Write([]byte(canonicalHeader(own[1], "relaxed")))
	h.Write([]byte(strings.TrimSuffix(canonicalHeader(withoutB(own[0]), "relaxed"), "\r\n")))
	if err := verifySig(tags, h.Sum(nil), lookup); err != nil {
		t.Fatalf("the cv=fail seal over its own set: %v", err)
	}
}

// RFC 6376 §3.4.5's example of both canonicalizations.
func TestCanonicalizationExample(t *testing.T) {
	fields, body := splitMessage([]byte("A: X\r\nB : Y\t\r\n\tZ  \r\n\r\n C \r\nD \t E\r\n\r\n\r\n"))
	var rh, sh string
	for _, f := range fields {
		rh += canonicalHeader(f, "relaxed")
		sh += canonicalHeader(f, "simple")
	}
	if rh != "a:X\r\nb:Y Z\r\n" {
		t.Errorf("relaxed header %q", rh)
	}
	if sh != "A: X\r\nB : Y\t\r\n\tZ  \r\n" {
		t.Errorf("simple header %q", sh)
	}
	if got := string(canonicalBody(body, "relaxed", -1)); got != " C\r\nD E\r\n" {
		t.Errorf("relaxed body %q", got)
	}
	if got := string(canonicalBody(body, "simple", -1)); got != " C \r\nD \t E\r\n" {
		t.Errorf("simple body %q", got)
	}
	if got := string(canonicalBody(nil, "simple", -1)); got != "\r\n" {
		t.Errorf("simple empty body %q", got)
	}
	if got := string(canonicalBody([]byte("\r\n\r\n"), "relaxed", -1)); got != "" {
		t.Errorf("relaxed empty body %q", got)
	}
	if got := string(canonicalBody([]byte("abc"), "relaxed", 2)); got != "ab" {
		t.Errorf("l=2 body %q", got)
	}
	// Only SP and HTAB are white space here: a no-break space or an
	// ideographic space in a UTF-8 header is text (RFC 6376 §3.4.2).
	if got := canonicalHeader("Subject:  a\u00a0b \t c\u3000d\r\n", "relaxed"); got != "subject:a\u00a0b c\u3000d\r\n" {
		t.Errorf("relaxed header with Unicode spaces %q", got)
	}
	for r, want := range map[ARCResult]string{
		{Value: authres.ResultFail}:          "fail", // broken with no readable instance: still cv=fail
		{Value: authres.ResultNone}:          "none",
		{Value: authres.ResultPass, Sets: 2}: "pass",
		{}:                                   "", // no verdict: not sealed
	} {
		if cv, _ := r.SealCV(); cv != want {
			t.Errorf("SealCV(%+v) = %q, want %q", r, cv, want)
		}
	}
}

func TestWithoutB(t *testing.T) {
	for in, want := range map[string]string{
		"ARC-Seal: i=1; b=abc\r\n\tdef; d=x\r\n": "ARC-Seal: i=1; b=; d=x\r\n",
		"ARC-Seal: i=1; bh=keep; b=abc\r\n":      "ARC-Seal: i=1; bh=keep; b=\r\n",
		"ARC-Seal: i=1; b = abc ;d=x":            "ARC-Seal: i=1; b =;d=x",
	} {
		if got := withoutB(in); got != want {
			t.Errorf("withoutB(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckReportsARC(t *testing.T) {
	zone := map[string]string{}
	fwd := arcKeys(t, zone, "fwd.test", "a")
	one, _ := seal(t, []byte(arcMsg), fwd, zoneLookup(zone), "mx.fwd.test")
	r := VerifyARC(one, zoneLookup(zone))
	got := authres.Format("quill.test", []authres.Result{arcResult(r, "192.0.2.1")})
	if got != "quill.test; arc=pass smtp.remote-ip=192.0.2.1" {
		t.Errorf("header: %q", got)
	}
	r = VerifyARC(bytes.Replace(one, []byte("the plan"), []byte("a plan"), 1), zoneLookup(zone))
	got = authres.Format("quill.test", []authres.Result{arcResult(r, "192.0.2.1")})
	if !strings.HasPrefix(got, `quill.test; arc=fail reason="ARC-Message-Signature i=1: the signature does not verify" smtp.remote-ip=192.0.2.1`) {
		t.Errorf("header: %q", got)
	}
}

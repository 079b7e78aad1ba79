package mailauth

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/dnstest"
)

// zone serves TXT records (the checks run on real DNS messages).
func zoneResolver(t *testing.T, txt map[string]string) *net.Resolver {
	_, r := dnstest.Serve(t, dnstest.Zone{TXT: txt})
	return r
}

const body = "From: Alice <alice@good.example>\r\nTo: bob@quill.test\r\nSubject: hi\r\nDate: Tue, 24 Nov 2026 10:00:00 +0000\r\n\r\nhello\r\n"

func TestSignedMailFromAnAllowedAddressPasses(t *testing.T) {
	keys, err := NewKeys("good.example", "s1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	zone := map[string]string{
		"good.example":        "v=spf1 ip4:127.0.0.1 -all",
		"_dmarc.good.example": "v=DMARC1; p=reject",
	}
	for i, k := range keys {
		name, rec, err := k.Record()
		want := []string{"v=DKIM1; k=rsa; p=", "v=DKIM1; k=ed25519; p="}[i]
		if err != nil || name != k.Selector+"._domainkey.good.example" || !strings.HasPrefix(rec, want) {
			t.Fatalf("record %q %q %v", name, rec, err)
		}
		zone[name] = rec
	}
	r := zoneResolver(t, zone)
	signed, err := Sign([]byte(body), keys)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(signed), "DKIM-Signature:"); n != 2 {
		t.Fatalf("%d signatures, want 2 (rsa and ed25519)", n)
	}
	c := Checker{Resolver: r, Hostname: "quill.test"}
	v := c.Check(context.Background(), net.IPv4(127, 0, 0, 1), "mx.good.example", "alice@good.example", nil, signed)
	if strings.Count(v.Header, "dkim=pass") != 2 {
		t.Errorf("both signatures should pass: %s", v.Header)
	}
	for _, want := range []string{"Authentication-Results: quill.test;", "spf=pass", "dkim=pass", "header.d=good.example", "dmarc=pass"} {
		if !strings.Contains(v.Header, want) {
			t.Errorf("header lacks %q: %s", want, v.Header)
		}
	}
	if v.Reject || v.Quarantine {
		t.Errorf("verdict %+v for a passing message", v)
	}

	// The same message changed after signing, from an address SPF does
	// not allow: DKIM and SPF fail, and p=reject refuses it.
	tampered := []byte(strings.Replace(string(signed), "hello", "send money", 1))
	v = c.Check(context.Background(), net.IPv4(192, 0, 2, 9), "evil.example", "alice@good.example", nil, tampered)
	if !v.Reject || v.Domain != "good.example" || !strings.Contains(v.Header, "dkim=fail") ||
		!strings.Contains(v.Header, "spf=fail") || !strings.Contains(v.Header, "dmarc=fail") {
		t.Errorf("tampered message: %+v", v)
	}
}

func TestSPFPassMustAlignWithFrom(t *testing.T) {
	r := zoneResolver(t, map[string]string{
		"bulk.example":          "v=spf1 ip4:127.0.0.1 -all",
		"_dmarc.good.example":   "v=DMARC1; p=quarantine; adkim=r; aspf=r",
		"news.good.example":     "v=spf1 ip4:127.0.0.1 -all",
		"_dmarc.strict.example": "v=DMARC1; p=reject; aspf=s",
		"mail.strict.example":   "v=spf1 ip4:127.0.0.1 -all",
	})
	c := Checker{Resolver: r, Hostname: "quill.test"}
	ip := net.IPv4(127, 0, 0, 1)
	// SPF passes for another organization's domain: not aligned.
	v := c.Check(context.Background(), ip, "h", "bounce@bulk.example", nil, []byte(body))
	if !v.Quarantine || v.Reject || !strings.Contains(v.Header, "spf=pass") || !strings.Contains(v.Header, "dmarc=fail") {
		t.Errorf("unaligned SPF pass: %+v", v)
	}
	// A subdomain of the From: domain aligns in relaxed mode.
	v = c.Check(context.Background(), ip, "h", "bounce@news.good.example", nil, []byte(body))
	if v.Quarantine || !strings.Contains(v.Header, "dmarc=pass") {
		t.Errorf("relaxed alignment: %+v", v)
	}
	// Not in strict mode.
	strict := strings.Replace(body, "alice@good.example", "alice@strict.example", 1)
	v = c.Check(context.Background(), ip, "h", "b@mail.strict.example", nil, []byte(strict))
	if !v.Reject {
		t.Errorf("strict alignment: %+v", v)
	}
}

func TestSubdomainUsesTheOrganizationsSubdomainPolicy(t *testing.T) {
	r := zoneResolver(t, map[string]string{"_dmarc.good.example": "v=DMARC1; p=none; sp=reject"})
	c := Checker{Resolver: r, Hostname: "quill.test"}
	sub := strings.Replace(body, "alice@good.example", "alice@shop.good.example", 1)
	v := c.Check(context.Background(), net.IPv4(192, 0, 2, 1), "h", "x@elsewhere.example", nil, []byte(sub))
	if !v.Reject || v.Domain != "shop.good.example" {
		t.Errorf("sp=reject of the organizational domain not applied: %+v", v)
	}
}

func TestNoPolicyNoVerdict(t *testing.T) {
	c := Checker{Resolver: zoneResolver(t, nil), Hostname: "quill.test"}
	v := c.Check(context.Background(), net.IPv4(192, 0, 2, 1), "h", "alice@good.example", nil, []byte(body))
	if v.Reject || v.Quarantine || !strings.Contains(v.Header, "dmarc=none") || !strings.Contains(v.Header, "spf=none") {
		t.Errorf("%+v", v)
	}
}

func TestStripOwnResults(t *testing.T) {
	in := "Received: x\r\nAuthentication-Results: quill.test; dkim=pass\r\n\theader.d=bank.example\r\n" +
		"Authentication-Results: other.example; spf=pass\r\nSubject: s\r\n\r\nAuthentication-Results: quill.test; in the body\r\n"
	out := string(StripOwnResults([]byte(in), "quill.test"))
	want := "Received: x\r\nAuthentication-Results: other.example; spf=pass\r\nSubject: s\r\n\r\nAuthentication-Results: quill.test; in the body\r\n"
	if out != want {
		t.Errorf("got\n%q\nwant\n%q", out, want)
	}
}

// A second From:, or a header net/mail cannot read, does not take a
// message past a reject policy (review of issue 12).
func TestNoWayAroundThePolicy(t *testing.T) {
	c := Checker{Resolver: zoneResolver(t, map[string]string{"_dmarc.bank.example": "v=DMARC1; p=reject"}), Hostname: "quill.test"}
	ip := net.IPv4(192, 0, 2, 1)
	for name, msg := range map[string]string{
		"two From fields": "From: me@harmless.example\r\nFrom: boss@bank.example\r\nSubject: x\r\n\r\nx\r\n",
		"a bad line":      "From: boss@bank.example\r\nnocolon\r\nSubject: x\r\n\r\nx\r\n",
		"unparsable From": "From: Boss <boss@bank.example\r\nSubject: x\r\n\r\nx\r\n",
	} {
		if v := c.Check(context.Background(), ip, "h", "x@elsewhere.example", nil, []byte(msg)); !v.Reject || v.Domain != "bank.example" {
			t.Errorf("%s: %+v", name, v)
		}
	}
}

// Outside pct=, a failing message gets the next policy down (RFC 7489
// §6.6.4): quarantine instead of reject.
func TestPctZeroQuarantinesInsteadOfRejecting(t *testing.T) {
	c := Checker{Resolver: zoneResolver(t, map[string]string{"_dmarc.good.example": "v=DMARC1; p=reject; pct=0"}), Hostname: "quill.test"}
	v := c.Check(context.Background(), net.IPv4(192, 0, 2, 1), "h", "x@elsewhere.example", nil, []byte(body))
	if v.Reject || !v.Quarantine {
		t.Errorf("%+v", v)
	}
}

func TestStripOwnResultsWithVersionCommentsAndNoBody(t *testing.T) {
	for _, in := range []string{
		"Authentication-Results: quill.test 1; dmarc=pass\r\nSubject: s\r\n\r\nb",
		"Authentication-Results: (forged) quill.test; dmarc=pass\r\nSubject: s\r\n\r\nb",
		"Authentication-Results:\r\n quill.test;\r\n dmarc=pass\r\nSubject: s\r\n\r\nb",
	} {
		if out := string(StripOwnResults([]byte(in), "quill.test")); out != "Subject: s\r\n\r\nb" {
			t.Errorf("%q -> %q", in, out)
		}
	}
	if out := string(StripOwnResults([]byte("Authentication-Results: quill.test; x=y\r\nSubject: s\r\n"), "quill.test")); out != "Subject: s\r\n" {
		t.Errorf("header-only message: %q", out)
	}
}

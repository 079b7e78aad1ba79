package mailauth

import (
	"strings"
	"testing"

	"github.com/emersion/go-msgauth/authres"
)

func TestPolicyApply(t *testing.T) {
	refused := Verdict{Reject: true}
	junk := Verdict{Quarantine: true}
	sealed := Verdict{Reject: true, ARC: ARCResult{Value: authres.ResultPass, Sealer: "lists.example"}}
	brokenSeal := Verdict{Reject: true, ARC: ARCResult{Value: authres.ResultFail, Sealer: "lists.example"}}
	trusting := Policy{TrustedSealers: []string{"lists.example"}}
	for _, c := range []struct {
		name              string
		p                 Policy
		v                 Verdict
		reject, junk, why bool
	}{
		{"default refuses p=reject", Policy{}, refused, true, false, false},
		{"default quarantines p=quarantine", Policy{}, junk, false, true, false},
		{"quarantine softens a refusal", Policy{DMARC: DMARCQuarantine}, refused, false, true, true},
		{"quarantine keeps quarantine", Policy{DMARC: DMARCQuarantine}, junk, false, true, false},
		{"accept lets a refusal in", Policy{DMARC: DMARCAccept}, refused, false, false, true},
		{"accept lets a quarantine in", Policy{DMARC: DMARCAccept}, junk, false, false, true},
		{"trusted sealer excuses", trusting, sealed, false, false, true},
		{"a failed chain excuses nothing", trusting, brokenSeal, true, false, false},
		{"an untrusted sealer excuses nothing", Policy{TrustedSealers: []string{"other.example"}}, sealed, true, false, false},
		{"a pass is left alone", Policy{DMARC: DMARCAccept}, Verdict{}, false, false, false},
	} {
		got, why := c.p.Apply(c.v)
		if got.Reject != c.reject || got.Quarantine != c.junk || (why != "") != c.why {
			t.Errorf("%s: reject %v junk %v why %q", c.name, got.Reject, got.Quarantine, why)
		}
	}
}

func TestStrictest(t *testing.T) {
	got := Strictest([]Policy{
		{DMARC: DMARCAccept, TrustedSealers: []string{"a.example", "b.example"}},
		{DMARC: DMARCQuarantine, TrustedSealers: []string{"b.example"}},
		{DMARC: DMARCAccept, TrustedSealers: []string{"b.example", "c.example"}},
	})
	if got.DMARC != DMARCQuarantine || len(got.TrustedSealers) != 1 || got.TrustedSealers[0] != "b.example" {
		t.Errorf("strictest: %+v", got)
	}
	if got := Strictest([]Policy{{DMARC: DMARCAccept}, {}}); got.DMARC != "" {
		t.Errorf("a domain with the default policy: %+v, want the default (reject)", got)
	}
}

func TestPolicyCheck(t *testing.T) {
	for p, want := range map[*Policy]string{
		{Domain: "a.example", DMARC: "drop"}:                                             `DMARC handling "drop"`,
		{Domain: "a.example", TrustedSealers: []string{"x@lists.example"}}:               `trusted ARC sealer "x@lists.example"`,
		{Domain: "a.example", DMARC: DMARCAccept, TrustedSealers: []string{"l.example"}}: "",
	} {
		err := p.Check()
		if (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%+v: %v, want %q", *p, err, want)
		}
	}
}

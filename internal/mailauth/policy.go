package mailauth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/emersion/go-msgauth/authres"
)

// What a receiving domain does with mail that fails its sender's DMARC
// policy (Policy.DMARC).
const (
	// DMARCReject does what the sender's domain asks: p=reject is
	// refused, p=quarantine goes to Junk. The default.
	DMARCReject = "reject"
	// DMARCQuarantine never refuses: what p=reject would refuse goes to
	// Junk as well.
	DMARCQuarantine = "quarantine"
	// DMARCAccept delivers to the inbox whatever DMARC says; the results
	// are still recorded in Authentication-Results.
	DMARCAccept = "accept"
)

// Policy is a local domain's own say over the inbound checks, the local
// policy RFC 7489 §6.7 and §7.2 leave to the receiver.
type Policy struct {
	Domain string `json:"domain"`
	// DMARC is DMARCReject (also when empty), DMARCQuarantine or
	// DMARCAccept.
	DMARC string `json:"dmarc"`
	// TrustedSealers are the ARC sealers (the d= of the newest ARC-Seal)
	// whose passing chain excuses a DMARC failure: the forwarders and
	// lists this domain's users receive through (RFC 8617 §7.2.1).
	TrustedSealers []string `json:"trusted_arc_sealers,omitempty"`
}

// Check says what is wrong with a policy, naming the field.
func (p Policy) Check() error {
	switch p.DMARC {
	case "", DMARCReject, DMARCQuarantine, DMARCAccept:
	default:
		return fmt.Errorf("domain %s: DMARC handling %q is not reject, quarantine or accept", p.Domain, p.DMARC)
	}
	for _, s := range p.TrustedSealers {
		if s == "" || strings.ContainsAny(s, "@/ ;") || !strings.Contains(s, ".") {
			return fmt.Errorf("domain %s: trusted ARC sealer %q is not a domain name", p.Domain, s)
		}
	}
	return nil
}

// rank orders the DMARC handlings from the most refusing.
func rank(dmarc string) int {
	switch dmarc {
	case DMARCAccept:
		return 2
	case DMARCQuarantine:
		return 1
	}
	return 0
}

// Strictest combines the policies of a message's recipient domains: one
// SMTP transaction gets one answer, so the most refusing handling holds,
// and a sealer excuses a failure only if every domain trusts it.
func Strictest(ps []Policy) Policy {
	if len(ps) == 0 {
		return Policy{}
	}
	out := Policy{DMARC: ps[0].DMARC, TrustedSealers: ps[0].TrustedSealers}
	for _, p := range ps[1:] {
		if rank(p.DMARC) < rank(out.DMARC) {
			out.DMARC = p.DMARC
		}
		var both []string
		for _, s := range out.TrustedSealers {
			if slices.Contains(p.TrustedSealers, s) {
				both = append(both, s)
			}
		}
		out.TrustedSealers = both
	}
	return out
}

// Apply turns the sender's DMARC verdict into this domain's decision:
// excused when a trusted sealer's ARC chain passes, else softened as
// the domain asks. why says what changed ("" when nothing did).
func (p Policy) Apply(v Verdict) (out Verdict, why string) {
	if !v.Reject && !v.Quarantine {
		return v, ""
	}
	if v.ARC.Value == authres.ResultPass && v.ARC.Sealer != "" && slices.Contains(p.TrustedSealers, v.ARC.Sealer) {
		v.Reject, v.Quarantine = false, false
		return v, "ARC chain sealed by trusted " + v.ARC.Sealer
	}
	switch p.DMARC {
	case DMARCQuarantine:
		if v.Reject {
			v.Reject, v.Quarantine = false, true
			return v, "the recipient domain quarantines what DMARC would refuse"
		}
	case DMARCAccept:
		v.Reject, v.Quarantine = false, false
		return v, "the recipient domain accepts mail that fails DMARC"
	}
	return v, ""
}

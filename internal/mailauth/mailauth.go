// Package mailauth checks where inbound mail comes from and signs what
// leaves: SPF (RFC 7208) of the connecting address for the envelope
// sender, DKIM signatures (RFC 6376), and the From: domain's DMARC policy
// (RFC 7489) over both, recorded in an Authentication-Results header (RFC
// 8601) and enforced when the domain asks for rejection; outbound, a DKIM
// signature with the sending domain's key.
//
// The checks are the libraries': blitiri.com.ar/go/spf evaluates SPF,
// github.com/emersion/go-msgauth verifies and makes DKIM signatures,
// parses DMARC records and formats the header. What is written here is
// what they leave to their caller: DMARC's alignment of the SPF and DKIM
// identities with the From: domain (relaxed: the same organizational
// domain, from golang.org/x/net/publicsuffix), the policy lookup that
// falls back to the organizational domain (§6.6.3), and removing
// Authentication-Results headers that claim to be ours (RFC 8601 §5).
// ARC chains (RFC 8617) are verified and sealed in arc.go, by hand: no
// library here has them. A spam score comes from a real rspamd over its HTTP protocol when one is
// configured (rspamd.go). Not in any paper: a mail server's duty (issue
// 12); in a node the checks run in SNS filter workers (internal/sns).
package mailauth

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/mail"
	"strings"
	"sync"
	"time"

	"blitiri.com.ar/go/spf"
	"github.com/emersion/go-msgauth/authres"
	"github.com/emersion/go-msgauth/dkim"
	"github.com/emersion/go-msgauth/dmarc"
	"golang.org/x/net/publicsuffix"
)

// checkTimeout bounds the DNS work of checking one message.
const checkTimeout = 20 * time.Second

// maxSignatures bounds the DKIM signatures verified per message (a flood
// of signatures is a flood of DNS lookups).
const maxSignatures = 5

// Checker checks inbound messages.
type Checker struct {
	// Resolver answers the TXT and address lookups (nil: the system's).
	Resolver *net.Resolver
	// Hostname is the authserv-id of the header (RFC 8601 §2.5).
	Hostname string
	// Rspamd, when set, scores the message for spam (rspamd.go); when it
	// cannot be reached the message goes on without a score.
	Rspamd *Rspamd
	// Log hears what went wrong with rspamd (nil: nothing).
	Log func(msg string, args ...any)

	once  sync.Once
	cache *txtCache
}

// Verdict is what the checks found.
type Verdict struct {
	// Header is the Authentication-Results field, CRLF-terminated.
	Header string
	// Reject: the From: domain's DMARC policy asks to refuse the message
	// (p=reject, or sp=reject for a subdomain), and it failed.
	Reject bool
	// Quarantine: the policy asks for it to be treated as suspicious.
	Quarantine bool
	// Domain is the From: domain the DMARC verdict is about.
	Domain string
	// Spam: rspamd's action is reject; Defer: it asks for a later try
	// (soft reject, greylist); Score is its score (rspamd.go).
	Spam  bool
	Defer bool
	Score float64
	// ARC is what the message's Authenticated Received Chain came to
	// (arc.go); a seal added here goes after it.
	ARC ARCResult
}

// Results is the value of the Authentication-Results field: what an ARC
// set records as this server's findings.
func (v Verdict) Results() string {
	_, val, _ := strings.Cut(strings.TrimSpace(v.Header), ":")
	return strings.TrimSpace(val)
}

func (c *Checker) resolver() *txtCache {
	c.once.Do(func() {
		r := c.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		c.cache = newTXTCache(r)
	})
	return c.cache
}

// Check runs SPF for ip and the envelope (helo, mailFrom), verifies the
// message's DKIM signatures, and applies the From: domain's DMARC policy.
func (c *Checker) Check(ctx context.Context, ip net.IP, helo, mailFrom string, rcpts []string, msg []byte) Verdict {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	lookupTXT := func(name string) ([]string, error) { return c.resolver().LookupTXT(ctx, name) }

	// SPF (RFC 7208): of the MAIL FROM domain, or of HELO for the null
	// sender (§2.4).
	spfRes, _ := spf.CheckHostWithSender(ip, helo, mailFrom, spf.WithContext(ctx), spf.WithResolver(c.resolver()))
	spfDomain := domainOf(mailFrom)
	if mailFrom == "" {
		spfDomain = strings.ToLower(helo)
	}
	results := []authres.Result{&authres.SPFResult{Value: authres.ResultValue(spfRes), From: mailFrom, Helo: helo}}

	// DKIM (RFC 6376).
	verifs, _ := dkim.VerifyWithOptions(bytes.NewReader(msg), &dkim.VerifyOptions{LookupTXT: lookupTXT, MaxVerifications: maxSignatures})
	var dkimPass []string
	if len(verifs) == 0 {
		results = append(results, &authres.DKIMResult{Value: authres.ResultNone})
	}
	for _, v := range verifs {
		r := &authres.DKIMResult{Value: authres.ResultPass, Domain: v.Domain, Identifier: v.Identifier}
		switch {
		case v.Err == nil:
			dkimPass = append(dkimPass, strings.ToLower(v.Domain))
		case dkim.IsTempFail(v.Err):
			r.Value, r.Reason = authres.ResultTempError, oneLine(v.Err.Error())
		case dkim.IsPermFail(v.Err):
			r.Value, r.Reason = authres.ResultPermError, oneLine(v.Err.Error())
		default:
			r.Value, r.Reason = authres.ResultFail, oneLine(v.Err.Error())
		}
		results = append(results, r)
	}

	// ARC (RFC 8617): reported, not yet a reason to override DMARC.
	v := Verdict{ARC: VerifyARC(msg, lookupTXT)}
	ipText := ""
	if ip != nil {
		ipText = ip.String()
	}
	results = append(results, arcResult(v.ARC, ipText))

	// DMARC (RFC 7489) of the From: domain. A message with several From:
	// fields, or one that does not parse, is judged by every domain in
	// them (§6.6.1): the strictest verdict stands, so a second From: or
	// a garbled header cannot slip past a policy.
	for _, from := range fromDomains(msg) {
		dres := &authres.DMARCResult{Value: authres.ResultNone, From: from}
		results = append(results, dres)
		if v.Domain == "" {
			v.Domain = from
		}
		rec, policy, err := lookupDMARC(from, lookupTXT)
		switch {
		case err != nil && dmarc.IsTempFail(err):
			dres.Value, dres.Reason = authres.ResultTempError, "policy lookup failed"
			continue
		case err != nil || rec == nil:
			continue // no policy: none
		}
		pass := Aligned(spfRes == spf.Pass, spfDomain, from, rec.SPFAlignment == dmarc.AlignmentStrict)
		for _, d := range dkimPass {
			pass = pass || Aligned(true, d, from, rec.DKIMAlignment == dmarc.AlignmentStrict)
		}
		if pass {
			dres.Value = authres.ResultPass
			continue
		}
		dres.Value, dres.Reason = authres.ResultFail, "p="+string(policy)
		reject, quarantine := policy == dmarc.PolicyReject, policy == dmarc.PolicyQuarantine
		if !sampled(rec.Percent) {
			// §6.6.4: outside pct=, the next policy down applies.
			reject, quarantine = false, reject
		}
		if reject && !v.Reject {
			v.Reject, v.Domain = true, from
		}
		if quarantine && !v.Reject && !v.Quarantine {
			v.Quarantine, v.Domain = true, from
		}
	}
	if len(results) == 0 || !hasDMARC(results) {
		results = append(results, &authres.DMARCResult{Value: authres.ResultNone})
	}
	v.Header = "Authentication-Results: " + authres.Format(c.Hostname, results) + "\r\n"
	if c.Rspamd != nil {
		res, err := c.Rspamd.Check(ctx, ip, helo, mailFrom, rcpts, msg)
		if err != nil {
			if c.Log != nil {
				c.Log("spam check skipped: rspamd did not answer", "err", err)
			}
		} else {
			v.applySpam(res)
		}
	}
	return v
}

// lookupDMARC finds the policy for a From: domain: its own record, else
// its organizational domain's, whose sp= then applies (RFC 7489 §6.6.3).
func lookupDMARC(domain string, lookupTXT func(string) ([]string, error)) (*dmarc.Record, dmarc.Policy, error) {
	opts := &dmarc.LookupOptions{LookupTXT: lookupTXT}
	rec, err := dmarc.LookupWithOptions(domain, opts)
	if err == nil {
		return rec, rec.Policy, nil
	}
	if dmarc.IsTempFail(err) {
		return nil, "", err
	}
	org := orgDomain(domain)
	if org == domain {
		return nil, "", err
	}
	rec, err = dmarc.LookupWithOptions(org, opts)
	if err != nil {
		return nil, "", err
	}
	if rec.SubdomainPolicy != "" {
		return rec, rec.SubdomainPolicy, nil
	}
	return rec, rec.Policy, nil
}

// Aligned reports whether an authenticated identity (it passed) aligns
// with the From: domain: the same name in strict mode, the same
// organizational domain in relaxed mode (RFC 7489 §3.1).
func Aligned(passed bool, identity, from string, strict bool) bool {
	if !passed || identity == "" || from == "" {
		return false
	}
	identity, from = strings.ToLower(strings.TrimSuffix(identity, ".")), strings.ToLower(strings.TrimSuffix(from, "."))
	if strict {
		return identity == from
	}
	return orgDomain(identity) == orgDomain(from)
}

// orgDomain is a domain's organizational domain: the public suffix plus
// one label.
func orgDomain(d string) string {
	if o, err := publicsuffix.EffectiveTLDPlusOne(d); err == nil {
		return o
	}
	return d
}

// sampled applies pct= (RFC 7489 §6.6.4): the policy applies to that
// share of failing messages.
func sampled(pct *int) bool { return pct == nil || *pct >= 100 || mrand.IntN(100) < *pct }

func domainOf(addr string) string {
	_, d, _ := strings.Cut(addr, "@")
	return strings.ToLower(d)
}

func hasDMARC(rs []authres.Result) bool {
	for _, r := range rs {
		if _, ok := r.(*authres.DMARCResult); ok {
			return true
		}
	}
	return false
}

// fromDomains returns the domains of the message's From: fields (RFC
// 7489 §6.6.1), read leniently: the header's fields are unfolded by hand
// (net/mail refuses a whole header for one bad line), each From: is
// parsed as an address list, and one that does not parse gives whatever
// looks like a domain after an @.
func fromDomains(msg []byte) []string {
	var out []string
	seen := map[string]bool{}
	add := func(d string) {
		d = strings.ToLower(strings.TrimSuffix(strings.Trim(d, " \t<>;,\""), "."))
		if d != "" && !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	for _, f := range headerFields(msg) {
		name, val, ok := strings.Cut(f, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "From") {
			continue
		}
		if addrs, err := mail.ParseAddressList(val); err == nil {
			for _, a := range addrs {
				add(domainOf(a.Address))
			}
			continue
		}
		for _, part := range strings.Split(val, "@")[1:] {
			end := strings.IndexAny(part, " \t>,;()\"")
			if end < 0 {
				end = len(part)
			}
			add(part[:end])
		}
	}
	return out
}

// headerFields returns a message's header fields, unfolded; a message
// without a blank line is all header.
func headerFields(msg []byte) []string {
	head := msg
	if i := bytes.Index(msg, []byte("\r\n\r\n")); i >= 0 {
		head = msg[:i]
	}
	var fields []string
	for _, line := range strings.Split(string(head), "\r\n") {
		if line != "" && (line[0] == ' ' || line[0] == '\t') && len(fields) > 0 {
			fields[len(fields)-1] += " " + strings.TrimSpace(line)
			continue
		}
		fields = append(fields, line)
	}
	return fields
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// StripOwnResults removes the Authentication-Results fields of a message's
// header that name authservID: only this server may say what it found
// (RFC 8601 §5). The body is left as it is.
func StripOwnResults(msg []byte, authservID string) []byte {
	end := bytes.Index(msg, []byte("\r\n\r\n"))
	if end < 0 {
		end = len(msg) // all header
	} else {
		end += 2
	}
	head := msg[:end]
	if !bytes.Contains(bytes.ToLower(head), []byte("authentication-results")) {
		return msg
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(head))
	sc.Buffer(make([]byte, 0, 4096), len(head)+1)
	sc.Split(splitCRLF)
	// Each field is gathered with its continuation lines, then kept or
	// dropped whole.
	var field []string
	flush := func() {
		if len(field) == 0 {
			return
		}
		unfolded := strings.Join(field, " ")
		name, val, _ := strings.Cut(unfolded, ":")
		drop := strings.EqualFold(strings.TrimSpace(name), "Authentication-Results") && strings.EqualFold(authservIDOf(val), authservID)
		if !drop {
			for _, l := range field {
				out.WriteString(l + "\r\n")
			}
		}
		field = nil
	}
	for sc.Scan() {
		line := sc.Text()
		if line != "" && (line[0] == ' ' || line[0] == '\t') {
			field = append(field, line)
			continue
		}
		flush()
		field = append(field, line)
	}
	flush()
	out.Write(msg[end:])
	return out.Bytes()
}

// authservIDOf returns the authserv-id an Authentication-Results value
// starts with: comments (CFWS) removed, before the optional version and
// the first ";" (RFC 8601 §2.2).
func authservIDOf(val string) string {
	var b strings.Builder
	depth := 0
	for _, r := range val {
		switch {
		case r == '(':
			depth++
		case r == ')' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	id, _, _ := strings.Cut(b.String(), ";")
	f := strings.Fields(id)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func splitCRLF(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.Index(data, []byte("\r\n")); i >= 0 {
		return i + 2, data[:i], nil
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// Key is one of a domain's DKIM signing keys.
type Key struct {
	Domain   string `json:"domain"`
	Selector string `json:"selector"`
	// Algorithm is "rsa" or "ed25519" (the k= of its record).
	Algorithm string `json:"algorithm"`
	// KeyPEM is the PKCS #8 private key.
	KeyPEM  string    `json:"key_pem,omitempty"`
	Created time.Time `json:"created"`
}

// keyBits is the RSA key size: 2048, what receivers all verify (RFC 8301
// requires at least 1024 and recommends 2048).
const keyBits = 2048

// NewKeys makes a domain's signing keys: RSA (selector base+"r"), which
// every receiver verifies, and Ed25519 (RFC 8463, base+"e"), short and
// fast, which not all do yet; mail is signed with both (RFC 8463 §1).
func NewKeys(domain, base string, now time.Time) ([]Key, error) {
	if base == "" {
		base = "quill" + now.UTC().Format("0601")
	}
	if err := validLabel(base); err != nil {
		return nil, err
	}
	rk, err := rsa.GenerateKey(rand.Reader, keyBits)
	if err != nil {
		return nil, err
	}
	_, ek, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	var out []Key
	for _, k := range []struct {
		alg, sel string
		key      any
	}{{"rsa", base + "r", rk}, {"ed25519", base + "e", ek}} {
		der, err := x509.MarshalPKCS8PrivateKey(k.key)
		if err != nil {
			return nil, err
		}
		out = append(out, Key{Domain: strings.ToLower(domain), Selector: k.sel, Algorithm: k.alg, Created: now,
			KeyPEM: string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))})
	}
	return out, nil
}

func validLabel(s string) error {
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || strings.Trim(l, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
			return fmt.Errorf("DKIM selector %q: want DNS labels of letters, digits and hyphens", s)
		}
	}
	return nil
}

func (k Key) signer() (crypto.Signer, error) {
	b, _ := pem.Decode([]byte(k.KeyPEM))
	if b == nil {
		return nil, fmt.Errorf("DKIM key of %s: no PEM block", k.Domain)
	}
	key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("DKIM key of %s: %w", k.Domain, err)
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("DKIM key of %s: not a signing key", k.Domain)
	}
	return s, nil
}

// Record returns the DNS TXT record to publish at Name for the key.
func (k Key) Record() (name, value string, err error) {
	s, err := k.signer()
	if err != nil {
		return "", "", err
	}
	name = k.Selector + "._domainkey." + k.Domain
	if pub, ok := s.Public().(ed25519.PublicKey); ok {
		// RFC 8463 §4: the raw 32-byte key.
		return name, "v=DKIM1; k=ed25519; p=" + base64.StdEncoding.EncodeToString(pub), nil
	}
	der, err := x509.MarshalPKIXPublicKey(s.Public())
	if err != nil {
		return "", "", err
	}
	return name, "v=DKIM1; k=rsa; p=" + base64.StdEncoding.EncodeToString(der), nil
}

// KeyInfo is a key as operators see it: without the private key, with
// the DNS record to publish.
type KeyInfo struct {
	Domain     string    `json:"domain"`
	Selector   string    `json:"selector"`
	Algorithm  string    `json:"algorithm"`
	Created    time.Time `json:"created"`
	RecordName string    `json:"record_name"`
	Record     string    `json:"record"`
}

// Info returns what operators see of the key.
func (k Key) Info() (KeyInfo, error) {
	name, rec, err := k.Record()
	return KeyInfo{Domain: k.Domain, Selector: k.Selector, Algorithm: k.Algorithm, Created: k.Created, RecordName: name, Record: rec}, err
}

// signedHeaders are the fields a signature covers (RFC 6376 §5.4.1's
// list of those worth signing).
var signedHeaders = []string{"From", "Reply-To", "Subject", "Date", "To", "Cc", "Message-ID", "In-Reply-To", "References",
	"MIME-Version", "Content-Type", "Content-Transfer-Encoding", "List-Id", "List-Unsubscribe"}

// Sign returns msg with a DKIM-Signature for each key prepended
// (relaxed/relaxed canonicalization, SHA-256).
func Sign(msg []byte, keys []Key) ([]byte, error) {
	var sigs []byte
	for _, k := range keys {
		s, err := k.signer()
		if err != nil {
			return nil, err
		}
		signer, err := dkim.NewSigner(&dkim.SignOptions{Domain: k.Domain, Selector: k.Selector, Signer: s, Hash: crypto.SHA256,
			HeaderCanonicalization: dkim.CanonicalizationRelaxed, BodyCanonicalization: dkim.CanonicalizationRelaxed,
			HeaderKeys: signedHeaders})
		if err != nil {
			return nil, err
		}
		if _, err := signer.Write(msg); err != nil {
			signer.Close()
			return nil, err
		}
		if err := signer.Close(); err != nil {
			return nil, fmt.Errorf("DKIM signature for %s (%s): %w", k.Domain, k.Selector, err)
		}
		sigs = append(sigs, signer.Signature()...)
	}
	return append(sigs, msg...), nil
}

// ErrNoKey: the domain has no signing key.
var ErrNoKey = errors.New("no DKIM key")

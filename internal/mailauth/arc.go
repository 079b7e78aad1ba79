package mailauth

// ARC, the Authenticated Received Chain (RFC 8617): each handler of a
// message records what it found (ARC-Authentication-Results), signs the
// message as it passes it on (ARC-Message-Signature, a DKIM signature by
// another name) and seals the chain so far (ARC-Seal), so that a later
// receiver can trust an earlier hop's SPF and DKIM results after a
// forwarder or a list broke them.
//
// Written here rather than taken from a library: go-msgauth has no ARC
// and keeps its canonicalization unexported, and the Go ARC packages
// that exist (github.com/rest-mail/go-arc, github.com/synqronlabs/raven)
// are months old and not in reach of this build's module proxy. What is
// written is the canonicalization of RFC 6376 §3.4, the tag lists of
// §3.2, the key record of §3.6.1 and the chain rules of RFC 8617 §5;
// hashing and signatures are the standard library's. The tests check it
// against dkimpy's ARC, an independent implementation, both ways.

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/emersion/go-msgauth/authres"
)

// maxARCSets is the highest instance RFC 8617 §4.2.1 allows.
const maxARCSets = 50

// minRSABits: RFC 8301 §3.2 has verifiers refuse RSA keys under 1024 bits.
const minRSABits = 1024

// The three fields of an ARC set, as lower-case names.
const (
	arcAAR  = "arc-authentication-results"
	arcAMS  = "arc-message-signature"
	arcSeal = "arc-seal"
)

// ARCResult is what a message's chain came to (RFC 8617 §5.2).
type ARCResult struct {
	// Value is none (no chain), pass or fail.
	Value authres.ResultValue
	// Sets is the number of ARC sets the message carries (for a chain
	// that is not whole, the highest instance seen: a new set goes after
	// it).
	Sets int
	// OldestPass is the lowest instance whose message signature still
	// verifies (§5.2 step 4), when the chain passes and some older one
	// does not; 0 otherwise.
	OldestPass int
	// LatestFailed: the newest seal already says cv=fail, so nobody
	// seals this message again (§5.1.2 step 1).
	LatestFailed bool
	// Reason says why a chain failed.
	Reason string
	// Sealer is the d= of the newest seal of a chain that passed: whose
	// word the chain is (Policy.TrustedSealers).
	Sealer string
}

// SealCV is the cv= a new seal over a chain with this result carries,
// and false when the message must not be sealed: its chain already
// failed at an earlier hop, or it holds every instance there can be.
func (r ARCResult) SealCV() (string, bool) {
	switch {
	case r.LatestFailed || r.Sets >= maxARCSets || r.Value == "":
		return "", false // "": no verdict (a worker from before ARC)
	case r.Value == authres.ResultPass:
		return "pass", true
	case r.Value == authres.ResultNone:
		return "none", true
	default:
		return "fail", true // a chain that is there but broken (§5.1.2)
	}
}

// VerifyARC checks the message's chain (RFC 8617 §5.2): every set whole
// and numbered 1..N, the newest message signature, and every seal with
// the cv= its place asks for.
func VerifyARC(msg []byte, lookupTXT func(string) ([]string, error)) ARCResult {
	fields, body := splitMessage(msg)
	sets, err := arcSets(fields)
	if err != nil {
		return ARCResult{Value: authres.ResultFail, Sets: highestInstance(fields), Reason: err.Error()}
	}
	n := len(sets)
	if n == 0 {
		return ARCResult{Value: authres.ResultNone}
	}
	res := ARCResult{Value: authres.ResultFail, Sets: n}
	latest, err := parseTags(valueOf(sets[n-1].seal))
	if err != nil {
		res.Reason = fmt.Sprintf("ARC-Seal i=%d: %v", n, err)
		return res
	}
	if latest["cv"] == "fail" {
		res.LatestFailed = true
		res.Reason = fmt.Sprintf("ARC-Seal i=%d says an earlier hop found the chain broken (cv=fail)", n)
		return res
	}
	if err := verifyAMS(fields, body, sets[n-1].ams, lookupTXT); err != nil {
		res.Reason = fmt.Sprintf("ARC-Message-Signature i=%d: %v", n, err)
		return res
	}
	for i := n; i >= 1; i-- {
		if err := verifySeal(sets, i, lookupTXT); err != nil {
			res.Reason = fmt.Sprintf("ARC-Seal i=%d: %v", i, err)
			return res
		}
	}
	res.Value = authres.ResultPass
	res.Sealer = strings.ToLower(latest["d"])
	// §5.2 step 4: how far back the message is as it was signed; an
	// older signature that fails only tells where it changed.
	res.OldestPass = n
	for i := n - 1; i >= 1; i-- {
		if verifyAMS(fields, body, sets[i-1].ams, lookupTXT) != nil {
			break
		}
		res.OldestPass = i
	}
	if res.OldestPass == 1 {
		res.OldestPass = 0 // every signature verifies: nothing to say
	}
	return res
}

// Seal returns msg with a new ARC set prepended (RFC 8617 §5.1): results
// is this server's Authentication-Results value (authserv-id first), chain
// the result of VerifyARC on msg. The seal is made with the domain's RSA
// key, the algorithm every ARC verifier knows. A message that must not
// be sealed (ARCResult.SealCV) is returned as it is.
func Seal(msg []byte, keys []Key, results string, chain ARCResult, now time.Time) ([]byte, error) {
	cv, ok := chain.SealCV()
	if !ok {
		return msg, nil
	}
	var key Key
	for _, k := range keys {
		if k.Algorithm == "rsa" {
			key = k
			break
		}
	}
	if key.Domain == "" {
		return nil, fmt.Errorf("ARC seal: %w of type rsa", ErrNoKey)
	}
	signer, err := key.signer()
	if err != nil {
		return nil, err
	}
	fields, body := splitMessage(msg)
	sets, _ := arcSets(fields) // a broken chain is sealed with cv=fail over this set alone
	i := chain.Sets + 1
	t := now.Unix()

	aar := fmt.Sprintf("ARC-Authentication-Results: i=%d; %s\r\n", i, oneLine(results))

	var names []string
	have := map[string]int{}
	for _, f := range fields {
		have[nameOf(f)]++
	}
	for _, h := range signedHeaders {
		for c := have[strings.ToLower(h)]; c > 0; c-- {
			names = append(names, h)
		}
	}
	bh := sha256.Sum256(canonicalBody(body, "relaxed", -1))
	amsHead := fmt.Sprintf("ARC-Message-Signature: i=%d; a=rsa-sha256; c=relaxed/relaxed; d=%s; s=%s; t=%d;\r\n\th=%s;\r\n\tbh=%s;\r\n\tb=",
		i, key.Domain, key.Selector, t, strings.Join(names, ":"), base64.StdEncoding.EncodeToString(bh[:]))
	h := sha256.New()
	for _, f := range pickHeaders(fields, names) {
		h.Write([]byte(canonicalHeader(f, "relaxed")))
	}
	h.Write([]byte(strings.TrimSuffix(canonicalHeader(amsHead, "relaxed"), "\r\n")))
	sig, err := sign(signer, h.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("ARC-Message-Signature for %s: %w", key.Domain, err)
	}
	ams := amsHead + foldBase64(sig) + "\r\n"

	sealHead := fmt.Sprintf("ARC-Seal: i=%d; a=rsa-sha256; t=%d; cv=%s;\r\n\td=%s; s=%s;\r\n\tb=", i, t, cv, key.Domain, key.Selector)
	h = sha256.New()
	if cv != "fail" {
		// §5.1.1: every set so far, oldest first; a seal over a chain it
		// found broken covers only its own set (§5.1.2).
		for _, s := range sets {
			h.Write([]byte(canonicalHeader(s.aar, "relaxed")))
			h.Write([]byte(canonicalHeader(s.ams, "relaxed")))
			h.Write([]byte(canonicalHeader(s.seal, "relaxed")))
		}
	}
	h.Write([]byte(canonicalHeader(aar, "relaxed")))
	h.Write([]byte(canonicalHeader(ams, "relaxed")))
	h.Write([]byte(strings.TrimSuffix(canonicalHeader(sealHead, "relaxed"), "\r\n")))
	sig, err = sign(signer, h.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("ARC-Seal for %s: %w", key.Domain, err)
	}
	seal := sealHead + foldBase64(sig) + "\r\n"

	out := make([]byte, 0, len(seal)+len(ams)+len(aar)+len(msg))
	out = append(append(append(append(out, seal...), ams...), aar...), msg...)
	return out, nil
}

func sign(s crypto.Signer, digest []byte) ([]byte, error) {
	if _, ok := s.Public().(ed25519.PublicKey); ok {
		return s.Sign(rand.Reader, digest, crypto.Hash(0)) // RFC 8463 §3: the hash is the message
	}
	return s.Sign(rand.Reader, digest, crypto.SHA256)
}

// foldBase64 breaks a signature into lines a receiver's line limits
// accept; the folding whitespace is not part of the value (RFC 6376
// §3.5, b=).
func foldBase64(sig []byte) string {
	s := base64.StdEncoding.EncodeToString(sig)
	var b strings.Builder
	for len(s) > 72 {
		b.WriteString(s[:72])
		b.WriteString("\r\n\t")
		s = s[72:]
	}
	b.WriteString(s)
	return b.String()
}

// arcSet is one instance's three fields, raw.
type arcSet struct{ aar, ams, seal string }

// arcSets gathers the message's ARC fields by instance (RFC 8617 §4.2,
// §5.2 steps 1–2): exactly one of each per instance, instances 1..N with
// none missing, N at most 50. On error it still returns what it found.
func arcSets(fields []string) ([]arcSet, error) {
	byI := map[int]*arcSet{}
	max := 0
	for _, f := range fields {
		name := nameOf(f)
		if name != arcAAR && name != arcAMS && name != arcSeal {
			continue
		}
		i, err := instanceOf(name, valueOf(f))
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		s := byI[i]
		if s == nil {
			s = &arcSet{}
			byI[i] = s
		}
		slot := map[string]*string{arcAAR: &s.aar, arcAMS: &s.ams, arcSeal: &s.seal}[name]
		if *slot != "" {
			return nil, fmt.Errorf("two %s fields with i=%d", name, i)
		}
		*slot = f
		if i > max {
			max = i
		}
	}
	if max > maxARCSets {
		return nil, fmt.Errorf("instance %d is past the limit of %d", max, maxARCSets)
	}
	out := make([]arcSet, 0, max)
	for i := 1; i <= max; i++ {
		s := byI[i]
		switch {
		case s == nil:
			return out, fmt.Errorf("no ARC set with i=%d", i)
		case s.aar == "" || s.ams == "" || s.seal == "":
			return out, fmt.Errorf("the ARC set with i=%d lacks a field", i)
		}
		out = append(out, *s)
	}
	return out, nil
}

// instanceOf reads the i= of an ARC field: a tag among the others in a
// signature or seal; first, before the authserv-id (which is not a tag),
// in an ARC-Authentication-Results (RFC 8617 §4.1.1).
func instanceOf(name, val string) (int, error) {
	var v string
	if name == arcAAR {
		first, _, _ := strings.Cut(val, ";")
		k, iv, ok := strings.Cut(first, "=")
		if !ok || strings.TrimSpace(k) != "i" {
			return 0, errors.New("no instance tag (i=) first")
		}
		v = strings.TrimSpace(iv)
	} else {
		tags, err := parseTags(val)
		if err != nil {
			return 0, err
		}
		var ok bool
		if v, ok = tags["i"]; !ok {
			return 0, errors.New("no instance tag (i=)")
		}
	}
	// RFC 8617 §4.2.1: 1*2DIGIT, 1 to 50; no sign, no leading zero.
	i, err := strconv.Atoi(v)
	if err != nil || i < 1 || v[0] < '1' || v[0] > '9' {
		return 0, fmt.Errorf("instance %q is not a number from 1 to %d", v, maxARCSets)
	}
	return i, nil
}

// highestInstance is the largest i= among the ARC fields that have a
// readable one: where a new set goes after a chain that is broken.
func highestInstance(fields []string) int {
	max := 0
	for _, f := range fields {
		name := nameOf(f)
		if name != arcAAR && name != arcAMS && name != arcSeal {
			continue
		}
		if i, err := instanceOf(name, valueOf(f)); err == nil && i > max {
			max = i
		}
	}
	return max
}

// verifyAMS checks one ARC-Message-Signature over the message: a DKIM
// signature (RFC 6376 §6.1) but for its name and its i= (RFC 8617 §4.1.2).
func verifyAMS(fields []string, body []byte, ams string, lookupTXT func(string) ([]string, error)) error {
	tags, err := parseTags(valueOf(ams))
	if err != nil {
		return err
	}
	for _, t := range []string{"a", "b", "bh", "d", "h", "s"} {
		if _, ok := tags[t]; !ok {
			return fmt.Errorf("no %s= tag", t)
		}
	}
	hc, bc, err := canonicalizations(tags["c"])
	if err != nil {
		return err
	}
	limit := int64(-1)
	if l, ok := tags["l"]; ok {
		if limit, err = strconv.ParseInt(l, 10, 64); err != nil || limit < 0 {
			return fmt.Errorf("body length l=%q is not a number", l)
		}
	}
	bh := sha256.Sum256(canonicalBody(body, bc, limit))
	if want, err := base64.StdEncoding.DecodeString(stripWSP(tags["bh"])); err != nil || !bytes.Equal(want, bh[:]) {
		return errors.New("the body hash does not match: the body changed after it was signed")
	}
	var names []string
	for _, n := range strings.Split(tags["h"], ":") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	if len(names) > maxSignedHeaders {
		return fmt.Errorf("h= names %d fields, more than the %d this server checks", len(names), maxSignedHeaders)
	}
	h := sha256.New()
	for _, f := range pickHeaders(fields, names) {
		h.Write([]byte(canonicalHeader(f, hc)))
	}
	h.Write([]byte(strings.TrimSuffix(canonicalHeader(withoutB(ams), hc), "\r\n")))
	return verifySig(tags, h.Sum(nil), lookupTXT)
}

// verifySeal checks the ARC-Seal of instance i (RFC 8617 §5.2 step 5):
// its cv= against its place in the chain, then its signature over the
// sets 1..i.
func verifySeal(sets []arcSet, i int, lookupTXT func(string) ([]string, error)) error {
	s := sets[i-1]
	tags, err := parseTags(valueOf(s.seal))
	if err != nil {
		return err
	}
	for _, t := range []string{"a", "b", "cv", "d", "s"} {
		if _, ok := tags[t]; !ok {
			return fmt.Errorf("no %s= tag", t)
		}
	}
	if _, ok := tags["h"]; ok {
		return errors.New("an h= tag, which a seal may not have (RFC 8617 §4.1.3)")
	}
	want := "pass"
	if i == 1 {
		want = "none"
	}
	if tags["cv"] != want {
		return fmt.Errorf("cv=%s where the chain's instance %d must say cv=%s", tags["cv"], i, want)
	}
	h := sha256.New()
	for j := 0; j < i; j++ {
		h.Write([]byte(canonicalHeader(sets[j].aar, "relaxed")))
		h.Write([]byte(canonicalHeader(sets[j].ams, "relaxed")))
		if j < i-1 {
			h.Write([]byte(canonicalHeader(sets[j].seal, "relaxed")))
		}
	}
	h.Write([]byte(strings.TrimSuffix(canonicalHeader(withoutB(s.seal), "relaxed"), "\r\n")))
	return verifySig(tags, h.Sum(nil), lookupTXT)
}

// verifySig checks b= over digest with the key the record at
// s._domainkey.d publishes (RFC 6376 §3.6.2.2).
func verifySig(tags map[string]string, digest []byte, lookupTXT func(string) ([]string, error)) error {
	alg := tags["a"]
	if alg != "rsa-sha256" && alg != "ed25519-sha256" {
		return fmt.Errorf("algorithm a=%s is not one this server verifies (rsa-sha256, ed25519-sha256)", alg)
	}
	sig, err := base64.StdEncoding.DecodeString(stripWSP(tags["b"]))
	if err != nil {
		return errors.New("the signature b= is not base64")
	}
	name := tags["s"] + "._domainkey." + tags["d"]
	txts, err := lookupTXT(name)
	if err != nil {
		return fmt.Errorf("key record %s: %v", name, err)
	}
	if len(txts) != 1 {
		// RFC 6376 §3.6.2.2: more than one record is no usable key.
		return fmt.Errorf("key record %s: %d TXT records, want one", name, len(txts))
	}
	pub, err := parseKeyRecord(txts[0])
	if err != nil {
		return fmt.Errorf("key record %s: %v", name, err)
	}
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if alg != "rsa-sha256" {
			return fmt.Errorf("key record %s holds an RSA key for a=%s", name, alg)
		}
		if k.N.BitLen() < minRSABits {
			return fmt.Errorf("key record %s: an RSA key of %d bits is too short", name, k.N.BitLen())
		}
		if rsa.VerifyPKCS1v15(k, crypto.SHA256, digest, sig) != nil {
			return errors.New("the signature does not verify")
		}
	case ed25519.PublicKey:
		if alg != "ed25519-sha256" || !ed25519.Verify(k, digest, sig) {
			return errors.New("the signature does not verify")
		}
	}
	return nil
}

// parseKeyRecord reads a DKIM key record (RFC 6376 §3.6.1, RFC 8463 §4).
func parseKeyRecord(rec string) (crypto.PublicKey, error) {
	tags, err := parseTags(rec)
	if err != nil {
		return nil, err
	}
	if v, ok := tags["v"]; ok && v != "DKIM1" {
		return nil, fmt.Errorf("version v=%s is not DKIM1", v)
	}
	p, ok := tags["p"]
	if !ok {
		return nil, errors.New("no public key (p=)")
	}
	if p = stripWSP(p); p == "" {
		return nil, errors.New("the key is revoked (empty p=)")
	}
	der, err := base64.StdEncoding.DecodeString(p)
	if err != nil {
		return nil, errors.New("the public key p= is not base64")
	}
	switch tags["k"] {
	case "", "rsa":
		if pub, err := x509.ParsePKIXPublicKey(der); err == nil {
			if k, ok := pub.(*rsa.PublicKey); ok {
				return k, nil
			}
			return nil, errors.New("k=rsa but the key is not RSA")
		}
		// RFC 6376 erratum 3017: some publish the bare RSAPublicKey.
		if k, err := x509.ParsePKCS1PublicKey(der); err == nil {
			return k, nil
		}
		return nil, errors.New("the RSA public key does not parse")
	case "ed25519":
		if len(der) != ed25519.PublicKeySize {
			return nil, errors.New("an ed25519 key is not 32 bytes")
		}
		return ed25519.PublicKey(der), nil
	default:
		return nil, fmt.Errorf("key type k=%s is not rsa or ed25519", tags["k"])
	}
}

func canonicalizations(c string) (header, body string, err error) {
	if c == "" {
		return "simple", "simple", nil
	}
	header, body, ok := strings.Cut(c, "/")
	if !ok {
		body = "simple"
	}
	for _, v := range []string{header, body} {
		if v != "simple" && v != "relaxed" {
			return "", "", fmt.Errorf("canonicalization c=%s is not simple or relaxed", c)
		}
	}
	return header, body, nil
}

// parseTags reads a tag list (RFC 6376 §3.2): tag=value pairs split by
// semicolons, whitespace around each part ignored, a tag given twice an
// error.
func parseTags(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, part := range strings.Split(s, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not tag=value", strings.TrimSpace(part))
		}
		k = strings.TrimSpace(k)
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("tag %s= appears twice", k)
		}
		out[k] = collapseFWS(v)
	}
	return out, nil
}

func stripWSP(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\r' || r == '\n' {
			return -1
		}
		return r
	}, s)
}

// withoutB returns a signature field with its b= value emptied, as it
// was when it was signed (RFC 6376 §3.7). Base64 has no semicolons, so
// the tag ends at the next one.
func withoutB(field string) string {
	name, val, _ := strings.Cut(field, ":")
	parts := strings.Split(val, ";")
	for i, p := range parts {
		k, _, ok := strings.Cut(p, "=")
		if ok && strings.TrimSpace(k) == "b" {
			parts[i] = p[:strings.Index(p, "=")+1]
			if i == len(parts)-1 && strings.HasSuffix(p, "\r\n") {
				parts[i] += "\r\n"
			}
		}
	}
	return name + ":" + strings.Join(parts, ";")
}

// splitMessage returns a message's header fields, raw with their folding
// and CRLFs, and its body.
func splitMessage(msg []byte) (fields []string, body []byte) {
	head := msg
	if bytes.HasPrefix(msg, []byte("\r\n")) {
		return nil, msg[2:]
	}
	if i := bytes.Index(msg, []byte("\r\n\r\n")); i >= 0 {
		head, body = msg[:i+2], msg[i+4:]
	}
	for len(head) > 0 {
		end := bytes.Index(head, []byte("\r\n"))
		line := head
		if end >= 0 {
			line = head[:end+2]
		}
		head = head[len(line):]
		if (line[0] == ' ' || line[0] == '\t') && len(fields) > 0 {
			fields[len(fields)-1] += string(line)
			continue
		}
		fields = append(fields, string(line))
	}
	return fields, body
}

func nameOf(field string) string {
	name, _, _ := strings.Cut(field, ":")
	return strings.ToLower(strings.TrimSpace(name))
}

func valueOf(field string) string {
	_, val, _ := strings.Cut(field, ":")
	return val
}

// pickHeaders returns the fields an h= list names (RFC 6376 §5.4.2): for
// each name the last occurrence not yet taken, from the bottom up; a
// name with none left contributes nothing. The fields are indexed by name
// once, so a hostile message's long header and h= list cost their sum,
// not their product.
func pickHeaders(fields []string, names []string) []string {
	byName := map[string][]int{}
	for i, f := range fields {
		n := nameOf(f)
		byName[n] = append(byName[n], i)
	}
	var out []string
	for _, n := range names {
		n = strings.ToLower(n)
		idx := byName[n]
		if len(idx) == 0 {
			continue
		}
		out = append(out, fields[idx[len(idx)-1]])
		byName[n] = idx[:len(idx)-1]
	}
	return out
}

// maxSignedHeaders bounds the h= list of a signature this server checks.
const maxSignedHeaders = 256

// canonicalHeader is RFC 6376 §3.4.1 (simple: as it is) and §3.4.2
// (relaxed: lower-case name, unfolded, runs of whitespace as one space,
// none around the colon or at the end).
func canonicalHeader(field, c string) string {
	if c == "simple" {
		if !strings.HasSuffix(field, "\r\n") {
			field += "\r\n"
		}
		return field
	}
	name, val, _ := strings.Cut(field, ":")
	return strings.ToLower(strings.Trim(name, " \t")) + ":" + collapseFWS(val) + "\r\n"
}

// canonicalBody is RFC 6376 §3.4.3 (simple: trailing empty lines gone,
// one CRLF at the end) and §3.4.4 (relaxed: also whitespace runs as one
// space and none at line ends; an empty body stays empty), cut to limit
// octets when l= asks (limit < 0: all).
func canonicalBody(body []byte, c string, limit int64) []byte {
	lines := bytes.Split(body, []byte("\r\n"))
	if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1] // the split after the final CRLF
	}
	if c == "relaxed" {
		for i, l := range lines {
			lines[i] = bytes.TrimRight(collapseWSP(l), " ")
		}
	}
	for len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	var out []byte
	if len(lines) > 0 {
		out = append(bytes.Join(lines, []byte("\r\n")), "\r\n"...)
	} else if c == "simple" {
		out = []byte("\r\n")
	}
	if limit >= 0 && int64(len(out)) > limit {
		out = out[:limit]
	}
	return out
}

// collapseFWS unfolds s and turns each run of SP and HTAB into one SP,
// none at the ends (RFC 6376 §3.4.2). Only those: other Unicode spaces
// in a UTF-8 header (RFC 6532) are text and signed as they are.
func collapseFWS(s string) string {
	f := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == '\r' || r == '\n' })
	return strings.Join(f, " ")
}

func collapseWSP(l []byte) []byte {
	if bytes.IndexByte(l, '\t') < 0 && !bytes.Contains(l, []byte("  ")) {
		return l
	}
	out := make([]byte, 0, len(l))
	wsp := false
	for _, c := range l {
		if c == ' ' || c == '\t' {
			wsp = true
			continue
		}
		if wsp {
			out = append(out, ' ')
			wsp = false
		}
		out = append(out, c)
	}
	if wsp {
		out = append(out, ' ')
	}
	return out
}

// arcResult is the Authentication-Results entry for a chain (RFC 8617
// §10.2): arc=pass|fail|none with the oldest instance that passed. A
// generic result, because go-msgauth v0.7.0 formats its ARCResult
// without the method name.
func arcResult(r ARCResult, remoteIP string) authres.Result {
	params := map[string]string{}
	if r.Value != authres.ResultNone {
		params["smtp.remote-ip"] = remoteIP
	}
	if r.OldestPass > 0 {
		params["header.oldest-pass"] = strconv.Itoa(r.OldestPass)
	}
	if r.Value == authres.ResultFail {
		params["reason"] = oneLine(r.Reason)
	}
	return &authres.GenericResult{Method: "arc", Value: r.Value, Params: params}
}

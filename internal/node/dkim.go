package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/mailauth"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// dkimPrefix names the clusterwide objects holding the domains' DKIM
// signing keys (a JSON list of mailauth.Key): every node signs what it
// queues for a domain with the same keys.
const dkimPrefix = "dkim/"

// SetDKIMKey makes new signing keys for a domain (RSA and Ed25519,
// replacing its old ones) and stores them as cluster state.
func (n *Node) SetDKIMKey(ctx context.Context, domain, selector string) ([]mailauth.KeyInfo, error) {
	domain = strings.ToLower(strings.TrimSpace(domain))
	if domain == "" || strings.ContainsAny(domain, "@/ ") || !strings.Contains(domain, ".") {
		return nil, fmt.Errorf("DKIM key: domain %q is not a domain name", domain)
	}
	keys, err := mailauth.NewKeys(domain, selector, time.Now())
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(keys)
	if err != nil {
		return nil, err
	}
	if _, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), dkimPrefix+domain, data, false, replica.One); err != nil {
		return nil, err
	}
	n.cfg.Logger.Info("dkim: signing keys set", "domain", domain, "selectors", keys[0].Selector+","+keys[1].Selector)
	return infos(keys)
}

// DeleteDKIMKey stops signing a domain's mail.
func (n *Node) DeleteDKIMKey(ctx context.Context, domain string) error {
	_, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), dkimPrefix+strings.ToLower(domain), nil, true, replica.One)
	return err
}

// DKIMKeys lists the domains' keys.
func (n *Node) DKIMKeys() ([]mailauth.KeyInfo, error) {
	var out []mailauth.KeyInfo
	for _, o := range n.Wide.List(dkimPrefix) {
		var keys []mailauth.Key
		if err := json.Unmarshal(o.Data, &keys); err != nil {
			return nil, fmt.Errorf("DKIM keys %s: %w", o.Name, err)
		}
		in, err := infos(keys)
		if err != nil {
			return nil, err
		}
		out = append(out, in...)
	}
	return out, nil
}

func infos(keys []mailauth.Key) ([]mailauth.KeyInfo, error) {
	out := make([]mailauth.KeyInfo, 0, len(keys))
	for _, k := range keys {
		info, err := k.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// dkimSign signs a message with the keys of its sender's domain, if that
// domain has some.
func (n *Node) dkimSign(msg []byte, from string) ([]byte, error) {
	keys, err := n.domainKeys(userdb.Domain(from))
	if err != nil || keys == nil {
		return msg, err
	}
	return mailauth.Sign(msg, keys)
}

// domainKeys returns a domain's signing keys; nil when it has none.
func (n *Node) domainKeys(domain string) ([]mailauth.Key, error) {
	o, ok := n.Wide.Get(dkimPrefix + domain)
	if !ok {
		return nil, nil
	}
	var keys []mailauth.Key
	if err := json.Unmarshal(o.Data, &keys); err != nil {
		return nil, fmt.Errorf("DKIM keys %s: %w", o.Name, err)
	}
	return keys, nil
}

// SealARC adds an ARC set (RFC 8617 §5.1) to mail from another server,
// made with the keys of the first recipient domain that has some, so
// that what this server found (SPF, DKIM, DMARC) travels with the
// message if a user or an alias sends it on. A seal that cannot be made
// is logged and the message goes on without it: it is worth less than
// the mail.
func (n *Node) SealARC(msg []byte, rcpts []string, v mailauth.Verdict) []byte {
	for _, r := range rcpts {
		d := userdb.Domain(r)
		keys, err := n.domainKeys(d)
		if err == nil && keys == nil {
			continue
		}
		if err == nil {
			var out []byte
			if out, err = mailauth.Seal(msg, keys, v.Results(), v.ARC, time.Now()); err == nil {
				return out
			}
		}
		if !errors.Is(err, mailauth.ErrNoKey) { // a domain with only an Ed25519 key
			n.cfg.Logger.Warn("ARC seal not added", "domain", d, "err", err)
		}
		return msg
	}
	return msg
}

// policyPrefix names the clusterwide objects holding the local domains'
// inbound policies (a JSON mailauth.Policy).
const policyPrefix = "policy/"

// SetDomainPolicy stores a local domain's inbound policy as cluster state.
func (n *Node) SetDomainPolicy(ctx context.Context, p mailauth.Policy) error {
	p.Domain = strings.ToLower(strings.TrimSpace(p.Domain))
	if p.Domain == "" || strings.ContainsAny(p.Domain, "@/ ") || !strings.Contains(p.Domain, ".") {
		return fmt.Errorf("inbound policy: domain %q is not a domain name", p.Domain)
	}
	for i, s := range p.TrustedSealers {
		p.TrustedSealers[i] = strings.ToLower(strings.TrimSpace(s))
	}
	if err := p.Check(); err != nil {
		return err
	}
	if p.DMARC == "" {
		p.DMARC = mailauth.DMARCReject
	}
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if _, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), policyPrefix+p.Domain, data, false, replica.One); err != nil {
		return err
	}
	n.cfg.Logger.Info("inbound policy set", "domain", p.Domain, "dmarc", p.DMARC, "trusted_arc_sealers", strings.Join(p.TrustedSealers, ","))
	return nil
}

// DeleteDomainPolicy returns a domain to the default policy.
func (n *Node) DeleteDomainPolicy(ctx context.Context, domain string) error {
	_, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), policyPrefix+strings.ToLower(domain), nil, true, replica.One)
	return err
}

// DomainPolicies lists the domains' policies that are not the default.
func (n *Node) DomainPolicies() ([]mailauth.Policy, error) {
	var out []mailauth.Policy
	for _, o := range n.Wide.List(policyPrefix) {
		var p mailauth.Policy
		if err := json.Unmarshal(o.Data, &p); err != nil {
			return nil, fmt.Errorf("inbound policy %s: %w", o.Name, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// InboundPolicy is the policy for a message to rcpts: the strictest of
// their domains' (a domain without one has the default, reject as the
// sender's DMARC asks). A policy that does not read is the default too,
// and logged.
func (n *Node) InboundPolicy(rcpts []string) mailauth.Policy {
	var ps []mailauth.Policy
	for _, r := range rcpts {
		var p mailauth.Policy
		if o, ok := n.Wide.Get(policyPrefix + userdb.Domain(r)); ok {
			if err := json.Unmarshal(o.Data, &p); err != nil {
				n.cfg.Logger.Warn("inbound policy does not read; the default applies", "object", o.Name, "err", err)
				p = mailauth.Policy{}
			}
		}
		ps = append(ps, p)
	}
	return mailauth.Strictest(ps)
}

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/mailauth"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// dkimPrefix names the clusterwide objects holding the domains' DKIM
// signing keys: every node signs what it queues for a domain with the
// same key.
const dkimPrefix = "dkim/"

// SetDKIMKey makes a new signing key for a domain (replacing its old one)
// and stores it as cluster state.
func (n *Node) SetDKIMKey(ctx context.Context, domain, selector string) (mailauth.KeyInfo, error) {
	domain = strings.ToLower(strings.TrimSpace(domain))
	if domain == "" || strings.ContainsAny(domain, "@/ ") || !strings.Contains(domain, ".") {
		return mailauth.KeyInfo{}, fmt.Errorf("DKIM key: domain %q is not a domain name", domain)
	}
	k, err := mailauth.NewKey(domain, selector, time.Now())
	if err != nil {
		return mailauth.KeyInfo{}, err
	}
	data, err := json.Marshal(k)
	if err != nil {
		return mailauth.KeyInfo{}, err
	}
	if _, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), dkimPrefix+domain, data, false, replica.One); err != nil {
		return mailauth.KeyInfo{}, err
	}
	n.cfg.Logger.Info("dkim: signing key set", "domain", domain, "selector", k.Selector)
	return k.Info()
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
		var k mailauth.Key
		if err := json.Unmarshal(o.Data, &k); err != nil {
			return nil, fmt.Errorf("DKIM key %s: %w", o.Name, err)
		}
		info, err := k.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// dkimSign signs a message with the key of its sender's domain, if that
// domain has one.
func (n *Node) dkimSign(msg []byte, from string) ([]byte, error) {
	o, ok := n.Wide.Get(dkimPrefix + userdb.Domain(from))
	if !ok {
		return msg, nil
	}
	var k mailauth.Key
	if err := json.Unmarshal(o.Data, &k); err != nil {
		return nil, fmt.Errorf("DKIM key %s: %w", o.Name, err)
	}
	return mailauth.Sign(msg, k)
}

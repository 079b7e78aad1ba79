package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/tlscert"
	"google.golang.org/protobuf/proto"
)

// The cluster's certificates are clusterwide objects named tlsPrefix +
// the first name the certificate covers: every node serves them
// (issue 11: a certificate given to one node is served by all).
const tlsPrefix = "tls/"

// serveClusterCerts follows the clusterwide certificates: those there at
// start and every change after.
func (n *Node) serveClusterCerts() {
	n.Wide.OnChange = func(o clusterwide.Object) {
		if strings.HasPrefix(o.Name, tlsPrefix) {
			n.loadClusterCerts()
		}
	}
	n.loadClusterCerts()
}

func (n *Node) loadClusterCerts() {
	var pems []tlscert.ClusterPEM
	for _, o := range n.Wide.List(tlsPrefix) {
		var c nodepb.Certificate
		if err := proto.Unmarshal(o.Data, &c); err != nil {
			n.cfg.Logger.Error("tls: cluster certificate unreadable", "name", o.Name, "err", err)
			continue
		}
		pems = append(pems, tlscert.ClusterPEM{Name: o.Name, Chain: c.ChainPem, Key: c.KeyPem, Source: c.Source})
	}
	n.Certs.SetCluster(pems)
}

// SetCertificate checks a certificate chain and key and makes them the
// cluster's certificate for the names it covers, replacing the one of the
// same first name. It returns once this node holds it durably, with the
// nodes that acknowledged it; the others get it from the update log or
// from anti-entropy within seconds of being reachable.
func (n *Node) SetCertificate(ctx context.Context, chain, key []byte, source string) (tlscert.Info, []cluster.NodeID, error) {
	_, info, err := tlscert.Parse(chain, key, time.Now())
	if err != nil {
		return tlscert.Info{}, nil, err
	}
	if len(info.Names) == 0 {
		return tlscert.Info{}, nil, fmt.Errorf("%w: the certificate names no host", tlscert.ErrBadCertificate)
	}
	info.Cluster, info.Source = tlsPrefix+strings.ToLower(info.Names[0]), source
	data, err := proto.Marshal(&nodepb.Certificate{ChainPem: chain, KeyPem: key, Source: source})
	if err != nil {
		return tlscert.Info{}, nil, err
	}
	acked, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), info.Cluster, data, false)
	if err != nil {
		return tlscert.Info{}, acked, err
	}
	n.cfg.Logger.Info("tls: cluster certificate set", "object", info.Cluster, "names", info.Names,
		"not_after", info.NotAfter.Format(time.DateOnly), "acked_by", acked)
	return info, acked, nil
}

// DeleteCertificate stops the cluster serving a certificate (by its
// object name, "tls/<name>", or the name alone).
func (n *Node) DeleteCertificate(ctx context.Context, name string) error {
	if !strings.HasPrefix(name, tlsPrefix) {
		name = tlsPrefix + strings.ToLower(name)
	}
	_, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), name, nil, true)
	if err == nil {
		n.cfg.Logger.Info("tls: cluster certificate deleted", "object", name)
	}
	return err
}

package node

import (
	"os"
	"os/exec"
	"path/filepath"

	"github.com/quillmail/quill/internal/mailauth"
	"github.com/quillmail/quill/internal/smtp"
	"github.com/quillmail/quill/internal/sns"
)

// InboundChecker is the checker of inbound mail the node and its filter
// workers build alike from the same settings.
func InboundChecker(dns, hostname, rspamd string, log func(string, ...any)) *mailauth.Checker {
	c := &mailauth.Checker{Resolver: Resolver(dns), Hostname: hostname, Log: log}
	if rspamd != "" {
		c.Rspamd = &mailauth.Rspamd{URL: rspamd}
	}
	return c
}

// originChecker is what checks mail from other servers: SNS filter worker
// processes (--filter-workers), with the node's own checker when none
// answers, or the node's own checker alone.
func (n *Node) originChecker() smtp.OriginChecker {
	cfg := n.cfg
	self := InboundChecker(cfg.DNS, cfg.Hostname, cfg.Rspamd, cfg.Logger.Warn)
	if cfg.FilterWorkers <= 0 {
		return self
	}
	exe, err := os.Executable()
	dir := filepath.Join(cfg.DataDir, "sns")
	if err == nil {
		err = os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		cfg.Logger.Warn("sns: filter workers not available; the node checks inbound mail itself", "err", err)
		return self
	}
	n.filters = sns.NewPool(sns.Config{Class: sns.FilterClass, Max: cfg.FilterWorkers, Dir: dir, Log: cfg.Logger,
		Command: func(socket string) *exec.Cmd {
			return exec.Command(exe, "worker", "--class", sns.FilterClass, "--socket", socket, "--hostname", cfg.Hostname,
				"--dns", cfg.DNS, "--rspamd", cfg.Rspamd)
		}})
	return sns.Filter{Pool: n.filters, Fallback: self}
}

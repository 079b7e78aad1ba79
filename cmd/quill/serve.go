package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/quillmail/quill/internal/node"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// drainTimeout is how long SIGTERM waits for sessions to finish before
// closing them.
const drainTimeout = 30 * time.Second

func init() {
	cfg := node.DefaultConfig()
	var configFile string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a Quill node (SMTP, POP3, IMAP, admin API)",
		Long: `Run a Quill node. With no flags it is a single node on loopback that keeps its
data in ./quill-data. Every flag is also a key of the optional config file
(--config): lines of "key = value", '#' starts a comment; flags given on the
command line win over the file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if configFile != "" {
				if err := applyConfigFile(cmd.Flags(), configFile); err != nil {
					return err
				}
			}
			return serve(cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "config file of key = value lines")
	f.StringVar(&cfg.DataDir, "data", cfg.DataDir, "data directory (hard state)")
	f.StringVar(&cfg.SMTPAddr, "smtp", cfg.SMTPAddr, "SMTP listen address")
	f.StringVar(&cfg.POP3Addr, "pop3", cfg.POP3Addr, "POP3 listen address")
	f.StringVar(&cfg.IMAPAddr, "imap", cfg.IMAPAddr, "IMAP listen address")
	f.StringVar(&cfg.HTTPAddr, "http", cfg.HTTPAddr, "admin API and dashboard listen address (needs the token in DATA/admin.token unless on loopback)")
	f.StringVar(&cfg.ClusterAddr, "cluster", "", "gossip address of this node (host:port); empty runs a cluster of one")
	f.StringSliceVar(&cfg.Join, "join", nil, "gossip addresses of other nodes to join (HOST:PORT[,HOST:PORT...]), retried until they answer")
	f.StringVar(&cfg.Hostname, "hostname", cfg.Hostname, "host name used in greetings and Received headers")
	f.Int64Var(&cfg.MaxMessageBytes, "max-message-size", cfg.MaxMessageBytes, "largest message accepted by SMTP, in bytes")
	f.DurationVar(&cfg.AuthFailDelay, "auth-fail-delay", cfg.AuthFailDelay, "delay before answering a failed login")
	f.Int64Var(&cfg.MinFree, "min-free", cfg.MinFree, "free disk bytes under which the node takes no new mail (disk full); under half of it, not even replica copies")
	f.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "copies of each message, for users who set none")
	f.StringVar(&cfg.WritePolicy, "write-policy", cfg.WritePolicy, "replicas that must hold a message before SMTP says 250, for users who set none: one, quorum or all")
	f.DurationVar(&cfg.ReplaceAfter, "replace-after", cfg.ReplaceAfter, "how long a node may be away before its messages get replicas on other nodes")
	f.DurationVar(&cfg.LogMaxAge, "log-max-age", cfg.LogMaxAge, "how long update log entries wait for an absent node; a node away longer rejoins as a new node")
	f.DurationVar(&cfg.AuditInterval, "audit-interval", cfg.AuditInterval, "how often each bucket manager audits its mailbox views and mail map against the fragments (0: never)")
	f.DurationVar(&cfg.ClockSkew, "clock-skew", 0, "shift this node's clock (testing clock skew)")
	rootCmd.AddCommand(cmd)
}

// applyConfigFile sets every flag named in the file that was not given on
// the command line.
func applyConfigFile(fs *pflag.FlagSet, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = strings.TrimSpace(text[:i])
		}
		if text == "" {
			continue
		}
		k, v, ok := strings.Cut(text, "=")
		if !ok {
			return fmt.Errorf("config %s:%d: want key = value, got %q", path, line, text)
		}
		k, v = strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`)
		fl := fs.Lookup(k)
		if fl == nil || k == "config" {
			return fmt.Errorf("config %s:%d: unknown key %q", path, line, k)
		}
		if fl.Changed {
			continue
		}
		if err := fs.Set(k, v); err != nil {
			return fmt.Errorf("config %s:%d: %s: %w", path, line, k, err)
		}
	}
	return sc.Err()
}

func serve(cfg node.Config) error {
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n, err := node.Start(cfg)
	if err != nil {
		return err
	}
	// One line per listener, on stdout, once all accept connections: tests
	// and scripts wait for these.
	for _, p := range []string{"smtp", "pop3", "imap", "http", "cluster", "rpc"} {
		if a := n.Addr(p); a != "" {
			fmt.Printf("quill: %s listening on %s\n", strings.ToUpper(p), a)
		}
	}
	fmt.Printf("quill: node %s ready, data in %s\n", n.ID, cfg.DataDir)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	s := <-sig
	cfg.Logger.Info("draining sessions", "signal", s.String(), "timeout", drainTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	cfg.Logger.Info("stopped")
	return nil
}

package main

import (
	"fmt"

	"github.com/quillmail/quill/internal/node"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/sns"
	"github.com/spf13/cobra"
)

func init() {
	var class, socket, hostname, dns, rspamd string
	var port, stsPort int
	cmd := &cobra.Command{
		Use:    "worker --class relay|filter --socket PATH",
		Short:  "Run one SNS worker process (started and supervised by quill serve, not by hand)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch class {
			case sns.RelayClass:
				return sns.ServeRelay(socket, &queue.Dialer{Resolver: node.Resolver(dns), Port: port, STSPort: stsPort, Hostname: hostname})
			case sns.FilterClass:
				return sns.ServeFilter(socket, node.InboundChecker(dns, hostname, rspamd, nil))
			}
			return fmt.Errorf("worker class %q: the classes are %s and %s", class, sns.RelayClass, sns.FilterClass)
		},
	}
	cmd.Flags().StringVar(&class, "class", sns.RelayClass, "worker class")
	cmd.Flags().StringVar(&socket, "socket", "", "Unix socket to serve tasks on")
	cmd.Flags().StringVar(&hostname, "hostname", "localhost", "host name in EHLO")
	cmd.Flags().StringVar(&dns, "dns", "", "DNS server (host:port); empty: the system's")
	cmd.Flags().IntVar(&port, "outbound-port", 25, "port of other domains' mail servers")
	cmd.Flags().IntVar(&stsPort, "mta-sts-port", 443, "port of other domains' MTA-STS policy servers")
	cmd.Flags().StringVar(&rspamd, "rspamd", "", "rspamd's base URL for spam scores (class filter); empty: none")
	cmd.MarkFlagRequired("socket")
	rootCmd.AddCommand(cmd)
}

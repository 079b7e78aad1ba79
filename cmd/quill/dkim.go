package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quillmail/quill/internal/mailauth"
	"github.com/spf13/cobra"
)

func init() {
	var c adminClient
	cmd := &cobra.Command{Use: "dkim", Short: "Manage the DKIM keys that sign mail leaving for other domains"}
	c.flags(cmd)

	add := dkimAddCmd(&c, "add DOMAIN")
	list := &cobra.Command{
		Use: "list", Short: "List the domains that have a signing key, with the DNS record of each", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var keys []mailauth.KeyInfo
			if err := c.do("GET", "/api/dkim", nil, &keys); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "DOMAIN\tSELECTOR\tALGORITHM\tCREATED\tTXT RECORD")
			for _, k := range keys {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s. \"%s\"\n", k.Domain, k.Selector, k.Algorithm, k.Created.Format(time.DateOnly), k.RecordName, k.Record)
			}
			return w.Flush()
		},
	}
	del := &cobra.Command{
		Use: "del DOMAIN", Short: "Stop signing a domain's mail", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.do("DELETE", "/api/dkim/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Printf("%s: no longer signed\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(add, list, del)
	rootCmd.AddCommand(cmd)

	// quill domain dkim DOMAIN: the same, where an operator managing a
	// domain looks for it (issue 14 adds the domains' other settings).
	var dc adminClient
	domain := &cobra.Command{Use: "domain", Short: "Manage the served mail domains and their settings"}
	dc.flags(domain)
	domain.AddCommand(domainCmds(&dc)...)
	domain.AddCommand(dkimAddCmd(&dc, "dkim DOMAIN"), policyCmd(&dc), policiesCmd(&dc))
	rootCmd.AddCommand(domain)
}

// policyCmd sets a local domain's inbound policy.
func policyCmd(c *adminClient) *cobra.Command {
	var p mailauth.Policy
	var reset bool
	cmd := &cobra.Command{
		Use:   "policy DOMAIN",
		Short: "Set what a local domain does with mail that fails its sender's DMARC policy",
		Long: "--dmarc reject (the default) does what the sender's domain asks: p=reject is refused, p=quarantine\n" +
			"goes to Junk. quarantine sends to Junk what would be refused; accept delivers it to the inbox.\n" +
			"The results are recorded in Authentication-Results whatever the policy. --trust-arc names an ARC\n" +
			"sealer (a forwarder or list the domain's users receive through) whose passing chain excuses a\n" +
			"DMARC failure (RFC 8617 §7.2.1); give it once per sealer. --default returns to the default.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/api/policies/" + url.PathEscape(args[0])
			if reset {
				if err := c.do("DELETE", path, nil, nil); err != nil {
					return err
				}
				fmt.Printf("%s: the default inbound policy (reject as the sender's DMARC asks)\n", args[0])
				return nil
			}
			if err := c.do("PUT", path, p, nil); err != nil {
				return err
			}
			fmt.Printf("%s: DMARC failures: %s; trusted ARC sealers: %s\n", args[0], p.DMARC, orNone(p.TrustedSealers))
			return nil
		},
	}
	cmd.Flags().StringVar(&p.DMARC, "dmarc", mailauth.DMARCReject, "reject, quarantine or accept")
	cmd.Flags().StringArrayVar(&p.TrustedSealers, "trust-arc", nil, "an ARC sealer domain whose passing chain excuses a DMARC failure")
	cmd.Flags().BoolVar(&reset, "default", false, "remove the domain's policy")
	return cmd
}

func policiesCmd(c *adminClient) *cobra.Command {
	return &cobra.Command{
		Use: "policies", Short: "List the local domains' inbound policies that are not the default", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var ps []mailauth.Policy
			if err := c.do("GET", "/api/policies", nil, &ps); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "DOMAIN\tDMARC FAILURES\tTRUSTED ARC SEALERS")
			for _, p := range ps {
				fmt.Fprintf(w, "%s\t%s\t%s\n", p.Domain, p.DMARC, orNone(p.TrustedSealers))
			}
			return w.Flush()
		},
	}
}

func orNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// dkimAddCmd makes a domain's signing keys through the admin API and
// prints the DNS records to publish.
func dkimAddCmd(c *adminClient, use string) *cobra.Command {
	var selector string
	add := &cobra.Command{
		Use:   use,
		Short: "Make a domain's signing keys (replacing its old ones) and print the DNS records to publish",
		Long: "Makes a 2048-bit RSA key (selector SELECTOR+r) and an Ed25519 key (SELECTOR+e, RFC 8463), stores them\n" +
			"as cluster state (every node signs with them), and prints the TXT records receivers look up. Mail\n" +
			"is signed with both from now on; publish the records before relying on them.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var keys []mailauth.KeyInfo
			if err := c.do("PUT", "/api/dkim/"+url.PathEscape(args[0]), map[string]string{"selector": selector}, &keys); err != nil {
				return err
			}
			fmt.Printf("mail from %s is signed with %d keys; publish these TXT records:\n\n", args[0], len(keys))
			for _, k := range keys {
				fmt.Printf("%s. IN TXT \"%s\"\n", k.RecordName, k.Record)
			}
			return nil
		},
	}
	add.Flags().StringVar(&selector, "selector", "", "base of the DKIM selectors (default: quill, the year and the month)")
	return add
}

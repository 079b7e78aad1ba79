package main

import (
	"fmt"
	"net/url"
	"os"
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
	domain := &cobra.Command{Use: "domain", Short: "Manage a mail domain's settings"}
	dc.flags(domain)
	domain.AddCommand(dkimAddCmd(&dc, "dkim DOMAIN"))
	rootCmd.AddCommand(domain)
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

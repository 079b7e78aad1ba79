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
	var selector string
	cmd := &cobra.Command{Use: "dkim", Short: "Manage the DKIM keys that sign mail leaving for other domains"}
	c.flags(cmd)

	add := &cobra.Command{
		Use:   "add DOMAIN",
		Short: "Make a signing key for a domain (replacing its old one) and print the DNS record to publish",
		Long: "Makes a 2048-bit RSA key, stores it as cluster state (every node signs with it), and prints the\n" +
			"TXT record receivers look up. Mail is signed from now on; publish the record before relying on it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var k mailauth.KeyInfo
			if err := c.do("PUT", "/api/dkim/"+url.PathEscape(args[0]), map[string]string{"selector": selector}, &k); err != nil {
				return err
			}
			fmt.Printf("mail from %s is signed with selector %s; publish this TXT record:\n\n%s. IN TXT \"%s\"\n",
				k.Domain, k.Selector, k.RecordName, k.Record)
			return nil
		},
	}
	add.Flags().StringVar(&selector, "selector", "", "DKIM selector (default: quill and the year and month)")

	list := &cobra.Command{
		Use: "list", Short: "List the domains that have a signing key, with the DNS record of each", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var keys []mailauth.KeyInfo
			if err := c.do("GET", "/api/dkim", nil, &keys); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "DOMAIN\tSELECTOR\tCREATED\tTXT RECORD")
			for _, k := range keys {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s. \"%s\"\n", k.Domain, k.Selector, k.Created.Format(time.DateOnly), k.RecordName, k.Record)
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
}

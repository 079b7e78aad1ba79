package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quillmail/quill/internal/tlscert"
	"github.com/spf13/cobra"
)

// certInfo is a certificate as the admin API shows it.
type certInfo struct {
	tlscert.Info
	AckedBy []string `json:"acked_by"`
}

func init() {
	var c adminClient
	var certFile, keyFile string
	cmd := &cobra.Command{Use: "tls", Short: "Manage the certificates every node of the cluster serves"}
	c.flags(cmd)

	set := &cobra.Command{
		Use:   "set --cert FILE --key FILE",
		Short: "Serve a certificate (PEM chain and key) on every node, for the names it covers",
		Long: "Checks the certificate and key, stores them as cluster state and puts them in service on every\n" +
			"node within seconds (nodes that are away get them when they come back). A certificate for the\n" +
			"same first name replaces the previous one. A node's own --tls-cert files still come first there.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			chain, err := os.ReadFile(certFile)
			if err != nil {
				return fmt.Errorf("certificate: %w", err)
			}
			key, err := os.ReadFile(keyFile)
			if err != nil {
				return fmt.Errorf("key: %w", err)
			}
			var out certInfo
			if err := c.do("PUT", "/api/tls", map[string]string{"cert": string(chain), "key": string(key)}, &out); err != nil {
				return err
			}
			fmt.Printf("serving %s (until %s) as %s; stored on %s, the other nodes follow\n",
				strings.Join(out.Names, ", "), out.NotAfter.Format(time.DateOnly), out.Cluster, strings.Join(out.AckedBy, ", "))
			return nil
		},
	}
	set.Flags().StringVar(&certFile, "cert", "", "PEM file of the certificate chain, leaf first")
	set.Flags().StringVar(&keyFile, "key", "", "PEM file of the private key")
	set.MarkFlagRequired("cert")
	set.MarkFlagRequired("key")

	list := &cobra.Command{
		Use: "list", Short: "List the certificates this node serves, in the order it tries them", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var certs []certInfo
			if err := c.do("GET", "/api/tls", nil, &certs); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "NAMES\tNOT AFTER\tFROM")
			for _, ci := range certs {
				from := ci.CertFile
				switch {
				case ci.Cluster != "":
					from = "cluster " + ci.Cluster + " (" + ci.Source + ")"
				case ci.SelfSigned:
					from = "self-signed " + ci.CertFile
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", strings.Join(ci.Names, ","), ci.NotAfter.Format(time.DateOnly), from)
			}
			return w.Flush()
		},
	}

	del := &cobra.Command{
		Use: "del NAME", Short: "Stop serving a cluster certificate (tls/NAME, as list shows it)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.do("DELETE", "/api/tls/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Printf("deleted %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(set, list, del)
	rootCmd.AddCommand(cmd)
}

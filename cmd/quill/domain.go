package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/quillmail/quill/internal/domain"
	"github.com/spf13/cobra"
)

// domainCmds are quill domain add|set|list|del: the served domains, their
// postmaster, catch-all and quota.
func domainCmds(c *adminClient) []*cobra.Command {
	var d domain.Domain
	var q quotaFlags
	add := &cobra.Command{
		Use:   "add DOMAIN",
		Short: "Serve a mail domain: users and aliases can then be added in it",
		Long: "Adds DOMAIN to the domains the cluster takes mail for. postmaster@ and abuse@ (RFC 2142) reach\n" +
			"--postmaster, or the domain's first user when none is given; --catch-all receives mail for any\n" +
			"address of the domain nothing else takes.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			d.Name = args[0]
			if err := q.apply(cmd, &d); err != nil {
				return err
			}
			var out domain.Domain
			if err := c.do("POST", "/api/domains", d, &out); err != nil {
				return err
			}
			fmt.Printf("domain %s added\n", out.Name)
			return nil
		},
	}
	add.Flags().StringVar(&d.Postmaster, "postmaster", "", "address that receives postmaster@ and abuse@ mail")
	add.Flags().StringVar(&d.CatchAll, "catch-all", "", "address that receives mail for unknown addresses of the domain")
	q.flags(add)

	var sd domain.Domain
	var sq quotaFlags
	set := &cobra.Command{
		Use: "set DOMAIN", Short: "Change a domain's postmaster, catch-all (an empty value removes it) or quota", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var cur []domain.Domain
			if err := c.do("GET", "/api/domains", nil, &cur); err != nil {
				return err
			}
			for _, x := range cur {
				if x.Name == domain.Normalize(args[0]) {
					// What no flag changes stays as it is.
					pm, ca := sd.Postmaster, sd.CatchAll
					sd = x
					if cmd.Flags().Changed("postmaster") {
						sd.Postmaster = pm
					}
					if cmd.Flags().Changed("catch-all") {
						sd.CatchAll = ca
					}
				}
			}
			if err := sq.apply(cmd, &sd); err != nil {
				return err
			}
			var out domain.Domain
			if err := c.do("PUT", "/api/domains/"+url.PathEscape(args[0]), sd, &out); err != nil {
				return err
			}
			fmt.Printf("domain %s: postmaster %s, catch-all %s, quota %s\n", out.Name, orDash(out.Postmaster), orDash(out.CatchAll), domainQuota(out))
			return nil
		},
	}
	set.Flags().StringVar(&sd.Postmaster, "postmaster", "", "address that receives postmaster@ and abuse@ mail")
	set.Flags().StringVar(&sd.CatchAll, "catch-all", "", "address that receives mail for unknown addresses of the domain")
	sq.flags(set)

	list := &cobra.Command{
		Use: "list", Short: "List the served domains", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var ds []domain.Domain
			if err := c.do("GET", "/api/domains", nil, &ds); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "DOMAIN\tPOSTMASTER\tCATCH-ALL\tQUOTA\tADDED")
			for _, d := range ds {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", d.Name, orDash(d.Postmaster), orDash(d.CatchAll), domainQuota(d), d.Created.Format("2006-01-02 15:04"))
			}
			return w.Flush()
		},
	}
	del := &cobra.Command{
		Use: "del DOMAIN", Short: "Stop serving a domain (it must have no users and no aliases left)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.do("DELETE", "/api/domains/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Printf("domain %s deleted\n", args[0])
			return nil
		},
	}
	return []*cobra.Command{add, set, list, del}
}

// quotaFlags are a domain's quota flags of quill domain add and set.
type quotaFlags struct {
	storage  string
	messages int64
	reply    string
}

func (q *quotaFlags) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&q.storage, "quota-storage", "", "limit on the bytes of all the domain's users' mail together, e.g. 50G (0: no limit)")
	cmd.Flags().Int64Var(&q.messages, "quota-messages", 0, "limit on the number of the domain's users' messages together (0: no limit)")
	cmd.Flags().StringVar(&q.reply, "quota-reply", "", "how delivery over a user's or the domain's quota is refused: temporary (452 4.2.2, the default) or permanent (552 5.2.2)")
}

// apply sets what the flags given say on d.
func (q *quotaFlags) apply(cmd *cobra.Command, d *domain.Domain) error {
	if cmd.Flags().Changed("quota-storage") {
		n, err := parseSize(q.storage)
		if err != nil {
			return fmt.Errorf("--quota-storage: %w", err)
		}
		d.QuotaStorage = n
	}
	if cmd.Flags().Changed("quota-messages") {
		d.QuotaMessages = q.messages
	}
	switch q.reply {
	case "":
	case "temporary":
		d.QuotaPermanent = false
	case "permanent":
		d.QuotaPermanent = true
	default:
		return fmt.Errorf("--quota-reply %q: want temporary or permanent", q.reply)
	}
	return nil
}

// domainQuota says a domain's quota for a listing.
func domainQuota(d domain.Domain) string {
	if !d.Limited() {
		if d.QuotaPermanent {
			return "- (refusals permanent)"
		}
		return "-"
	}
	var parts []string
	if d.QuotaStorage > 0 {
		parts = append(parts, formatSize(d.QuotaStorage))
	}
	if d.QuotaMessages > 0 {
		parts = append(parts, fmt.Sprintf("%d messages", d.QuotaMessages))
	}
	if d.QuotaPermanent {
		parts = append(parts, "permanent")
	}
	return strings.Join(parts, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func init() {
	var c adminClient
	cmd := &cobra.Command{Use: "alias", Short: "Manage the aliases of the served domains"}
	c.flags(cmd)
	set := &cobra.Command{
		Use:   "set ADDRESS TARGET...",
		Short: "Make ADDRESS deliver to the TARGET addresses (replacing what it delivered to)",
		Long: "An alias is looked at before a user of the same address. Targets are users of the cluster (or\n" +
			"other aliases); a target that is no user when mail arrives is left out and logged.",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out domain.Alias
			if err := c.do("PUT", "/api/aliases/"+url.PathEscape(args[0]), domain.Alias{Targets: args[1:]}, &out); err != nil {
				return err
			}
			fmt.Printf("%s -> %s\n", out.Address, strings.Join(out.Targets, ", "))
			return nil
		},
	}
	var inDomain string
	list := &cobra.Command{
		Use: "list", Short: "List the aliases (of one domain with --domain)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var as []domain.Alias
			if err := c.do("GET", "/api/aliases?domain="+url.QueryEscape(inDomain), nil, &as); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ALIAS\tTARGETS")
			for _, a := range as {
				fmt.Fprintf(w, "%s\t%s\n", a.Address, strings.Join(a.Targets, ", "))
			}
			return w.Flush()
		},
	}
	list.Flags().StringVar(&inDomain, "domain", "", "only this domain's aliases")
	del := &cobra.Command{
		Use: "del ADDRESS", Short: "Remove an alias", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.do("DELETE", "/api/aliases/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Printf("alias %s deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(set, list, del)
	rootCmd.AddCommand(cmd)
}

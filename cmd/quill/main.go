// Command quill is the one binary of Quill: a mail node (serve), its admin
// clients (user, cluster) and the load generator (bench).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

var rootCmd = &cobra.Command{
	Use:   "quill",
	Short: "Quill: a self-managing clustered mail service (SMTP, POP3, IMAP)",
	Long: `Quill is a mail service that runs on one machine out of the box and becomes a
self-managing cluster when more nodes are started (the Porcupine architecture).`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "quill:", err)
		os.Exit(1)
	}
}

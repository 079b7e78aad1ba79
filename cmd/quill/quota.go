package main

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/quillmail/quill/internal/config"

	"github.com/spf13/cobra"
)

// quotaCommand is `quill user quota`: shows a user's usage and quota, and
// sets the limits when --storage or --messages is given.
func quotaCommand(c *adminClient) *cobra.Command {
	var storage string
	var messages int64
	cmd := &cobra.Command{
		Use:   "quota ADDRESS",
		Short: "Show a user's mail usage and quota; set it with --storage and --messages (0: no limit)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/api/users/" + url.PathEscape(args[0]) + "/quota"
			var q struct {
				Storage      int64 `json:"storage"`
				Messages     int64 `json:"messages"`
				StorageUsed  int64 `json:"storage_used"`
				MessagesUsed int64 `json:"messages_used"`
			}
			if err := c.do("GET", path, nil, &q); err != nil {
				return err
			}
			if cmd.Flags().Changed("storage") || cmd.Flags().Changed("messages") {
				if cmd.Flags().Changed("storage") {
					n, err := parseSize(storage)
					if err != nil {
						return fmt.Errorf("--storage: %w", err)
					}
					q.Storage = n
				}
				if cmd.Flags().Changed("messages") {
					q.Messages = messages
				}
				body := map[string]int64{"storage": q.Storage, "messages": q.Messages}
				if err := c.do("PUT", path, body, nil); err != nil {
					return err
				}
			}
			fmt.Printf("%s: %s of %s, %d of %s messages\n", args[0], formatSize(q.StorageUsed), limitOrNone(q.Storage, formatSize),
				q.MessagesUsed, limitOrNone(q.Messages, func(n int64) string { return strconv.FormatInt(n, 10) }))
			return nil
		},
	}
	cmd.Flags().StringVar(&storage, "storage", "", "limit on the bytes of the user's mail, e.g. 500M or 2G (0: no limit)")
	cmd.Flags().Int64Var(&messages, "messages", 0, "limit on the number of the user's messages (0: no limit)")
	return cmd
}

func limitOrNone(n int64, format func(int64) string) string {
	if n <= 0 {
		return "no limit"
	}
	return format(n)
}

// parseSize and formatSize are config.ParseSize and config.FormatSize.
var (
	parseSize  = config.ParseSize
	formatSize = config.FormatSize
)

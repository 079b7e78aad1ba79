package main

import (
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"

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

// sizeUnits are the suffixes parseSize takes, in powers of 1024 (as
// RFC 9208 counts STORAGE in units of 1024 octets).
var sizeUnits = []struct {
	suffix string
	mult   int64
}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}

// parseSize reads a size such as 500M, 2G, 1.5G or 1048576 (bytes).
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	for _, u := range sizeUnits {
		if u.suffix != "B" && strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional K, M, G or T", s)
	}
	return int64(f * float64(mult)), nil
}

// formatSize writes a byte count the way parseSize reads it.
func formatSize(n int64) string {
	for _, u := range sizeUnits[:4] {
		if n >= u.mult {
			return strconv.FormatFloat(float64(n)/float64(u.mult), 'f', 1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

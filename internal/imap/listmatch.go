package imap

import "strings"

// matchMailbox reports whether a mailbox name matches a LIST pattern (RFC
// 9051 §6.3.9): "*" matches any run of characters, "%" any run without the
// hierarchy delimiter. The match is a dynamic program over (pattern, name)
// positions, so a pattern full of wildcards costs O(len(pattern)·len(name))
// rather than the exponential backtracking of a naive matcher.
func matchMailbox(name, pattern string, delim byte) bool {
	name, pattern = canonInbox(name, delim), canonInbox(pattern, delim)
	// prev[j]: pattern[:i] matches name[:j].
	prev := make([]bool, len(name)+1)
	cur := make([]bool, len(name)+1)
	prev[0] = true
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		for j := range cur {
			cur[j] = false
		}
		switch c {
		case '*':
			// cur[j] = prev[k] for some k <= j
			any := false
			for j := 0; j <= len(name); j++ {
				any = any || prev[j]
				cur[j] = any
			}
		case '%':
			// cur[j] = prev[k] for some k <= j with no delimiter in name[k:j]
			run := false
			for j := 0; j <= len(name); j++ {
				if j > 0 && name[j-1] == delim {
					run = false
				}
				run = run || prev[j]
				cur[j] = run
			}
		default:
			for j := 1; j <= len(name); j++ {
				cur[j] = prev[j-1] && name[j-1] == c
			}
		}
		prev, cur = cur, prev
	}
	return prev[len(name)]
}

// canonInbox upper-cases a leading INBOX level, which is case-insensitive
// (RFC 9051 §5.1).
func canonInbox(s string, delim byte) string {
	if len(s) >= 5 && strings.EqualFold(s[:5], "INBOX") && (len(s) == 5 || s[5] == delim) {
		return "INBOX" + s[5:]
	}
	return s
}

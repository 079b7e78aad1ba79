package migrate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"
)

// Item is one message of a folder as a source or the destination lists
// it, without its bytes: enough to decide what to copy.
type Item struct {
	// Key identifies the message across servers (Key).
	Key   string
	Flags []string
	Date  time.Time
	Size  int64
	// UID is the message's UID at an IMAP source or at the destination.
	UID uint32
	// ID is the destination's message id (its body is fetched by it), or a
	// source's name of the message for errors (a file name, an mbox
	// offset).
	ID string
	// Path and Offset locate a message of a Maildir (Path) or an mbox
	// (Path, Offset and Size of its raw span, from the From_ line).
	Path   string
	Offset int64
	Span   int64
}

// Key is the identity of a message for reruns: the SHA-256 of its header
// section, without the empty line that ends it. Both sides compute it
// from the bytes as stored at the destination (CRLF line ends), the
// source from what it will send. The size is left out: some IMAP servers
// report an RFC822.SIZE that differs from the bytes they send, and a key
// that held it would make every rerun copy everything again; a header
// section (Received, Message-ID, Date) tells messages apart on its own.
func Key(header []byte) string {
	h := sha256.Sum256(bytes.TrimRight(header, "\r\n"))
	return hex.EncodeToString(h[:16])
}

// HeaderOf returns the header section of a message: up to and including
// the empty line that ends it, or all of it when there is none.
func HeaderOf(raw []byte) []byte {
	if len(raw) >= 2 && raw[0] == '\r' && raw[1] == '\n' {
		return raw[:2]
	}
	if len(raw) >= 1 && raw[0] == '\n' {
		return raw[:1]
	}
	if i := bytes.Index(raw, []byte("\r\n\r\n")); i >= 0 {
		return raw[:i+4]
	}
	if i := bytes.Index(raw, []byte("\n\n")); i >= 0 {
		return raw[:i+2]
	}
	return raw
}

// KeyOf is Key of a whole message.
func KeyOf(raw []byte) string { return Key(HeaderOf(raw)) }

// ToCRLF returns raw with every bare LF made CRLF (RFC 5322 §2.1: lines end
// in CRLF; Maildir and mbox files keep LF). raw is returned as is when it
// has no bare LF.
func ToCRLF(raw []byte) []byte {
	bare := 0
	for i, c := range raw {
		if c == '\n' && (i == 0 || raw[i-1] != '\r') {
			bare++
		}
	}
	if bare == 0 {
		return raw
	}
	out := make([]byte, 0, len(raw)+bare)
	for i, c := range raw {
		if c == '\n' && (i == 0 || raw[i-1] != '\r') {
			out = append(out, '\r')
		}
		out = append(out, c)
	}
	return out
}

// ToLF returns raw with every CRLF made LF, as Maildir files keep lines.
func ToLF(raw []byte) []byte {
	if !bytes.Contains(raw, []byte("\r\n")) {
		return raw
	}
	return bytes.ReplaceAll(raw, []byte("\r\n"), []byte("\n"))
}

// systemFlags are the IMAP system flags (RFC 9051 §2.3.2) in their
// canonical spelling; \Recent is not one a client can set.
var systemFlags = []string{`\Seen`, `\Answered`, `\Flagged`, `\Deleted`, `\Draft`}

// maxFlagLen bounds a keyword; real ones are short, and the admin API
// refuses longer.
const maxFlagLen = 128

// ValidFlag reports whether f can be a stored flag: a system flag or an
// IMAP atom (RFC 9051 §9: no space, parentheses, braces, quotes, wildcards,
// backslash after the first character or controls).
func ValidFlag(f string) bool {
	if f == "" || len(f) > maxFlagLen {
		return false
	}
	if f[0] == '\\' {
		return slices.ContainsFunc(systemFlags, func(s string) bool { return strings.EqualFold(s, f) })
	}
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`(){%*"\]`, c) >= 0 {
			return false
		}
	}
	return true
}

// CleanFlags returns flags as they are stored and compared: system flags in
// their canonical spelling, no \Recent, no invalid flags, each once
// (case-insensitively, RFC 9051 §2.3.2), sorted.
func CleanFlags(flags []string) []string {
	out := make([]string, 0, len(flags))
	for _, f := range flags {
		for _, s := range systemFlags {
			if strings.EqualFold(f, s) {
				f = s
			}
		}
		if !ValidFlag(f) || slices.ContainsFunc(out, func(o string) bool { return strings.EqualFold(o, f) }) {
			continue
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Compare(strings.ToLower(a), strings.ToLower(b)) })
	return out
}

// SameFlags reports whether two flag lists hold the same flags, in any
// order and case.
func SameFlags(a, b []string) bool {
	a, b = CleanFlags(a), CleanFlags(b)
	return slices.EqualFunc(a, b, strings.EqualFold)
}

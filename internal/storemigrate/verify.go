package storemigrate

// The verify pass: both sides read again and compared user by user,
// mailbox by mailbox and message by message (UID, flags, MODSEQ,
// INTERNALDATE, size, SHA-256 of the bytes). Digest does the reading;
// Compare is pure.

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/quillmail/quill/internal/mailbox"
)

// Digest is what the verify pass compares of one side.
type Digest struct {
	// Users maps each live user to its mailboxes by name.
	Users map[string]map[string]*BoxDigest
	// Queue maps each queue entry that is not deleted to the SHA-256 of
	// its message; Objects each live clusterwide object to its data's.
	Queue   map[string][32]byte
	Objects map[string][32]byte
}

// BoxDigest is one mailbox as compared.
type BoxDigest struct {
	UIDValidity   uint32
	UIDNext       uint32
	HighestModSeq uint64
	Subscribed    bool
	Messages      []MessageDigest // UID order
}

// MessageDigest is one message as compared. Date is in milliseconds:
// Cassandra's timestamp type keeps no finer (IMAP's INTERNALDATE shows
// seconds).
type MessageDigest struct {
	UID    uint32
	Flags  string // sorted, lower-cased, space-separated
	ModSeq uint64
	Date   int64
	Size   int64
	SHA256 [32]byte
}

// Digest reads every message's bytes of a snapshot from src and hashes
// them. A body that cannot be read is a difference, reported by Compare
// as a zero hash, not an error that stops the pass.
func DigestOf(ctx context.Context, src Source, snap *Snapshot, p Progress) (*Digest, error) {
	d := &Digest{Users: map[string]map[string]*BoxDigest{}, Queue: map[string][32]byte{}, Objects: map[string][32]byte{}}
	for _, e := range snap.Queue {
		if !e.Deleted {
			var h [32]byte
			if body, err := src.QueueMessage(ctx, e.ID); err == nil {
				h = sha256.Sum256(body)
			}
			d.Queue[e.ID] = h
		}
	}
	for _, o := range snap.Objects {
		if !o.Deleted {
			d.Objects[o.Name] = sha256.Sum256(o.Data)
		}
	}
	for _, u := range snap.Users {
		if u.Profile.Deleted {
			continue
		}
		boxes := map[string]*BoxDigest{}
		d.Users[u.Profile.Address] = boxes
		for _, b := range u.Boxes {
			if p != nil {
				p.Folder(u.Profile.Address+" "+b.Mailbox.Name, len(b.Messages))
			}
			bd := &BoxDigest{UIDValidity: b.Mailbox.UIDValidity, UIDNext: b.Mailbox.UIDNext, HighestModSeq: b.Mailbox.HighestModSeq,
				Subscribed: b.Mailbox.Subscribed}
			boxes[b.Mailbox.Name] = bd
			err := eachBody(ctx, src, u.Profile.Address, b.Messages, func(m *mailbox.Message, body []byte, err error) error {
				md := MessageDigest{UID: m.UID, Flags: flagSet(m.Flags), ModSeq: m.ModSeq, Date: m.Date.UnixMilli(), Size: m.Size}
				if err == nil {
					md.SHA256 = sha256.Sum256(body)
				}
				bd.Messages = append(bd.Messages, md)
				if p != nil {
					p.Message(m.Size)
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			sort.Slice(bd.Messages, func(i, j int) bool { return bd.Messages[i].UID < bd.Messages[j].UID })
		}
	}
	return d, nil
}

// flagSet is a flag list as a set: IMAP flags are case-insensitive (RFC
// 3501 §2.3.2) and unordered.
func flagSet(flags []string) string {
	s := make([]string, 0, len(flags))
	for _, f := range flags {
		f = strings.ToLower(f)
		if !slices.Contains(s, f) {
			s = append(s, f)
		}
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

// maxListed bounds the differences listed for one mailbox; past it they
// are counted.
const maxListed = 20

// Compare lists every difference between two sides (a the source, b the
// destination), each naming the user, the mailbox and the message by UID.
// None means the copy is whole.
func Compare(a, b *Digest) []string {
	var out []string
	for _, user := range sortedKeys(a.Users, b.Users) {
		ab, aok := a.Users[user]
		bb, bok := b.Users[user]
		switch {
		case !bok:
			out = append(out, fmt.Sprintf("user %s: missing at the destination", user))
			continue
		case !aok:
			out = append(out, fmt.Sprintf("user %s: at the destination only", user))
			continue
		}
		for _, name := range sortedKeys(ab, bb) {
			out = append(out, compareBox(fmt.Sprintf("user %s mailbox %q", user, name), ab[name], bb[name])...)
		}
	}
	out = append(out, compareHashes("queue entry", a.Queue, b.Queue)...)
	return append(out, compareHashes("clusterwide object", a.Objects, b.Objects)...)
}

// compareHashes compares named contents by their SHA-256.
func compareHashes(what string, a, b map[string][32]byte) []string {
	var out []string
	for _, k := range sortedKeys(a, b) {
		ha, aok := a[k]
		hb, bok := b[k]
		switch {
		case !bok:
			out = append(out, fmt.Sprintf("%s %s: missing at the destination", what, k))
		case !aok:
			out = append(out, fmt.Sprintf("%s %s: at the destination only", what, k))
		case ha != hb:
			out = append(out, fmt.Sprintf("%s %s: content differs", what, k))
		}
	}
	return out
}

func compareBox(what string, a, b *BoxDigest) []string {
	switch {
	case b == nil:
		return []string{what + ": missing at the destination"}
	case a == nil:
		return []string{what + ": at the destination only"}
	}
	var out []string
	if a.UIDValidity != b.UIDValidity {
		out = append(out, fmt.Sprintf("%s: UIDVALIDITY %d, destination %d", what, a.UIDValidity, b.UIDValidity))
	}
	if a.UIDNext != b.UIDNext || a.HighestModSeq != b.HighestModSeq {
		out = append(out, fmt.Sprintf("%s: UIDNEXT %d, HIGHESTMODSEQ %d; destination %d, %d", what, a.UIDNext, a.HighestModSeq,
			b.UIDNext, b.HighestModSeq))
	}
	if a.Subscribed != b.Subscribed {
		out = append(out, fmt.Sprintf("%s: subscribed %v, destination %v", what, a.Subscribed, b.Subscribed))
	}
	if len(a.Messages) != len(b.Messages) {
		out = append(out, fmt.Sprintf("%s: %d messages, destination %d", what, len(a.Messages), len(b.Messages)))
	}
	var diffs []string
	i, j := 0, 0
	for i < len(a.Messages) || j < len(b.Messages) {
		switch {
		case j == len(b.Messages) || (i < len(a.Messages) && a.Messages[i].UID < b.Messages[j].UID):
			diffs = append(diffs, fmt.Sprintf("%s uid %d: missing at the destination", what, a.Messages[i].UID))
			i++
		case i == len(a.Messages) || b.Messages[j].UID < a.Messages[i].UID:
			diffs = append(diffs, fmt.Sprintf("%s uid %d: at the destination only", what, b.Messages[j].UID))
			j++
		default:
			if d := compareMessage(a.Messages[i], b.Messages[j]); d != "" {
				diffs = append(diffs, fmt.Sprintf("%s uid %d: %s", what, a.Messages[i].UID, d))
			}
			i, j = i+1, j+1
		}
	}
	if len(diffs) > maxListed {
		diffs = append(diffs[:maxListed], fmt.Sprintf("%s: and %d more messages differ", what, len(diffs)-maxListed))
	}
	return append(out, diffs...)
}

func compareMessage(a, b MessageDigest) string {
	var d []string
	if a.Flags != b.Flags {
		d = append(d, fmt.Sprintf("flags (%s), destination (%s)", a.Flags, b.Flags))
	}
	if a.ModSeq != b.ModSeq {
		d = append(d, fmt.Sprintf("MODSEQ %d, destination %d", a.ModSeq, b.ModSeq))
	}
	if a.Date != b.Date {
		d = append(d, fmt.Sprintf("INTERNALDATE %d ms, destination %d ms", a.Date, b.Date))
	}
	if a.Size != b.Size {
		d = append(d, fmt.Sprintf("size %d, destination %d", a.Size, b.Size))
	}
	var zero [32]byte
	switch {
	case a.SHA256 == zero:
		d = append(d, "bytes unreadable at the source")
	case b.SHA256 == zero:
		d = append(d, "bytes unreadable at the destination")
	case a.SHA256 != b.SHA256:
		d = append(d, fmt.Sprintf("SHA-256 %x, destination %x", a.SHA256[:8], b.SHA256[:8]))
	}
	return strings.Join(d, "; ")
}

// sortedKeys returns the keys of both maps, once each, sorted.
func sortedKeys[V any](a, b map[string]V) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range []map[string]V{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

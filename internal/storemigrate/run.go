package storemigrate

// A whole `quill migrate`: open both sides, copy, verify.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/config"
)

// Options of a migration.
type Options struct {
	// VerifyOnly compares the two sides without copying.
	VerifyOnly bool
	// Progress returns what shows a step (verb "copy" or "verify") of
	// msgs messages and bytes bytes; nil shows nothing.
	Progress func(verb string, msgs int, bytes int64) Bar
	// Out hears the summaries.
	Out io.Writer
}

// Result is what a migration did and found.
type Result struct {
	Copied      Summary
	CopyTook    time.Duration
	Verified    int // messages compared
	VerifyTook  time.Duration
	Differences []string
}

// ErrDifferences says the verify pass found the sides differ.
var ErrDifferences = errors.New("the verify pass found differences")

// Run copies from one store to the other (one side a cassandra:// URL, the
// other data directories: several, comma-separated, to copy from a whole
// stopped cluster; one, new or empty, to copy into), then verifies. It
// returns ErrDifferences (wrapped) when the sides differ.
func Run(ctx context.Context, from, to string, o Options) (*Result, error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	res := &Result{}
	switch {
	case IsURL(from) == IsURL(to):
		return nil, fmt.Errorf("migrate from %q to %q: one side must be cassandra://..., the other data directories", from, to)
	case IsURL(to):
		return res, toCassandra(ctx, splitDirs(from), to, o, res)
	default:
		dirs := splitDirs(to)
		if len(dirs) != 1 {
			return nil, fmt.Errorf("--to %q: one data directory (a new node), not %d", to, len(dirs))
		}
		return res, fromCassandra(ctx, from, dirs[0], o, res)
	}
}

func splitDirs(s string) []string {
	var out []string
	for _, d := range strings.Split(s, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

func toCassandra(ctx context.Context, dirs []string, url string, o Options, res *Result) error {
	if len(dirs) == 0 {
		return errors.New("--from: no data directory")
	}
	src, err := OpenNative(dirs)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := OpenCassandra(ctx, url)
	if err != nil {
		return err
	}
	defer dst.Close()
	snap, err := src.Snapshot(ctx)
	if err != nil {
		return err
	}
	if !o.VerifyOnly {
		if err := copyStep(ctx, o, res, snap, func(p Progress) (Summary, error) {
			return CopyToCassandra(ctx, src, snap, dst, p)
		}); err != nil {
			return err
		}
	}
	return verifyStep(ctx, o, res, src, snap, dst)
}

func fromCassandra(ctx context.Context, url, dir string, o Options, res *Result) error {
	src, err := OpenCassandra(ctx, url)
	if err != nil {
		return err
	}
	defer src.Close()
	snap, err := src.Snapshot(ctx)
	if err != nil {
		return err
	}
	if !o.VerifyOnly {
		if err := copyStep(ctx, o, res, snap, func(p Progress) (Summary, error) {
			return CopyToNative(ctx, src, snap, dir, p)
		}); err != nil {
			return err
		}
	}
	dst, err := OpenNative([]string{dir})
	if err != nil {
		return err
	}
	defer dst.Close()
	return verifyStep(ctx, o, res, src, snap, dst)
}

// copyStep runs one copy with its progress and prints its summary.
func copyStep(ctx context.Context, o Options, res *Result, snap *Snapshot, copy func(Progress) (Summary, error)) error {
	_, msgs, bytes := snap.Count()
	p := o.progress("copy", msgs, bytes)
	start := time.Now()
	sum, err := copy(p)
	finish(p)
	res.Copied, res.CopyTook = sum, time.Since(start)
	fmt.Fprintf(o.Out, "copied %d users (%d deleted users' tombstones), %d mailboxes, %d messages (%s), %d expunged records deleted, %d queue entries, %d clusterwide objects in %s\n",
		sum.Users, sum.Deleted, sum.Mailboxes, sum.Messages, config.FormatSize(sum.Bytes), sum.Expunged, sum.Queue, sum.Objects,
		res.CopyTook.Round(time.Millisecond))
	return err
}

// verifyStep reads the destination again and compares it with the
// source's snapshot (a stopped node, or a keyspace nothing else writes,
// does not change under the copy), every message's bytes read from both.
func verifyStep(ctx context.Context, o Options, res *Result, src Source, snap *Snapshot, dst Source) error {
	start := time.Now()
	_, msgs, bytes := snap.Count()
	again, err := dst.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("verify: read %s: %w", dst.Name(), err)
	}
	p := o.progress("verify", 2*msgs, 2*bytes)
	a, err := DigestOf(ctx, src, snap, p)
	if err != nil {
		finish(p)
		return fmt.Errorf("verify: read %s: %w", src.Name(), err)
	}
	b, err := DigestOf(ctx, dst, again, p)
	finish(p)
	if err != nil {
		return fmt.Errorf("verify: read %s: %w", dst.Name(), err)
	}
	res.Differences, res.Verified, res.VerifyTook = Compare(a, b), msgs, time.Since(start)
	for _, d := range res.Differences {
		fmt.Fprintln(o.Out, "difference:", d)
	}
	fmt.Fprintf(o.Out, "verified %d users, %d messages (UID, flags, MODSEQ, INTERNALDATE, size, SHA-256) in %s: %d differences\n",
		len(a.Users), msgs, res.VerifyTook.Round(time.Millisecond), len(res.Differences))
	if len(res.Differences) > 0 {
		return fmt.Errorf("%s and %s: %w (%d)", src.Name(), dst.Name(), ErrDifferences, len(res.Differences))
	}
	return nil
}

// Bar is a Progress shown until Finish.
type Bar interface {
	Progress
	Finish()
}

func (o Options) progress(verb string, msgs int, bytes int64) Bar {
	if o.Progress == nil {
		return nil
	}
	return o.Progress(verb, msgs, bytes)
}

func finish(p Bar) {
	if p != nil {
		p.Finish()
	}
}

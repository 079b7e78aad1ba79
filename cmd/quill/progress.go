package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progressEvery is how many messages pass between the progress lines
// printed when standard error is not a terminal (a log, CI).
const progressEvery = 500

// progress shows a long copy on standard error: a bar of bytes on a
// terminal, else a line every progressEvery messages and at each folder.
type progress struct {
	verb       string
	bar        *progressbar.ProgressBar
	out        io.Writer
	total      int
	done       int
	bytes      int64
	folder     string
	lastLineAt int
}

func newProgress(verb string, totalMsgs int, totalBytes int64) *progress {
	p := &progress{verb: verb, total: totalMsgs, out: os.Stderr}
	if term.IsTerminal(int(os.Stderr.Fd())) && totalMsgs > 0 {
		p.bar = progressbar.NewOptions64(totalBytes,
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetWidth(30),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stderr) }),
		)
	}
	return p
}

// startFolder notes that the copy moved on to another folder.
func (p *progress) startFolder(name string, msgs int) {
	p.folder = name
	if msgs == 0 {
		return
	}
	if p.bar != nil {
		p.describe()
		return
	}
	fmt.Fprintf(p.out, "%s: %s: %d messages (%d of %d done)\n", p.verb, name, msgs, p.done, p.total)
}

func (p *progress) describe() {
	p.bar.Describe(fmt.Sprintf("%s %d/%d", p.folder, p.done, p.total))
}

// add counts one message of n bytes done (copied, or failed).
func (p *progress) add(n int64) {
	p.done++
	p.bytes += n
	if p.bar != nil {
		p.describe()
		p.bar.Add64(n)
		return
	}
	if p.done-p.lastLineAt >= progressEvery {
		p.lastLineAt = p.done
		fmt.Fprintf(p.out, "%s: %d of %d messages, %s\n", p.verb, p.done, p.total, humanBytes(p.bytes))
	}
}

// finish ends the bar.
func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}

// humanBytes writes a byte count for people.
func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// summary is what a copy did, printed at its end.
type summary struct {
	folders, copied, same, flagged, errors int
	bytes                                  int64
	start                                  time.Time
}

func (s *summary) print(w io.Writer, verb string, dryRun bool) {
	what, note := "copied", ""
	if dryRun {
		what, note = "to copy", " (dry run: nothing was changed)"
	}
	fmt.Fprintf(w, "%s: %d folders, %d messages %s (%s), %d already there, %d with flags brought up to date, %d errors, %s%s\n",
		verb, s.folders, s.copied, what, humanBytes(s.bytes), s.same, s.flagged, s.errors, time.Since(s.start).Round(time.Millisecond), note)
}

package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
)

// logFile is the node's log file, reopened on SIGHUP: logrotate renames
// the file and signals, and the next line goes to a new file of the same
// name (the copytruncate dance is not needed). Every write is one slog
// record, whole, under the lock.
type logFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// logFileMode keeps the log from other users: it names users, addresses
// and the remote addresses of their logins.
const logFileMode = 0o640

func openLogFile(path string) (*logFile, error) {
	l := &logFile{path: path}
	return l, l.Reopen()
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

// Reopen closes the file and opens path again (created if it was moved
// away). On failure the old file is kept, so no line is lost.
func (l *logFile) Reopen() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, logFileMode)
	if err != nil {
		return fmt.Errorf("log file %s: %w", l.path, err)
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// newLogger makes the node's logger: text (slog's key=value) or JSON, at
// the given level, to w.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

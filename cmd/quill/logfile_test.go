package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewLoggerFormatsAndLevels(t *testing.T) {
	var b bytes.Buffer
	l, err := newLogger(&b, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	if s := b.String(); strings.Contains(s, "hidden") || !strings.Contains(s, `"msg":"shown","k":1`) {
		t.Errorf("json at warn: %q", s)
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"text", "loud"}} {
		if _, err := newLogger(&b, bad[0], bad[1]); err == nil {
			t.Errorf("format %q level %q accepted", bad[0], bad[1])
		}
	}
}

// After the file is moved away, Reopen starts a new one of the same name;
// what was written before stays in the moved file.
func TestLogFileReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "quill.log")
	f, err := openLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("one\n"))
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("two\n")) // still the old file until the reopen
	if err := f.Reopen(); err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("three\n"))
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if string(old) != "one\ntwo\n" || string(cur) != "three\n" {
		t.Errorf("moved file %q, new file %q", old, cur)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != logFileMode {
		t.Errorf("mode %v, want %v", st.Mode().Perm(), os.FileMode(logFileMode))
	}
}

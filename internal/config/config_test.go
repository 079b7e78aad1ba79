package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type settings struct {
	Data    string        `flag:"data" help:"data directory"`
	Join    []string      `flag:"join" help:"nodes to join"`
	Max     int64         `flag:"max-message-size" help:"largest message"`
	Wait    time.Duration `flag:"replace-after" help:"wait"`
	Verbose bool          `flag:"verbose" help:"say more"`
	Other   string        // not a setting
}

func load(t *testing.T, file string, env map[string]string, args ...string) (settings, string, error) {
	t.Helper()
	s := settings{Data: "d0", Max: 10, Wait: time.Second}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	Bind(fs, &s)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	path := ""
	if file != "" {
		path = filepath.Join(t.TempDir(), "quill.toml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	note, err := Apply(fs, path, func(k string) string { return env[k] })
	return s, note, err
}

// Flags win over the environment, which wins over the file, which wins
// over the defaults; every kind of value reads from each.
func TestPrecedenceAndTypes(t *testing.T) {
	file := "data = \"d-file\"\njoin = [\"a:1\", \"b:2\"]\nmax-message-size = 30\nreplace-after = \"2m\"\nverbose = true\n"
	s, note, err := load(t, file, map[string]string{"QUILL_DATA": "d-env", "QUILL_MAX_MESSAGE_SIZE": "40"}, "--max-message-size", "50")
	if err != nil || note != "" {
		t.Fatal(err, note)
	}
	want := settings{Data: "d-env", Join: []string{"a:1", "b:2"}, Max: 50, Wait: 2 * time.Minute, Verbose: true}
	if s.Data != want.Data || strings.Join(s.Join, ",") != "a:1,b:2" || s.Max != 50 || s.Wait != want.Wait || !s.Verbose {
		t.Fatalf("got %+v, want %+v", s, want)
	}
	s, _, err = load(t, "", nil)
	if err != nil || s.Data != "d0" || s.Max != 10 {
		t.Fatalf("defaults: %+v %v", s, err)
	}
}

// Files of the old "key = value" form are still read, with a note; unknown
// keys and bad values are errors that name them.
func TestLegacyFilesAndErrors(t *testing.T) {
	s, note, err := load(t, "# old\ndata = /var/quill\nreplace-after = 30s\n", nil)
	if err != nil || s.Data != "/var/quill" || s.Wait != 30*time.Second || !strings.Contains(note, "old key = value form") {
		t.Fatalf("legacy: %+v %q %v", s, note, err)
	}
	// The old reader took quotes off; a file that quotes some values and
	// not others is not TOML but must read as before.
	s, _, err = load(t, "data = \"/var/lib/quill\"\nreplace-after = 30s\n", nil)
	if err != nil || s.Data != "/var/lib/quill" {
		t.Fatalf("legacy with a quoted value: data %q, err %v", s.Data, err)
	}
	if _, _, err := load(t, "nosuch = 1\n", nil); err == nil || !strings.Contains(err.Error(), `unknown key "nosuch"`) {
		t.Fatalf("unknown key: %v", err)
	}
	if _, _, err := load(t, "", map[string]string{"QUILL_REPLACE_AFTER": "soon"}); err == nil || !strings.Contains(err.Error(), "QUILL_REPLACE_AFTER") {
		t.Fatalf("bad value: %v", err)
	}
}

// The reference names every setting with its environment variable, type
// and default.
func TestMarkdownListsEverySetting(t *testing.T) {
	s := settings{Data: "d0", Max: 10, Wait: time.Second}
	md := Markdown(&s)
	for _, want := range []string{"`data` | `QUILL_DATA` | string | `d0`", "`join` | `QUILL_JOIN` | list | (none)",
		"`replace-after` | `QUILL_REPLACE_AFTER` | duration | `1s`"} {
		if !strings.Contains(md, want) {
			t.Errorf("reference lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "Other") {
		t.Error("an untagged field is in the reference")
	}
}

func TestFormatSizeExactReadsBack(t *testing.T) {
	for _, n := range []int64{1, 1000, 1024, 1536, 1 << 30, 1342177280, 1000000000, 5 << 40} {
		s := FormatSizeExact(n)
		if got, err := ParseSize(s); err != nil || got != n {
			t.Errorf("%d written as %q reads back as %d, %v", n, s, got, err)
		}
	}
	if s := FormatSizeExact(2 << 30); s != "2G" {
		t.Errorf("2 GiB written as %q", s)
	}
}

// Package config fills a settings struct from the places an operator sets
// things, in order of precedence: command-line flags, QUILL_* environment
// variables, a TOML file, then the defaults the struct came with. Each
// field names its flag and says what it does in struct tags, so the flags,
// the environment variables, the file's keys and the reference table
// (docs/configuration.md, `quill config reference`) come from one
// definition and cannot disagree.
//
// Tags: `flag:"name"` (the flag, the file key, and QUILL_NAME in the
// environment), `help:"..."`, and `doc:"..."` to describe the default in
// the reference where the value itself depends on the machine.
package config

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"
)

// EnvPrefix starts every environment variable of a setting.
const EnvPrefix = "QUILL_"

// EnvName returns the environment variable of a flag: QUILL_ and the flag
// in upper case with '-' as '_'.
func EnvName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Field is one setting.
type Field struct {
	Flag, Help, Doc string
	Type            string
	Default         string
}

// Fields lists the settings of the struct cfg points to.
func Fields(cfg any) []Field {
	v := reflect.ValueOf(cfg).Elem()
	t := v.Type()
	var out []Field
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := f.Tag.Get("flag")
		if name == "" {
			continue
		}
		fv := v.Field(i)
		def := ""
		switch x := fv.Interface().(type) {
		case []string:
			def = strings.Join(x, ",")
		case time.Duration:
			def = x.String()
		default:
			def = fmt.Sprint(x)
		}
		out = append(out, Field{Flag: name, Help: f.Tag.Get("help"), Doc: f.Tag.Get("doc"), Type: typeName(fv.Type()), Default: def})
	}
	return out
}

func typeName(t reflect.Type) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		return "duration"
	case reflect.TypeOf([]string(nil)):
		return "list"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int64:
		return "integer"
	case reflect.Bool:
		return "boolean"
	}
	return "string"
}

// Bind registers a flag for every setting of the struct cfg points to; the
// flags write straight into it, starting from its current values.
func Bind(fs *pflag.FlagSet, cfg any) {
	v := reflect.ValueOf(cfg).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := f.Tag.Get("flag")
		if name == "" {
			continue
		}
		help := f.Tag.Get("help") + " (" + EnvName(name) + ")"
		switch p := v.Field(i).Addr().Interface().(type) {
		case *string:
			fs.StringVar(p, name, *p, help)
		case *[]string:
			fs.StringSliceVar(p, name, *p, help)
		case *int:
			fs.IntVar(p, name, *p, help)
		case *int64:
			fs.Int64Var(p, name, *p, help)
		case *bool:
			fs.BoolVar(p, name, *p, help)
		case *time.Duration:
			fs.DurationVar(p, name, *p, help)
		default:
			panic(fmt.Sprintf("config: setting %s has a type flags cannot carry: %T", name, p))
		}
	}
}

// Apply sets every flag of fs not given on the command line from the
// environment (getenv, EnvName), or else from the config file at path (if
// not empty). It returns a note for the log when the file is in the old
// "key = value" form, which is still read.
func Apply(fs *pflag.FlagSet, path string, getenv func(string) string) (note string, err error) {
	file := map[string]string{}
	if path != "" {
		var legacy bool
		if file, legacy, err = readFile(path); err != nil {
			return "", err
		}
		if legacy {
			note = fmt.Sprintf("config %s is in the old key = value form; it is read, but TOML (strings quoted) is the format now: docs/configuration.md", path)
		}
		for k := range file {
			if fs.Lookup(k) == nil || k == "config" {
				return "", fmt.Errorf("config %s: unknown key %q", path, k)
			}
		}
	}
	var errs []string
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Changed || fl.Name == "config" {
			return
		}
		src, val := "", ""
		if v := getenv(EnvName(fl.Name)); v != "" {
			src, val = EnvName(fl.Name), v
		} else if v, ok := file[fl.Name]; ok {
			src, val = path+": "+fl.Name, v
		} else {
			return
		}
		if err := fs.Set(fl.Name, val); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", src, err))
		}
	})
	if len(errs) > 0 {
		return note, fmt.Errorf("config: %s", strings.Join(errs, "; "))
	}
	return note, nil
}

// readFile reads a TOML file into flag values; a file that is not TOML but
// is in the old form of "key = value" lines ('#' comments) is read as that.
func readFile(path string) (map[string]string, bool, error) {
	var raw map[string]any
	_, terr := toml.DecodeFile(path, &raw)
	if terr == nil {
		out := map[string]string{}
		for k, v := range raw {
			s, err := flagValue(v)
			if err != nil {
				return nil, false, fmt.Errorf("config %s: %s: %w", path, k, err)
			}
			out[k] = s
		}
		return out, false, nil
	}
	out, err := readLegacy(path)
	if err != nil {
		return nil, false, fmt.Errorf("config %s: not TOML (%v), nor key = value lines (%v)", path, terr, err)
	}
	return out, true, nil
}

func flagValue(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case int64, bool, float64:
		return fmt.Sprint(x), nil
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			s, ok := e.(string)
			if !ok {
				return "", fmt.Errorf("a list of strings expected")
			}
			parts[i] = s
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("a %T cannot be a setting", v)
}

func readLegacy(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = strings.TrimSpace(text[:i])
		}
		if text == "" {
			continue
		}
		k, v, ok := strings.Cut(text, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: want key = value", line)
		}
		// The old reader took quotes off values; files written for it may
		// quote some values and not others.
		out[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
	}
	return out, sc.Err()
}

// Markdown returns the reference table of the settings of cfg, with their
// default values (or their doc tag).
func Markdown(cfg any) string {
	fields := Fields(cfg)
	var b strings.Builder
	b.WriteString("| setting (flag, file key) | environment | type | default | meaning |\n|---|---|---|---|---|\n")
	for _, f := range fields {
		def := f.Default
		if f.Doc != "" {
			def = f.Doc
		}
		if def == "" {
			def = "(none)"
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s | %s |\n", f.Flag, EnvName(f.Flag), f.Type, def, f.Help)
	}
	return b.String()
}

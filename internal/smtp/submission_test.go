package smtp

import (
	"errors"
	"strings"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

func TestSubmissionHeaders(t *testing.T) {
	now := time.Date(2026, 11, 24, 2, 0, 0, 0, time.UTC)
	const user = "alice@example.org"
	for _, tc := range []struct {
		name, msg string
		code      int    // 0: accepted
		adds      string // headers expected to be added
	}{
		{"complete", "From: Alice <alice@example.org>\r\nDate: Mon, 23 Nov 2026 10:00:00 +0000\r\nMessage-ID: <x@y>\r\n\r\nhi\r\n", 0, ""},
		{"adds Date and Message-ID", "From: alice@EXAMPLE.org\r\nSubject: s\r\n\r\nhi\r\n", 0, "Date: Tue, 24 Nov 2026 02:00:00 +0000\r\nMessage-ID: <"},
		{"someone else's From", "From: bob@example.org\r\n\r\nhi\r\n", 553, ""},
		{"two authors, one not the user", "From: alice@example.org, mallory@example.org\r\n\r\nhi\r\n", 553, ""},
		{"no From", "Subject: s\r\n\r\nhi\r\n", 554, ""},
		{"unparsable From", "From: <<<\r\n\r\nhi\r\n", 554, ""},
		{"no header at all", "just text without a colon\r\n", 554, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := SubmissionHeaders([]byte(tc.msg), user, "mail.example.org", now)
			var se *gosmtp.SMTPError
			switch {
			case tc.code != 0:
				if !errors.As(err, &se) || se.Code != tc.code {
					t.Fatalf("err %v, want SMTP %d", err, tc.code)
				}
			case err != nil:
				t.Fatal(err)
			case !strings.HasSuffix(string(out), tc.msg):
				t.Fatalf("message changed: %q", out)
			case !strings.HasPrefix(string(out), tc.adds):
				t.Fatalf("added %q, want prefix %q", strings.TrimSuffix(string(out), tc.msg), tc.adds)
			case tc.adds != "" && !strings.Contains(string(out), "@mail.example.org>\r\n"):
				t.Fatalf("Message-ID not on the host: %q", out)
			}
		})
	}
}

package imap

import "testing"

// Edge cases after Dovecot's imaptest fetch-body script.
func TestFetchSectionsEdgeCases(t *testing.T) {
	e := newEnv(t)
	e.deliver("From: User1 <user1@domain.org>\r\nDate: Sat, 24 Mar 2007 23:00:00 +0200\r\nSubject: s1\r\n\r\nbody1\r\n\r\n")
	r := e.raw(true)
	r.ok("SELECT INBOX")
	for cmd, want := range map[string]string{
		"FETCH 1 BODY.PEEK[HEADER.FIELDS (FROM)]":         "BODY[HEADER.FIELDS (\"FROM\")] {34}\r\nFrom: User1 <user1@domain.org>\r\n\r\n)",
		"FETCH 1 BODY.PEEK[HEADER.FIELDS (xyz)]":          "BODY[HEADER.FIELDS (\"xyz\")] {2}\r\n\r\n)",
		"FETCH 1 BODY.PEEK[HEADER.FIELDS.NOT (date)]":     "{47}\r\nFrom: User1 <user1@domain.org>\r\nSubject: s1\r\n\r\n)",
		"FETCH 1 BODY.PEEK[TEXT]<3.3>":                    "BODY[TEXT]<3> {3}\r\ny1\r",
		"FETCH 1 BODY.PEEK[TEXT]<100.3>":                  "BODY[TEXT]<100> {0}\r\n)",
		"FETCH 1 RFC822.HEADER":                           "RFC822.HEADER {",
		"FETCH 1 (FLAGS BODY.PEEK[1])":                    "BODY[1] {9}\r\nbody1\r\n\r\n)",
		"FETCH 1 FAST":                                    "RFC822.SIZE 95",
		"FETCH 1 RFC822.TEXT":                             `FLAGS (\Seen \Recent)`,
		"UID FETCH 1 (BODY.PEEK[HEADER] BODY.PEEK[TEXT])": "UID 1",
	} {
		u := r.ok(cmd)
		if !has(u, want) {
			t.Errorf("%s:\n got %q\nwant %q", cmd, u, want)
		}
	}
}

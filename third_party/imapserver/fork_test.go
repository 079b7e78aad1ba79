package imapserver

// Tests of the changes the fork makes to upstream beta.8 (QUILL.md, table
// "Defects of upstream beta.8 and what the copy changes"): each test talks
// raw IMAP to a real server on 127.0.0.1 and names the row it covers.

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
)

// QUILL.md row 1: SELECT (CONDSTORE) is parsed and reaches the session, and
// every SELECT/EXAMINE reports * OK [HIGHESTMODSEQ n].
func TestCondStoreSelectReportsHighestModSeq(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.expectCmd("a", "SELECT INBOX (CONDSTORE)",
		"* 3 EXISTS",
		"* 0 RECENT",
		"* OK [UNSEEN 2] First unseen message",
		"* OK [UIDVALIDITY 1] UIDs valid",
		"* OK [UIDNEXT 13] Predicted next UID",
		"* OK [HIGHESTMODSEQ 7] Highest",
		`* FLAGS (\Answered \Flagged \Deleted \Seen \Draft)`,
		`* OK [PERMANENTFLAGS (\Answered \Flagged \Deleted \Seen \Draft \*)] Permanent flags`,
		"a OK [READ-WRITE] SELECT completed",
	)
	// Without the parameter, the server still reports HIGHESTMODSEQ.
	got := c.cmd("b", "EXAMINE INBOX")
	if !slices.Contains(got, "* OK [HIGHESTMODSEQ 7] Highest") || got[len(got)-1] != "b OK [READ-ONLY] EXAMINE completed" {
		t.Fatalf("EXAMINE: %q", got)
	}
	c.expectCmd("c", "SELECT INBOX (BOGUS)", "c BAD [CLIENTBUG] Unknown SELECT parameter BOGUS")

	ts.backend.mu.Lock()
	defer ts.backend.mu.Unlock()
	want := []imap.SelectOptions{{CondStore: true}, {ReadOnly: true}}
	if !slices.Equal(ts.backend.selectOpts, want) {
		t.Fatalf("session saw select options %+v, want %+v", ts.backend.selectOpts, want)
	}
}

// QUILL.md row 1: FETCH's MODSEQ item and the (CHANGEDSINCE n) modifier,
// which implies MODSEQ.
func TestCondStoreFetchModSeqAndChangedSince(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", "FETCH 1 (MODSEQ)",
		"* 1 FETCH (MODSEQ (3))",
		"a OK FETCH completed",
	)
	c.expectCmd("b", "FETCH 1:* (FLAGS) (CHANGEDSINCE 4)",
		"* 2 FETCH (FLAGS () MODSEQ (5))",
		`* 3 FETCH (FLAGS (\Flagged) MODSEQ (7))`,
		"b OK FETCH completed",
	)
	c.expectCmd("c", "UID FETCH 10:* (FLAGS) (CHANGEDSINCE 6)",
		`* 3 FETCH (UID 12 FLAGS (\Flagged) MODSEQ (7))`,
		"c OK UID FETCH completed",
	)
	c.expectCmd("d", "FETCH 1 (FLAGS) (CHANGEDSINCE 9223372036854775808)",
		"d BAD [CLIENTBUG] CHANGEDSINCE value out of range",
	)
}

// QUILL.md row 1: STATUS (HIGHESTMODSEQ) is answered, and as a
// CONDSTORE-enabling command it makes later STORE responses carry MODSEQ.
func TestCondStoreStatusHighestModSeqEnablesCondStore(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", `STORE 2 +FLAGS (\Answered)`,
		`* 2 FETCH (FLAGS (\Answered))`,
		"a OK STORE completed",
	)
	c.expectCmd("b", "STATUS INBOX (MESSAGES HIGHESTMODSEQ)",
		"* STATUS INBOX (MESSAGES 3 HIGHESTMODSEQ 8)",
		"b OK STATUS completed",
	)
	c.expectCmd("c", `STORE 2 -FLAGS (\Answered)`,
		"* 2 FETCH (FLAGS () MODSEQ (9))",
		"c OK STORE completed",
	)
}

// QUILL.md row 1: SEARCH MODSEQ is parsed and its answer carries (MODSEQ n).
func TestCondStoreSearchModSeq(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", "SEARCH MODSEQ 4",
		"* SEARCH 2 3 (MODSEQ 7)",
		"a OK SEARCH completed",
	)
	c.expectCmd("b", `UID SEARCH MODSEQ "/flags/\\Seen" all 6`,
		"* SEARCH 12 (MODSEQ 7)",
		"b OK UID SEARCH completed",
	)
	c.expectCmd("c", "SEARCH ALL",
		"* SEARCH 1 2 3",
		"c OK SEARCH completed",
	)
}

// QUILL.md row 1: ENABLE CONDSTORE answers ENABLED CONDSTORE when the
// server has the capability, and enables nothing when it does not.
func TestCondStoreEnable(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", "ENABLE CONDSTORE",
		"* ENABLED CONDSTORE",
		"a OK ENABLE completed",
	)
	// Enabled: STORE responses now carry MODSEQ.
	c.expectCmd("b", `STORE 1 +FLAGS (\Answered)`,
		`* 1 FETCH (FLAGS (\Seen \Answered) MODSEQ (8))`,
		"b OK STORE completed",
	)

	plain := newTestServer(t, func(o *Options) { delete(o.Caps, imap.CapCondStore) })
	c = plain.login()
	c.expectCmd("a", "ENABLE CONDSTORE",
		"* ENABLED",
		"a OK ENABLE completed",
	)
}

// QUILL.md row 1: STORE (UNCHANGEDSINCE 0) reaches the session as
// UnchangedSinceZero, so it fails for every message.
func TestCondStoreUnchangedSinceZeroFailsEveryMessage(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", `STORE 1:* (UNCHANGEDSINCE 0) +FLAGS (\Deleted)`,
		"a OK [MODIFIED 1:3] Conditional STORE failed for some messages",
	)
	c.expectCmd("b", "FETCH 1:* (FLAGS MODSEQ)",
		`* 1 FETCH (FLAGS (\Seen) MODSEQ (3))`,
		"* 2 FETCH (FLAGS () MODSEQ (5))",
		`* 3 FETCH (FLAGS (\Flagged) MODSEQ (7))`,
		"b OK FETCH completed",
	)
}

// QUILL.md row 2: ID is answered before login (atoms as well as strings, and
// NIL), hands the client's fields to the session, and the session goes on.
func TestIDBeforeLogin(t *testing.T) {
	ts := newTestServer(t, func(o *Options) { o.ServerID = []string{"name", "Quill", "version", ""} })
	c, _ := ts.dial()
	c.expectCmd("a", `ID ("name" "Thunderbird" "version" NIL)`,
		`* ID ("name" "Quill" "version" NIL)`,
		"a OK ID completed",
	)
	c.expectCmd("b", "ID (name imaplib2 version 2.57)",
		`* ID ("name" "Quill" "version" NIL)`,
		"b OK ID completed",
	)
	c.expectCmd("c", "ID NIL",
		`* ID ("name" "Quill" "version" NIL)`,
		"c OK ID completed",
	)
	lines := c.cmd("d", "LOGIN alice secret")
	if !strings.HasPrefix(lines[len(lines)-1], "d OK ") {
		t.Fatalf("LOGIN after ID: %q", lines)
	}

	ts.backend.mu.Lock()
	got := ts.backend.clientIDs
	ts.backend.mu.Unlock()
	want := [][]string{{"name", "Thunderbird", "version", ""}, {"name", "imaplib2", "version", "2.57"}, nil}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("session got client IDs %q, want %q", got, want)
	}

	// Without Options.ServerID the answer is NIL.
	bare := newTestServer(t, nil)
	c, _ = bare.dial()
	c.expectCmd("a", `ID ("name" "x")`, "* ID NIL", "a OK ID completed")
}

// QUILL.md row 3: an empty or malformed command line is answered * BAD and
// the session goes on (before and after login).
func TestMalformedCommandLineAnsweredBAD(t *testing.T) {
	ts := newTestServer(t, nil)
	c, _ := ts.dial()
	c.send("")
	c.expect("* BAD Missing or malformed command tag or name")
	c.send("((( NOOP")
	c.expect("* BAD Missing or malformed command tag or name")
	c.send("a")
	c.expect("* BAD Missing or malformed command tag or name")
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
	c.expectCmd("c", "LOGIN alice secret",
		"c OK [CAPABILITY IMAP4rev1 SASL-IR LITERAL+ ID UNSELECT ENABLE IDLE UTF8=ACCEPT CONDSTORE] Logged in")
	c.send("\t")
	c.expect("* BAD Missing or malformed command tag or name")
	c.expectCmd("d", "NOOP", "d OK NOOP completed")
}

// QUILL.md row 3: "tag UID" without a sub-command is malformed too, and is
// answered a tagged BAD instead of closing the connection without a response.
func TestMalformedUIDCommandAnsweredBAD(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.send("a UID")
	if line := c.readLine(); !strings.HasPrefix(line, "a BAD ") {
		t.Fatalf("got %q, want a BAD", line)
	}
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
	c.expectCmd("c", "UID (", "c BAD [CLIENTBUG] Missing or malformed command name after UID")
	c.expectCmd("d", "NOOP", "d OK NOOP completed")
}

// QUILL.md row 4: a command line over the 50 KiB limit gets BYE and the
// connection is closed, so the rest of the line is never read as commands.
func TestOverlongCommandLineByeAndClose(t *testing.T) {
	ts := newTestServer(t, nil)
	c, _ := ts.dial()
	// The overflow is in LOGIN's first argument; what follows the limit
	// would be a command of its own if the server read on.
	c.write("a LOGIN " + strings.Repeat("x", maxCommandSize) + "\r\nb CAPABILITY\r\n")
	c.expect("* BYE Command line too long")
	c.expectClosed()
}

// QUILL.md row 4: when the parse fails before the limit (NOOP expects
// CRLF; a malformed tag), the line is still over the limit: the server says
// BYE and closes rather than answering BAD and reading the rest of the line
// as new commands.
func TestOverlongCommandLineAfterSyntaxErrorByeAndClose(t *testing.T) {
	for _, start := range []string{"a NOOP ", "((( "} {
		ts := newTestServer(t, nil)
		c, _ := ts.dial()
		// One line: the server reads maxCommandSize+2 bytes of it (one
		// more than the limit, and one for the byte Decoder.EOF unread
		// before the count began), so what follows them ("b CAPABILITY")
		// would run as a command of its own.
		prefix := start + strings.Repeat("x", maxCommandSize+2-len(start))
		c.write(prefix + "b CAPABILITY\r\n")
		if line := c.readLine(); line != "* BYE Command line too long" {
			var more []string
			for i := 0; i < 3; i++ {
				l, err := c.tryReadLine()
				if err != nil {
					break
				}
				more = append(more, l)
			}
			t.Fatalf("%q...: got %q then %q, want * BYE Command line too long", start, line, more)
		}
		c.expectClosed()
	}
}

// QUILL.md row 5: a refused non-synchronizing literal (LITERAL+) is read
// and dropped, not run as commands, and the refusal is NO [TOOBIG].
func TestRefusedNonSyncLiteralSkippedWithTooBig(t *testing.T) {
	ts := newTestServer(t, nil)
	c, _ := ts.dial()
	// 70000 bytes, over maxBufferedLiteral, made of command lines.
	lit := strings.Repeat("z NOOP\r\n", 70000/8)
	c.write("a LOGIN {70000+}\r\n" + lit + " secret\r\n")
	c.expect("a NO [TOOBIG] Literals are limited to 65536 bytes for this command")
	// The next line is the answer to b, not to a z of the literal.
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
	// A small non-synchronizing literal before login is accepted.
	lines := c.cmd("c", "LOGIN {5+}\r\nalice secret")
	if got := lines[len(lines)-1]; !strings.HasPrefix(got, "c OK ") {
		t.Fatalf("LOGIN with LITERAL+: %q", lines)
	}
}

// QUILL.md row 5: a refused synchronizing literal in an astring (LOGIN,
// mailbox names) is answered at once, and ends the command: the client,
// which waits for "+" or the answer, sends neither the literal nor the rest
// of the command.
func TestRefusedSyncLiteralAnsweredTooBig(t *testing.T) {
	ts := newTestServer(t, nil)
	c, _ := ts.dial()
	c.send("a LOGIN {70000}")
	c.expect("a NO [TOOBIG] Literals are limited to 65536 bytes for this command")
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
	c.expectCmd("c", "LOGIN alice secret",
		"c OK [CAPABILITY IMAP4rev1 SASL-IR LITERAL+ ID UNSELECT ENABLE IDLE UTF8=ACCEPT CONDSTORE] Logged in")
	// A mailbox name, the second argument of its command.
	c.send("d RENAME INBOX {70000}")
	c.expect("d NO [TOOBIG] Literals are limited to 65536 bytes for this command")
	c.expectCmd("e", "NOOP", "e OK NOOP completed")
}

// QUILL.md row 5: an APPEND literal over the APPEND limit is read and
// dropped when it is non-synchronizing (upstream ran its lines as commands),
// and answered at once when it is synchronizing.
func TestRefusedAppendLiteralSkipped(t *testing.T) {
	ts := newAppendLimitServer(t, 100)
	c := ts.login()
	lit := strings.Repeat("z NOOP\r\n", 200/8)
	c.write("a APPEND INBOX {200+}\r\n" + lit + "\r\n")
	c.expect("a NO [TOOBIG] Literals are limited to 100 bytes for this command")
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
	c.send("c APPEND INBOX {200}")
	c.expect("c NO [TOOBIG] Literals are limited to 100 bytes for this command")
	c.expectCmd("d", "NOOP", "d OK NOOP completed")
	if n := ts.numMessages(); n != 3 {
		t.Fatalf("%d messages after refused APPENDs, want 3", n)
	}

	// Cut short, the refused literal ends the connection.
	c = ts.login()
	c.write("a APPEND INBOX {200+}\r\n" + lit[:50])
	if err := c.conn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.expect("a NO [TOOBIG] Literals are limited to 100 bytes for this command")
	c.expectClosed()
}

// QUILL.md row 6: a malformed sequence set and an unknown SEARCH key are the
// client's error, BAD [CLIENTBUG], not NO [SERVERBUG].
func TestClientErrorsAreBADClientBug(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", "FETCH 1:x FLAGS",
		`a BAD [CLIENTBUG] Syntax error: imap: bad number set value "1:x"`)
	c.expectCmd("b", "UID STORE 0 +FLAGS (\\Seen)",
		`b BAD [CLIENTBUG] Syntax error: imap: bad number set value "0"`)
	c.expectCmd("c", "SEARCH FOO",
		"c BAD [CLIENTBUG] Unknown search key or bad sequence set: FOO")
	c.expectCmd("d", "SEARCH NOT (BAR 1)",
		"d BAD [CLIENTBUG] Unknown search key or bad sequence set: BAR")
	c.expectCmd("e", "SEARCH 2:3",
		"* SEARCH 2 3",
		"e OK SEARCH completed")
}

// QUILL.md row 7: LITERAL+ is advertised before login (instead of LITERAL-),
// CONDSTORE after it.
func TestCapabilitiesAdvertiseLiteralPlusAndCondStore(t *testing.T) {
	ts := newTestServer(t, nil)
	c, greeting := ts.dial()
	if want := "* OK [CAPABILITY IMAP4rev1 SASL-IR LITERAL+ ID ENABLE AUTH=PLAIN] IMAP server ready"; greeting != want {
		t.Fatalf("greeting:\n got %q\nwant %q", greeting, want)
	}
	c.expectCmd("a", "CAPABILITY",
		"* CAPABILITY IMAP4rev1 SASL-IR LITERAL+ ID ENABLE AUTH=PLAIN",
		"a OK CAPABILITY completed")
	c.expectCmd("b", "LOGIN alice secret",
		"b OK [CAPABILITY IMAP4rev1 SASL-IR LITERAL+ ID UNSELECT ENABLE IDLE UTF8=ACCEPT CONDSTORE] Logged in")
	c.expectCmd("c", "CAPABILITY",
		"* CAPABILITY IMAP4rev1 SASL-IR LITERAL+ ID UNSELECT ENABLE IDLE UTF8=ACCEPT CONDSTORE",
		"c OK CAPABILITY completed")

	// Without LITERAL+ in Options.Caps, LITERAL- is advertised.
	minus := newTestServer(t, func(o *Options) { delete(o.Caps, imap.CapLiteralPlus) })
	_, greeting = minus.dial()
	if want := "* OK [CAPABILITY IMAP4rev1 SASL-IR LITERAL- ID ENABLE AUTH=PLAIN] IMAP server ready"; greeting != want {
		t.Fatalf("greeting without LITERAL+:\n got %q\nwant %q", greeting, want)
	}
}

// QUILL.md row 8: IDLE ends with DONE in any case; anything else is BAD.
func TestIdleEndsWithCaseInsensitiveDone(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	for i, done := range []string{"done", "DoNe", "DONE"} {
		tag := string(rune('a' + i))
		c.send(tag + " IDLE")
		c.expect("+ idling")
		c.send(done)
		c.expect(tag + " OK IDLE completed")
	}
	c.send("x IDLE")
	c.expect("+ idling")
	c.send("stop")
	c.expect("x BAD [CLIENTBUG] Syntax error: expected DONE to end IDLE command")
	c.expectCmd("y", "NOOP", "y OK NOOP completed")
}

// QUILL.md row 9: APPEND whose literal is not followed by CRLF gets a
// response (BAD), and the session goes on.
func TestAppendWithoutCRLFAfterLiteralAnswered(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.write("a APPEND INBOX {5+}\r\nhelloXYZ\r\n")
	got := c.readLine()
	if got != `a BAD [CLIENTBUG] Syntax error: expected CRLF, got "X"` && got != "a BAD [CLIENTBUG] Syntax error: expected CRLF" {
		t.Fatalf("APPEND without CRLF: got %q", got)
	}
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
}

// QUILL.md row 9: the APPEND answered BAD above stores nothing: the end of
// the command is checked when Session.Append reads the literal's end (so a
// client that retries after the BAD does not get the message twice). Same
// for a UTF8 literal without its ")".
func TestAppendWithoutCRLFStoresNothing(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.write("a APPEND INBOX {5+}\r\nhelloXYZ\r\n")
	c.readLine()
	c.expectCmd("b", "STATUS INBOX (MESSAGES)", "* STATUS INBOX (MESSAGES 3)", "b OK STATUS completed")
	c.write("c APPEND INBOX UTF8 (~{5+}\r\nhello\r\n")
	c.expect(`c BAD [CLIENTBUG] Syntax error: expected ')', got "\r"`)
	c.expectCmd("d", "STATUS INBOX (MESSAGES)", "* STATUS INBOX (MESSAGES 3)", "d OK STATUS completed")
	// Well-formed, both are stored.
	c.write("e APPEND INBOX UTF8 (~{5+}\r\nhello)\r\n")
	c.expect("e OK [APPENDUID 1 13] APPEND completed")
	c.write("f APPEND INBOX {5+}\r\nhello\r\n")
	c.expect("f OK [APPENDUID 1 14] APPEND completed")
}

// QUILL.md row 9: APPEND whose literal is cut short (the client half-closes)
// is answered NO with the cause instead of nothing.
func TestAppendTruncatedLiteralAnswered(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.send("a APPEND INBOX {10}")
	c.expect("+ Ready for literal data")
	c.write("hello")
	if err := c.conn.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.expect("a NO [SERVERBUG] APPEND failed (reference R)")
	if !ts.logger.logged("unexpected EOF") {
		t.Error("the cause of the failed APPEND is not in the log")
	}
	c.expectClosed()
	// The session read io.ErrUnexpectedEOF, not a short message. (row 9)
	if n := ts.numMessages(); n != 3 {
		t.Fatalf("%d messages after a cut APPEND, want 3", n)
	}
}

// QUILL.md row 10: after maxBadCommands consecutive BAD answers the server
// says BYE and closes; a good command resets the count.
func TestTooManyBadCommandsBye(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	bad := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			c.expectCmd("x", "BOGUS", "x BAD Unknown command")
		}
	}
	bad(maxBadCommands - 1)
	c.expectCmd("ok", "NOOP", "ok OK NOOP completed") // resets the count
	bad(maxBadCommands - 1)
	c.send("x BOGUS")
	c.expect("x BAD Unknown command", "* BYE Too many bad commands")
	c.expectClosed()
}

// QUILL.md row 10: malformed lines count as BAD commands too.
func TestTooManyMalformedLinesBye(t *testing.T) {
	ts := newTestServer(t, nil)
	c, _ := ts.dial()
	for i := 0; i < maxBadCommands-1; i++ {
		c.send("")
		c.expect("* BAD Missing or malformed command tag or name")
	}
	c.send("")
	c.expect("* BAD Missing or malformed command tag or name", "* BYE Too many bad commands")
	c.expectClosed()
}

// QUILL.md row 11: STORE's tagged OK carries [MODIFIED set] (sequence
// numbers, or UIDs for UID STORE), written after the poll's updates.
func TestStoreUnchangedSinceReportsModified(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", `STORE 1:3 (UNCHANGEDSINCE 5) +FLAGS (\Answered)`,
		`* 1 FETCH (FLAGS (\Seen \Answered) MODSEQ (8))`,
		`* 2 FETCH (FLAGS (\Answered) MODSEQ (9))`,
		"a OK [MODIFIED 3] Conditional STORE failed for some messages",
	)

	// Another connection appends; the poll after STORE reports it before
	// the tagged response.
	other := ts.login()
	other.write("p APPEND INBOX {5+}\r\nhello\r\n")
	other.expect("p OK [APPENDUID 1 13] APPEND completed")

	c.expectCmd("b", `UID STORE 10:12 (UNCHANGEDSINCE 8) -FLAGS (\Answered)`,
		`* 1 FETCH (UID 10 FLAGS (\Seen) MODSEQ (11))`,
		`* 3 FETCH (UID 12 FLAGS (\Flagged) MODSEQ (12))`,
		"* 4 EXISTS",
		"b OK [MODIFIED 11] Conditional STORE failed for some messages",
	)
	c.expectCmd("c", `STORE 2 (UNCHANGEDSINCE 9) FLAGS (\Seen)`,
		`* 2 FETCH (FLAGS (\Seen) MODSEQ (13))`,
		"c OK STORE completed",
	)
}

// QUILL.md row 12: CLOSE gives the session a silent ExpungeWriter: it
// expunges without untagged EXPUNGE responses, and a read-only CLOSE can
// expunge nothing while EXPUNGE says NO.
func TestCloseExpungesSilently(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", `STORE 2 +FLAGS.SILENT (\Deleted)`, "a OK STORE completed")
	c.expectCmd("b", "CLOSE", "b OK CLOSE completed")
	got := c.cmd("c", "SELECT INBOX")
	if got[0] != "* 2 EXISTS" {
		t.Fatalf("SELECT after CLOSE: %q, want 2 messages left", got)
	}
	// EXPUNGE, unlike CLOSE, reports what it removed.
	c.expectCmd("d", `STORE 1 +FLAGS.SILENT (\Deleted)`, "d OK STORE completed")
	c.expectCmd("e", "EXPUNGE", "* 1 EXPUNGE", "e OK EXPUNGE completed")
}

// QUILL.md row 12: in a read-only mailbox EXPUNGE is refused while CLOSE
// succeeds and expunges nothing.
func TestReadOnlyCloseExpungesNothing(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.selectInbox()
	c.expectCmd("a", `STORE 2 +FLAGS.SILENT (\Deleted)`, "a OK STORE completed")
	got := c.cmd("b", "EXAMINE INBOX")
	if got[0] != "* OK [CLOSED] Previous mailbox is now closed" || got[len(got)-1] != "b OK [READ-ONLY] EXAMINE completed" {
		t.Fatalf("EXAMINE: %q", got)
	}
	c.expectCmd("c", "EXPUNGE", "c NO [READ-ONLY] Mailbox is read-only")
	c.expectCmd("d", "CLOSE", "d OK CLOSE completed")
	got = c.cmd("e", "SELECT INBOX")
	if got[0] != "* 3 EXISTS" {
		t.Fatalf("SELECT after read-only CLOSE: %q, want 3 messages", got)
	}
}

// QUILL.md row 13: a session error that is not an *imap.Error is answered
// NO with the code Options.ErrorCode picks and a text naming the command and
// a reference to the log line with the cause (not the cause: it may name
// other machines); "" keeps SERVERBUG; an *imap.Error is passed through.
func TestSessionErrorCodeAndCause(t *testing.T) {
	ts := newTestServer(t, func(o *Options) {
		o.ErrorCode = func(err error) imap.ResponseCode {
			if errors.Is(err, errTestUnavailable) {
				return imap.ResponseCodeUnavailable
			}
			return ""
		}
	})
	c := ts.login()
	c.expectCmd("a", "STATUS Unreachable (MESSAGES)",
		"a NO [UNAVAILABLE] STATUS failed; try again later (reference R)")
	c.expectCmd("b", "SELECT Unreachable",
		"b NO [UNAVAILABLE] SELECT failed; try again later (reference R)")
	c.expectCmd("c", "STATUS Broken (MESSAGES)",
		"c NO [SERVERBUG] STATUS failed (reference R)")
	if !ts.logger.logged("disk on fire") {
		t.Error("the cause of the failed STATUS is not in the log")
	}
	c.expectCmd("d", "STATUS Nowhere (MESSAGES)",
		"d NO [NONEXISTENT] No such mailbox")
	c.write("e APPEND Unreachable {5+}\r\nhello\r\n")
	c.expect("e NO [UNAVAILABLE] APPEND failed; try again later (reference R)")
	c.expectCmd("f", "STATUS INBOX (MESSAGES)",
		"* STATUS INBOX (MESSAGES 3)",
		"f OK STATUS completed")
}

// QUILL.md row 13: without Options.ErrorCode the code is SERVERBUG; the
// text names the command, the log the cause.
func TestSessionErrorWithoutErrorCodeNamesCause(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.expectCmd("a", "STATUS Unreachable (MESSAGES)",
		"a NO [SERVERBUG] STATUS failed (reference R)")
	if !ts.logger.logged("fetching from node n2: node unavailable") {
		t.Error("the cause is not in the log")
	}
}

type ctxKey struct{}

type ctxCall struct {
	method string
	n      any // the ctxKey value: which CommandContext call made it
	stops  int // stop calls made when the method ran
	ctx    context.Context
}

// QUILL.md row 14: every command but IDLE runs under the context
// Options.CommandContext makes from the connection's (Conn.Context during
// the session's methods, including the poll), and stop is called when the
// command is over; the parent ends with the connection.
func TestCommandContextWrapsEachCommandButIdle(t *testing.T) {
	var (
		mu      sync.Mutex
		made    int
		stops   int
		parents []context.Context
		conns   []net.Conn
		calls   []ctxCall
	)
	ts := newTestServer(t, func(o *Options) {
		o.CommandContext = func(parent context.Context, conn net.Conn) (context.Context, func()) {
			mu.Lock()
			defer mu.Unlock()
			made++
			parents = append(parents, parent)
			conns = append(conns, conn)
			ctx, cancel := context.WithCancel(context.WithValue(parent, ctxKey{}, made))
			return ctx, func() {
				mu.Lock()
				stops++
				mu.Unlock()
				cancel()
			}
		}
	})
	ts.backend.onCall = func(method string, ctx context.Context) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, ctxCall{method: method, n: ctx.Value(ctxKey{}), stops: stops, ctx: ctx})
	}

	c, _ := ts.dial()
	c.expectCmd("a", "LOGIN alice secret", // command 1
		"a OK [CAPABILITY IMAP4rev1 SASL-IR LITERAL+ ID UNSELECT ENABLE IDLE UTF8=ACCEPT CONDSTORE] Logged in")
	c.expectCmd("b", "STATUS INBOX (MESSAGES)", // command 2
		"* STATUS INBOX (MESSAGES 3)", "b OK STATUS completed")
	c.send("c IDLE") // no command context
	c.expect("+ idling")
	c.send("DONE")
	c.expect("c OK IDLE completed")
	c.expectCmd("d", "NOOP", "d OK NOOP completed") // command 3

	mu.Lock()
	got := slices.Clone(calls)
	mu.Unlock()
	want := []ctxCall{
		{method: "Login", n: 1, stops: 0},
		{method: "Status", n: 2, stops: 1},
		{method: "Poll", n: 2, stops: 1},
		{method: "Idle", n: nil, stops: 2},
		{method: "Poll", n: nil, stops: 2}, // the poll after IDLE
		{method: "Poll", n: 3, stops: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("session calls %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].method != want[i].method || got[i].n != want[i].n || got[i].stops != want[i].stops {
			t.Fatalf("session call %d: got %s under context %v after %d stops, want %s under %v after %d stops",
				i, got[i].method, got[i].n, got[i].stops, want[i].method, want[i].n, want[i].stops)
		}
	}
	// The stopped command's context is over; IDLE's (the connection's)
	// is not while the connection lasts.
	if got[0].ctx.Err() == nil {
		t.Fatal("LOGIN's context still live after its stop")
	}
	if got[3].ctx.Err() != nil {
		t.Fatal("the connection's context ended before the connection")
	}
	if conns[0].RemoteAddr().String() != c.conn.LocalAddr().String() {
		t.Fatalf("CommandContext got conn from %v, want %v", conns[0].RemoteAddr(), c.conn.LocalAddr())
	}
	if parents[0] != parents[2] || parents[0] != got[3].ctx {
		t.Fatal("CommandContext parents are not the connection's context")
	}

	// The parent, the connection's context, ends with the connection.
	c.expectCmd("e", "LOGOUT", "* BYE Logging out", "e OK LOGOUT completed")
	select {
	case <-parents[0].Done():
	case <-time.After(testTimeout):
		t.Fatal("the connection's context did not end after LOGOUT")
	}
	mu.Lock()
	defer mu.Unlock()
	if made != 4 || stops != 4 {
		t.Fatalf("CommandContext made %d contexts and %d stops, want 4 and 4", made, stops)
	}
}

// QUILL.md row 14: without Options.CommandContext, Conn.Context during a
// command is the connection's context, which ends with the connection.
func TestConnContextWithoutHookEndsWithConnection(t *testing.T) {
	ts := newTestServer(t, nil)
	ctxs := make(chan context.Context, 4)
	ts.backend.onCall = func(method string, ctx context.Context) {
		if method == "Login" {
			ctxs <- ctx
		}
	}
	c := ts.login()
	ctx := <-ctxs
	if ctx == nil || ctx.Err() != nil {
		t.Fatalf("Conn.Context during LOGIN: %v", ctx)
	}
	c.conn.Close()
	select {
	case <-ctx.Done():
	case <-time.After(testTimeout):
		t.Fatal("Conn.Context did not end with the connection")
	}
}

// QUILL.md row 15: an error after a literal (here a mailbox name that is not
// modified UTF-7) discards the rest of the line, which upstream ran as a
// command of its own ("X NOOP").
func TestErrorAfterLiteralDiscardsRestOfLine(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.write("a CREATE {3+}\r\n&JjX NOOP\r\n")
	if line := c.readLine(); !strings.HasPrefix(line, "a NO ") && !strings.HasPrefix(line, "a BAD ") {
		t.Fatalf("CREATE of a bad name: got %q", line)
	}
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
}

// QUILL.md row 16: Options.InsecureAuthConn decides per connection whether
// a password may be sent without TLS: LOGINDISABLED and no AUTH= where it
// may not, and LOGIN/AUTHENTICATE are refused with PRIVACYREQUIRED.
func TestInsecureAuthPerConnection(t *testing.T) {
	for _, allow := range []bool{false, true} {
		ts := newTestServer(t, func(o *Options) {
			o.InsecureAuth = false
			o.InsecureAuthConn = func(net.Conn) bool { return allow }
		})
		c, _ := ts.dial()
		caps := strings.Join(c.cmd("a", "CAPABILITY"), "\n")
		if got := strings.Contains(caps, "LOGINDISABLED"); got == allow {
			t.Errorf("allow %v: CAPABILITY %q (LOGINDISABLED %v)", allow, caps, got)
		}
		if got := strings.Contains(caps, "AUTH=PLAIN"); got != allow {
			t.Errorf("allow %v: CAPABILITY %q (AUTH=PLAIN %v)", allow, caps, got)
		}
		lines := c.cmd("b", "LOGIN "+testUser+" "+testPassword)
		last := lines[len(lines)-1]
		if allow && !strings.HasPrefix(last, "b OK ") || !allow && !strings.HasPrefix(last, "b NO [PRIVACYREQUIRED] ") {
			t.Errorf("allow %v: LOGIN answered %q", allow, last)
		}
	}
}

// QUILL.md row 17: lists nested too deep and mailbox names that are not
// modified UTF-7 are the client's errors, answered BAD [CLIENTBUG] (were NO
// [SERVERBUG]); the session goes on. A LIST pattern that is not modified
// UTF-7 is matched as it is spelt.
func TestClientErrorsInArgumentsAreBAD(t *testing.T) {
	ts := newTestServer(t, nil)
	c := ts.login()
	c.expectCmd("a", "SEARCH "+strings.Repeat("(", 2000)+"ALL"+strings.Repeat(")", 2000),
		"a BAD [CLIENTBUG] lists nested deeper than 1000")
	c.expectCmd("b", `SELECT "&Jjo"`,
		"b BAD [CLIENTBUG] mailbox name is not valid modified UTF-7 (RFC 3501 section 5.1.3)")
	c.expectCmd("c", `CREATE "&-&"`,
		"c BAD [CLIENTBUG] mailbox name is not valid modified UTF-7 (RFC 3501 section 5.1.3)")
	// The test session has no LIST: its answer shows the pattern got past
	// the parser to the session.
	c.expectCmd("d", `LIST "" "&'"`, "d NO [CANNOT] LIST is not supported by the test session")
	c.expectCmd("e", "NOOP", "e OK NOOP completed")
}

// QUILL.md row 18: an empty SASL challenge goes out as "+ " (was "+ ="),
// and a SASL response longer than the read buffer is answered BAD, its
// rest skipped, with the session going on.
func TestSASLEmptyChallengeAndOverlongResponse(t *testing.T) {
	ts := newTestServer(t, nil)
	c, _ := ts.dial()
	c.send("a AUTHENTICATE PLAIN")
	if l := c.readLine(); l != "+ " {
		t.Fatalf("empty challenge sent as %q, want \"+ \"", l)
	}
	c.send(strings.Repeat("QUFB", 5000))
	c.expect("a BAD SASL response too long")
	c.expectCmd("b", "NOOP", "b OK NOOP completed")
}

// QUILL.md row 36: Options.CommandDone hears each command's name and the
// type of its tagged answer, commands that answer OK themselves (LOGIN,
// SELECT) too; a command the server does not know, and a line without a
// command, are UNKNOWN.
func TestCommandDoneReportsNameAndResult(t *testing.T) {
	type done struct {
		name   string
		result imap.StatusResponseType
	}
	var (
		mu  sync.Mutex
		got []done
	)
	ts := newTestServer(t, func(o *Options) {
		o.CommandDone = func(name string, result imap.StatusResponseType) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, done{name, result})
		}
	})
	c := ts.selectInbox()
	c.expectCmd("a", "UID FETCH 12 (FLAGS)", `* 3 FETCH (UID 12 FLAGS (\Flagged))`, "a OK UID FETCH completed")
	c.expectCmd("b", "STATUS Nowhere (MESSAGES)", "b NO [NONEXISTENT] No such mailbox")
	c.expectCmd("c", "FROBNICATE", "c BAD Unknown command")
	c.expectCmd("d", "FETCH x (FLAGS)", `d BAD [CLIENTBUG] Syntax error: imap: bad number set value "x"`)
	c.send("(((")
	c.expect("* BAD Missing or malformed command tag or name")
	c.expectCmd("e", "NOOP", "e OK NOOP completed")
	want := []done{{"LOGIN", imap.StatusResponseTypeOK}, {"SELECT", imap.StatusResponseTypeOK},
		{"UID FETCH", imap.StatusResponseTypeOK}, {"STATUS", imap.StatusResponseTypeNo},
		{"UNKNOWN", imap.StatusResponseTypeBad}, {"FETCH", imap.StatusResponseTypeBad},
		{"UNKNOWN", imap.StatusResponseTypeBad}, {"NOOP", imap.StatusResponseTypeOK}}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("CommandDone heard %v, want %v", got, want)
	}
}

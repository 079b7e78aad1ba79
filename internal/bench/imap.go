package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
)

// Deadlines of the steps of an IMAP session. Each step must finish within
// its own deadline and the whole session within SessionTimeout; a step that
// runs into either fails the session with ErrTimeout. Like SessionTimeout,
// they are far above the 2 s latency deadline so that slow sessions are
// measured and counted late rather than cut off.
const (
	// IMAPConnectTimeout bounds the TCP connect and the server greeting
	// (the connect alone is also bounded by DialTimeout).
	IMAPConnectTimeout = 5 * time.Second
	// IMAPLoginTimeout bounds LOGIN (servers hash passwords slowly on
	// purpose, and delay failed logins).
	IMAPLoginTimeout = 10 * time.Second
	// IMAPSelectTimeout bounds SELECT INBOX.
	IMAPSelectTimeout = 10 * time.Second
	// IMAPFetchHeadersTimeout bounds FETCH 1:* of the header fields, which
	// grows with the mailbox.
	IMAPFetchHeadersTimeout = 20 * time.Second
	// IMAPFetchBodyTimeout bounds UID FETCH of one full message (up to
	// MaxMessageSize).
	IMAPFetchBodyTimeout = 10 * time.Second
	// IMAPStoreTimeout bounds UID STORE +FLAGS (\Seen).
	IMAPStoreTimeout = 10 * time.Second
	// IMAPLogoutTimeout bounds LOGOUT.
	IMAPLogoutTimeout = 5 * time.Second
)

// IMAPStep is one step of an IMAP session.
type IMAPStep int

const (
	IMAPStepConnect      IMAPStep = iota // TCP connect and greeting
	IMAPStepLogin                        // LOGIN
	IMAPStepSelect                       // SELECT INBOX
	IMAPStepFetchHeaders                 // FETCH 1:* (UID FLAGS RFC822.SIZE BODY.PEEK[HEADER.FIELDS (FROM SUBJECT DATE)])
	IMAPStepFetchBody                    // UID FETCH uid BODY[]
	IMAPStepStore                        // UID STORE uid +FLAGS (\Seen)
	IMAPStepLogout                       // LOGOUT
	numIMAPSteps
)

// IMAPSteps lists the steps in session order.
var IMAPSteps = []IMAPStep{IMAPStepConnect, IMAPStepLogin, IMAPStepSelect,
	IMAPStepFetchHeaders, IMAPStepFetchBody, IMAPStepStore, IMAPStepLogout}

var imapStepNames = [numIMAPSteps]string{"connect", "login", "select", "fetch_headers", "fetch_body", "store", "logout"}

func (s IMAPStep) String() string {
	if s < 0 || s >= numIMAPSteps {
		return fmt.Sprintf("step%d", int(s))
	}
	return imapStepNames[s]
}

// imapStepTimeouts are the deadlines of the steps; tests shorten them.
var imapStepTimeouts = [numIMAPSteps]time.Duration{
	IMAPStepConnect:      IMAPConnectTimeout,
	IMAPStepLogin:        IMAPLoginTimeout,
	IMAPStepSelect:       IMAPSelectTimeout,
	IMAPStepFetchHeaders: IMAPFetchHeadersTimeout,
	IMAPStepFetchBody:    IMAPFetchBodyTimeout,
	IMAPStepStore:        IMAPStoreTimeout,
	IMAPStepLogout:       IMAPLogoutTimeout,
}

// imapHeaderFields are the header fields a mail client lists a folder by.
var imapHeaderFields = []string{"FROM", "SUBJECT", "DATE"}

// imapTarget is what one IMAP session needs.
type imapTarget struct {
	addr       string
	tls        *tls.Config // implicit TLS (IMAPS) when set
	user, pass string
	// pick returns a random index in [0, n), n > 0: the message to read.
	pick func(n int) int
}

// imapStepError is the failure of one step of an IMAP session.
type imapStepError struct {
	step     IMAPStep
	timedOut bool // the step ran into its deadline
	err      error
}

func (e *imapStepError) Error() string {
	msg := "imap " + e.step.String() + ": " + e.err.Error()
	if e.timedOut {
		msg += " (step deadline passed)"
	}
	return msg
}

func (e *imapStepError) Unwrap() error { return e.err }

// classifyIMAP maps the failure of an IMAP session to its kind. go-imap's
// client reports a failed read as a plain string, so a timeout is known by
// the step's deadline having passed rather than by the error's type.
func classifyIMAP(err error) ErrKind {
	var ie *imap.Error
	if errors.As(err, &ie) {
		switch ie.Type {
		case imap.StatusResponseTypeNo:
			return ErrIMAPNo
		case imap.StatusResponseTypeBad:
			return ErrIMAPBad
		}
	}
	var se *imapStepError
	if errors.As(err, &se) && se.timedOut {
		return ErrTimeout
	}
	return classify(err)
}

// imapSession runs one IMAP session the way a mail client opens a folder
// and reads a message (RFC 9051): connect, LOGIN, SELECT INBOX, FETCH 1:*
// (UID FLAGS RFC822.SIZE BODY.PEEK[HEADER.FIELDS (FROM SUBJECT DATE)]), then,
// if the INBOX is not empty, UID FETCH of one random message's BODY[] and
// UID STORE of +FLAGS (\Seen) on it, LOGOUT. UID is in the header FETCH so
// that the message can be addressed by UID.
func imapSession(abort context.Context, t imapTarget) (res Result, err error) {
	res.Op = OpIMAP
	start := time.Now()
	step, stepStart, stepEnd := IMAPStepConnect, start, start.Add(imapStepTimeouts[IMAPStepConnect])
	defer func() {
		res.Latency = time.Since(start)
		if err != nil {
			err = &imapStepError{step: step, err: err, timedOut: !time.Now().Before(stepEnd)}
			res.Err, res.ErrMsg = classifyIMAP(err), err.Error()
			if abort.Err() != nil {
				res.Aborted, res.Err, res.ErrMsg = true, ErrNone, ""
			}
		}
	}()
	conn, closeConn, err := dialSession(abort, t.addr, t.tls, start, &res)
	if err != nil {
		return dialFailed(abort, res, err), nil
	}
	defer closeConn()
	stepEnd = conn.setOpDeadline(time.Until(stepEnd))
	done := func() {
		res.IMAP.Steps[step] = time.Since(stepStart)
		res.IMAP.Done |= 1 << step
	}
	begin := func(s IMAPStep) {
		step, stepStart = s, time.Now()
		stepEnd = conn.setOpDeadline(imapStepTimeouts[s])
	}

	c := imapclient.New(conn, nil)
	defer c.Close()
	if err := c.WaitGreeting(); err != nil {
		return res, err
	}
	done()

	begin(IMAPStepLogin)
	if err := c.Login(t.user, t.pass).Wait(); err != nil {
		return res, err
	}
	done()

	begin(IMAPStepSelect)
	sel, err := c.Select("INBOX", nil).Wait()
	if err != nil {
		return res, err
	}
	done()

	if sel.NumMessages > 0 {
		// FETCH 1:* on an empty mailbox is an error for some servers, so
		// it is sent only when SELECT saw messages.
		begin(IMAPStepFetchHeaders)
		var all imap.SeqSet
		all.AddRange(1, 0) // 1:*
		uids, hdrBytes, err := fetchHeaders(c, all)
		if err != nil {
			return res, err
		}
		res.IMAP.Listed, res.IMAP.HeaderBytes = len(uids), hdrBytes
		done()

		if len(uids) > 0 {
			uid := imap.UIDSetNum(uids[t.pick(len(uids))])

			begin(IMAPStepFetchBody)
			n, ok, err := fetchBody(c, uid)
			if err != nil {
				return res, err
			}
			res.IMAP.BodyFetched, res.IMAP.BodyBytes = ok, n
			done()

			begin(IMAPStepStore)
			store := &imap.StoreFlags{Op: imap.StoreFlagsAdd, Flags: []imap.Flag{imap.FlagSeen}}
			if err := c.Store(uid, store, nil).Close(); err != nil {
				return res, err
			}
			done()
		}
	}

	begin(IMAPStepLogout)
	if err := c.Logout().Wait(); err != nil {
		return res, err
	}
	done()
	return res, nil
}

// fetchHeaders sends the header FETCH for set and returns the UIDs of the
// messages listed and the size of the header fields read.
func fetchHeaders(c *imapclient.Client, set imap.NumSet) ([]imap.UID, int64, error) {
	cmd := c.Fetch(set, &imap.FetchOptions{
		UID:        true,
		Flags:      true,
		RFC822Size: true,
		BodySection: []*imap.FetchItemBodySection{{
			Specifier:    imap.PartSpecifierHeader,
			HeaderFields: imapHeaderFields,
			Peek:         true,
		}},
	})
	var uids []imap.UID
	var size int64
	for msg := cmd.Next(); msg != nil; msg = cmd.Next() {
		for item := msg.Next(); item != nil; item = msg.Next() {
			switch it := item.(type) {
			case imapclient.FetchItemDataUID:
				uids = append(uids, it.UID)
			case imapclient.FetchItemDataBodySection:
				if it.Literal != nil {
					n, err := io.Copy(io.Discard, it.Literal)
					size += n
					if err != nil {
						cmd.Close()
						return nil, size, err
					}
				}
			}
		}
	}
	return uids, size, cmd.Close()
}

// fetchBody reads the whole of message uid (BODY[], which also sets \Seen)
// and returns its size; ok is false if the server returned no body (the
// message was expunged meanwhile).
func fetchBody(c *imapclient.Client, uid imap.UIDSet) (size int64, ok bool, err error) {
	cmd := c.Fetch(uid, &imap.FetchOptions{
		BodySection: []*imap.FetchItemBodySection{{}},
	})
	for msg := cmd.Next(); msg != nil; msg = cmd.Next() {
		for item := msg.Next(); item != nil; item = msg.Next() {
			if it, isBody := item.(imapclient.FetchItemDataBodySection); isBody && it.Literal != nil {
				n, err := io.Copy(io.Discard, it.Literal)
				size += n
				ok = true
				if err != nil {
					cmd.Close()
					return size, false, err
				}
			}
		}
	}
	return size, ok, cmd.Close()
}

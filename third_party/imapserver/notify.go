package imapserver

// NOTIFY (RFC 5465), quill: the command is parsed and checked here; the
// session keeps what was asked and says when something may be reported
// (SessionNotify.NotifyReady). Between commands the connection then waits
// for either the client's next command or that signal, and lets the
// session write its updates (serve, notifyWait): STATUS for watched
// mailboxes that are not selected, LIST for names and subscriptions, and
// the selected mailbox's EXISTS, EXPUNGE and FETCH, with the fetch
// attributes MessageNew names for new messages.

import (
	"fmt"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// CapNotify is the NOTIFY capability (go-imap names none).
const CapNotify imap.Cap = "NOTIFY"

// NotifyFilter is a filter-mailboxes of NOTIFY SET.
type NotifyFilter string

const (
	NotifySelected        NotifyFilter = "SELECTED"
	NotifySelectedDelayed NotifyFilter = "SELECTED-DELAYED"
	NotifyInboxes         NotifyFilter = "INBOXES"
	NotifyPersonal        NotifyFilter = "PERSONAL"
	NotifySubscribed      NotifyFilter = "SUBSCRIBED"
	NotifySubtree         NotifyFilter = "SUBTREE"
	NotifyMailboxes       NotifyFilter = "MAILBOXES"
)

// NotifyEvent is an event of NOTIFY SET.
type NotifyEvent string

const (
	NotifyMessageNew         NotifyEvent = "MessageNew"
	NotifyMessageExpunge     NotifyEvent = "MessageExpunge"
	NotifyFlagChange         NotifyEvent = "FlagChange"
	NotifyMailboxName        NotifyEvent = "MailboxName"
	NotifySubscriptionChange NotifyEvent = "SubscriptionChange"
)

// notifyEvents are the events offered; AnnotationChange and the METADATA
// ones are not (no ANNOTATE or METADATA).
var notifyEvents = []NotifyEvent{NotifyMessageNew, NotifyMessageExpunge, NotifyFlagChange, NotifyMailboxName, NotifySubscriptionChange}

// NotifyGroup is one "(filter events)" of NOTIFY SET.
type NotifyGroup struct {
	Filter    NotifyFilter
	Mailboxes []string      // SUBTREE and MAILBOXES
	Events    []NotifyEvent // empty: NONE
	// Fetch is what MessageNew asks of new messages in the selected
	// mailbox (nil: nothing but EXISTS); body sections are PEEKs, so a
	// report never marks new mail read.
	Fetch         *imap.FetchOptions
	writerOptions fetchWriterOptions // how the FETCH responses name items
}

// Has reports whether the group asks for the event.
func (g *NotifyGroup) Has(e NotifyEvent) bool {
	for _, x := range g.Events {
		if x == e {
			return true
		}
	}
	return false
}

// NotifySet is a NOTIFY SET command.
type NotifySet struct {
	Status bool // STATUS: the watched mailboxes' STATUS at once
	Groups []NotifyGroup
}

// SessionNotify is a Session that takes NOTIFY.
type SessionNotify interface {
	Session
	// SetNotify replaces what is to be reported; nil is NOTIFY NONE. w
	// writes what NOTIFY SET STATUS asks for.
	SetNotify(w *UpdateWriter, set *NotifySet) error
	// NotifyReady is signalled when something may be reported; nil when
	// NOTIFY is off.
	NotifyReady() <-chan struct{}
	// NotifyFlush writes what is to be reported, between commands (or
	// during IDLE); UpdateWriter.FetchNew writes MessageNew's fetch
	// attributes. An error ends the connection: it is for a response
	// that could not be written, not for one that could not be made.
	NotifyFlush(w *UpdateWriter) error
}

// maxNotifyGroups bounds the groups of one NOTIFY SET.
const maxNotifyGroups = 64

func (c *Conn) handleNotify(dec *imapwire.Decoder) error {
	ns, ok := c.session.(SessionNotify)
	if !ok {
		return &imap.Error{Type: imap.StatusResponseTypeBad, Text: "Unknown command"}
	}
	var verb string
	if !dec.ExpectSP() || !dec.ExpectAtom(&verb) {
		return dec.Err()
	}
	var set *NotifySet
	switch strings.ToUpper(verb) {
	case "NONE":
	case "SET":
		set = &NotifySet{}
		if !dec.ExpectSP() {
			return dec.Err()
		}
		var word string
		if dec.Atom(&word) {
			if !strings.EqualFold(word, "STATUS") || !dec.ExpectSP() {
				return newClientBugError("NOTIFY SET takes STATUS or event groups")
			}
			set.Status = true
		}
		for {
			g, err := c.readNotifyGroup(dec)
			if err != nil {
				return err
			}
			set.Groups = append(set.Groups, *g)
			if len(set.Groups) > maxNotifyGroups {
				return newClientBugError(fmt.Sprintf("NOTIFY SET takes at most %d groups", maxNotifyGroups))
			}
			if !dec.SP() {
				break
			}
		}
	default:
		return newClientBugError("NOTIFY takes SET or NONE")
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	if set != nil {
		if err := checkNotifySet(set); err != nil {
			return err
		}
	}
	return ns.SetNotify(&UpdateWriter{conn: c, allowExpunge: false}, set)
}

// readNotifyGroup reads "(" filter-mailboxes SP events ")".
func (c *Conn) readNotifyGroup(dec *imapwire.Decoder) (*NotifyGroup, error) {
	g := &NotifyGroup{}
	var filter string
	if !dec.ExpectSpecial('(') || !dec.ExpectAtom(&filter) || !dec.ExpectSP() {
		return nil, dec.Err()
	}
	g.Filter = NotifyFilter(strings.ToUpper(filter))
	switch g.Filter {
	case NotifySelected, NotifySelectedDelayed, NotifyInboxes, NotifyPersonal, NotifySubscribed:
	case NotifySubtree, NotifyMailboxes:
		// one-or-more-mailbox: a mailbox, or a list of them.
		isList, err := dec.List(func() error {
			var name string
			if !dec.ExpectMailbox(&name) {
				return dec.Err()
			}
			g.Mailboxes = append(g.Mailboxes, name)
			return nil
		})
		if err != nil {
			return nil, err
		}
		if !isList {
			var name string
			if !dec.ExpectMailbox(&name) {
				return nil, dec.Err()
			}
			g.Mailboxes = append(g.Mailboxes, name)
		}
		if len(g.Mailboxes) == 0 || !dec.ExpectSP() {
			return nil, newClientBugError("NOTIFY " + filter + " needs mailboxes")
		}
	default:
		return nil, newClientBugError("Unknown NOTIFY filter " + filter)
	}
	var none string
	if dec.Atom(&none) {
		if !strings.EqualFold(none, "NONE") {
			return nil, newClientBugError("NOTIFY events are NONE or a list")
		}
	} else {
		err := dec.ExpectList(func() error {
			var name string
			if !dec.ExpectAtom(&name) {
				return dec.Err()
			}
			e, ok := notifyEventNamed(name)
			if !ok {
				return badEvent(name)
			}
			g.Events = append(g.Events, e)
			if e == NotifyMessageNew && dec.SPList() {
				// MessageNew's fetch attributes (RFC 5465 §5.2).
				if g.Filter != NotifySelected && g.Filter != NotifySelectedDelayed {
					return newClientBugError("MessageNew fetch attributes are for the selected mailbox only")
				}
				g.Fetch = &imap.FetchOptions{UID: true}
				g.writerOptions = fetchWriterOptions{obsolete: make(map[*imap.FetchItemBodySection]string)}
				err := dec.ExpectList(func() error {
					att, err := readFetchAttName(dec)
					if err != nil {
						return err
					}
					return handleFetchAtt(dec, att, g.Fetch, &g.writerOptions)
				})
				for _, b := range g.Fetch.BodySection {
					b.Peek = true
				}
				for _, b := range g.Fetch.BinarySection {
					b.Peek = true
				}
				return err
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if !dec.ExpectSpecial(')') {
		return nil, dec.Err()
	}
	return g, nil
}

func notifyEventNamed(name string) (NotifyEvent, bool) {
	for _, e := range notifyEvents {
		if strings.EqualFold(name, string(e)) {
			return e, true
		}
	}
	return "", false
}

// badEvent refuses an event not offered: NO [BADEVENT (offered events)]
// (RFC 5465 §5.4).
func badEvent(name string) error {
	names := make([]string, len(notifyEvents))
	for i, e := range notifyEvents {
		names[i] = string(e)
	}
	return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCode("BADEVENT (" + strings.Join(names, " ") + ")"),
		Text: fmt.Sprintf("NOTIFY: event %q is not offered", name)}
}

// checkNotifySet applies RFC 5465 §5's rules: MessageNew and
// MessageExpunge go together, FlagChange needs them, and only one group
// names the selected mailbox.
func checkNotifySet(set *NotifySet) error {
	selected := 0
	for _, g := range set.Groups {
		if g.Filter == NotifySelected || g.Filter == NotifySelectedDelayed {
			selected++
		}
		if g.Has(NotifyMessageNew) != g.Has(NotifyMessageExpunge) {
			return newClientBugError("NOTIFY: MessageNew and MessageExpunge go together")
		}
		if g.Has(NotifyFlagChange) && !g.Has(NotifyMessageNew) {
			return newClientBugError("NOTIFY: FlagChange needs MessageNew and MessageExpunge")
		}
	}
	if selected > 1 {
		return newClientBugError("NOTIFY: the selected mailbox is named twice")
	}
	return nil
}

// notifyFlush lets the session write what NOTIFY reports. Expunges may
// go out (between commands they always may; the session holds them back
// for SELECTED-DELAYED).
func (c *Conn) notifyFlush(ns SessionNotify) error {
	return ns.NotifyFlush(&UpdateWriter{conn: c, allowExpunge: true})
}

// FetchNew writes FETCH responses for new messages of the selected
// mailbox with what the group's MessageNew asks, as the session's Fetch
// makes them.
func (w *UpdateWriter) FetchNew(numSet imap.NumSet, g *NotifyGroup) error {
	if g.Fetch == nil {
		return nil
	}
	opts := *g.Fetch
	fw := &FetchWriter{conn: w.conn, options: g.writerOptions}
	return w.conn.session.Fetch(fw, numSet, &opts)
}

// notifyWait waits, between commands, for the client's next command;
// meanwhile each signal of ready has the session write its updates. A
// goroutine peeks at the input so that the wait can end either way; the
// command is read only after it returned.
func (c *Conn) notifyWait(ns SessionNotify, ready <-chan struct{}) error {
	if c.br.Buffered() > 0 {
		return nil
	}
	in := make(chan error, 1)
	go func() {
		_, err := c.br.Peek(1)
		in <- err
	}()
	for {
		select {
		case err := <-in:
			return err
		case <-ready:
			if err := c.notifyFlush(ns); err != nil {
				c.conn.Close() // ends the peek
				<-in
				return err
			}
		}
	}
}

// WriteStatus writes a STATUS response with the items data holds (NOTIFY).
func (w *UpdateWriter) WriteStatus(data *imap.StatusData) error {
	opts := &imap.StatusOptions{NumMessages: data.NumMessages != nil, UIDNext: data.UIDNext != 0,
		UIDValidity: data.UIDValidity != 0, NumUnseen: data.NumUnseen != nil, HighestModSeq: data.HighestModSeq != 0}
	return w.conn.writeStatus(data, opts, statusExt{})
}

// WriteList writes a LIST response (NOTIFY MailboxName and
// SubscriptionChange).
func (w *UpdateWriter) WriteList(data *imap.ListData) error {
	return w.conn.writeList(data)
}

// Package imap is the IMAP retrieval proxy of Porcupine §2.3.2; RFC 3501,
// RFC 9051.
//
// The wire protocol is the job of package imapserver (a patched copy of
// github.com/emersion/go-imap/v2 v2.0.0-beta.8's imapserver, see
// imapserver/QUILL.md for why and what changed). This package implements its
// Session interface on top of the mailbox manager, reached through the small
// Store interface so that a cluster can substitute one that gathers remote
// mailbox fragments.
//
// A session's view of the selected mailbox is a snapshot: the list of UIDs
// that sequence numbers index. It changes only where RFC 9051 §7.5.1 allows:
// new messages (EXISTS), flag changes (FETCH) and expunges (EXPUNGE) made by
// other sessions, SMTP delivery or POP3 are found by Poll after a command or
// during IDLE, and an expunge is held back (the message stays numbered, a
// "ghost") while a FETCH, STORE or SEARCH is answered. Once the client
// enables QRESYNC (RFC 7162 §3.2), expunges go out as VANISHED with UIDs,
// and a SELECT with QRESYNC parameters or a UID FETCH VANISHED reports the
// UIDs that are gone as computed from the mailbox (qresync.go).
//
// Soft state: which messages are \Recent (RFC 3501 §2.3.2) is kept in memory
// per node, as the highest UID some session has already been told about per
// mailbox. After a restart, or on another node, a message may be \Recent to
// one more session; RFC 3501 allows that ("if it is not possible to determine
// whether or not this session is the first session to be notified about a
// message, then that message SHOULD be considered recent").
package imap

package imap

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/quillmail/quill/internal/mailbox"
)

// OBJECTID (RFC 8474).
//
// MAILBOXID is "F", a digest of the user's address and the mailbox's
// UIDVALIDITY: UIDVALIDITY is kept across RENAME and never given twice
// for one user (writer.nextValidity, kept even when the user is deleted
// and made again), and the digest keeps two users' ids apart.
//
// EMAILID is "M" and a digest of the user, the message's bytes and its
// internal date: bytes and date are what RFC 8474 §5.1 asks to be the
// same for messages with one EMAILID, and the user keeps one delivery to
// several users from carrying one id into each account. So a COPY or MOVE keeps it (both keep bytes and date, and the
// COPYUID pairs must share it), and two APPENDs of the same bytes at the
// same date share one (which §5.1 allows). The replica records hold no id
// of their own for it: a COPY makes a new object, and the bytes are the
// one thing a copy keeps. Reading them costs a body read per message the
// first time; a selection keeps the ids it made.
//
// THREADID is NIL for every message, and SEARCH THREADID matches none, as
// §5.2 asks of a server that keeps no thread ids (SORT and THREAD compute
// threads per command, which gives no stable id).

// MailboxID implements imapserver.SessionObjectID.
func (s *session) MailboxID(name string) (string, error) {
	// As Create names it: a trailing delimiter only declares children.
	if n := strings.TrimSuffix(name, mailbox.Separator); n != "" {
		name = n
	}
	mb, err := s.srv.store.Mailbox(s.ctx(), s.user, name)
	if err != nil {
		return "", storeErr(fmt.Sprintf("MAILBOXID of %q", name), err)
	}
	return mailboxObjectID(s.user, mb.UIDValidity), nil
}

func mailboxObjectID(user string, uidValidity uint32) string {
	h := sha256.New()
	h.Write([]byte(strings.ToLower(user)))
	binary.Write(h, binary.BigEndian, uidValidity)
	return "F" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:18])
}

// emailObjectID is a message's EMAILID.
func emailObjectID(user string, raw []byte, m *msgState) string {
	h := sha256.New()
	h.Write([]byte(strings.ToLower(user)))
	h.Write([]byte{0})
	binary.Write(h, binary.BigEndian, m.date.UnixNano())
	h.Write(raw)
	return "M" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:18])
}

// maxEmailIDCache bounds the EMAILIDs a selection keeps.
const maxEmailIDCache = 200_000

// emailID returns the EMAILID of a selected message, reading its bytes
// unless raw has them or the selection made it before.
func (s *session) emailID(m *msgState, raw []byte) (string, error) {
	sel := s.sel
	if id, ok := sel.emailIDs[m.id]; ok {
		return id, nil
	}
	if raw == nil {
		var err error
		if raw, err = s.srv.store.Body(s.ctx(), s.user, m.id); err != nil {
			return "", err
		}
	}
	id := emailObjectID(s.user, raw, m)
	if sel.emailIDs == nil || len(sel.emailIDs) > maxEmailIDCache {
		sel.emailIDs = map[string]string{}
	}
	sel.emailIDs[m.id] = id
	return id, nil
}

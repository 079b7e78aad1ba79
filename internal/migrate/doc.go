// Package migrate moves mail into and out of Quill: it reads Maildirs
// (Maildir++ folders, as Dovecot and Courier keep them), mbox files
// (mboxrd and mboxo) and IMAP servers (every folder, flags, internal dates,
// subscriptions, special use, the way imapsync does it), decides what of a
// source is already at the destination, and writes Maildirs that Dovecot
// can serve (`quill export`).
//
// The command side (cmd/quill import.go, export.go) reads a source here
// and sends each message to a node's admin API, which stores it through
// the same path IMAP APPEND takes (the user's mailbox writer hands out the
// UID, the replication manager stores it on the user's replicas, the text
// index and the quotas see it), so an import into any node of a cluster
// leaves the cluster as consistent as mail a client appended.
//
// What is written here and why (no library does these for Go):
//   - Maildir and mbox readers: the formats are a file naming convention
//     and a line convention, a few dozen lines each; the libraries that
//     exist (emersion/go-maildir, emersion/go-mbox) cover neither Maildir++
//     folders nor Dovecot's keyword file, nor mbox status headers.
//   - The idempotency decision (Decide) is the heart of a rerun and is a
//     pure function over keys. A message is known by a digest of its
//     header section (Key): imapsync identifies messages by their headers
//     too, a header digest needs no Message-ID (drafts and some spam have
//     none), and a digest of the whole message would make a rerun
//     download every message again. Two copies of one message at the
//     source are two messages: the keys are matched as a multiset.
//   - The folder mapping (MapFolders, MapName): delimiter conversion,
//     the source's personal namespace prefix, and special-use folders
//     (RFC 6154 attributes, or well-known names when a source has none)
//     onto the user's own Sent, Drafts, Trash, Junk and Archive.
//
// Modified UTF-7 (RFC 3501 §5.1.3) comes from go-imap's utf7 package, the
// IMAP client from go-imap v2's imapclient.
//
// Messages are carried with CRLF line ends, as IMAP serves them: a Maildir
// or mbox file keeps LF (Dovecot converts when it serves such a file), so
// the readers convert bare LFs and the Maildir writer converts back. The
// bytes a client fetches from Quill after an import are then the bytes it
// fetched from Dovecot before.
package migrate

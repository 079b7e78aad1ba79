package mailbox

// Operations the IMAP proxy needs beyond what POP3 and SMTP use.

// ExpungeDeleted removes those of uids whose message carries \Deleted at the
// moment of the commit (IMAP EXPUNGE and UID EXPUNGE, RFC 9051 §6.4.3,
// RFC 4315 §2.1), and returns the UIDs removed. Checking the flag inside the
// same locked batch means a concurrent STORE -FLAGS (\Deleted) either lands
// first and saves its message, or after, when the message is already gone.
func (m *Manager) ExpungeDeleted(user string, mbox uint64, uids []uint32) ([]uint32, error) {
	return m.expunge(user, mbox, uids, func(msg *Message) bool { return msg.HasFlag(`\Deleted`) })
}

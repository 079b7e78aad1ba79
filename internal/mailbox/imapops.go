package mailbox

// Operations the IMAP proxy needs beyond what POP3 and SMTP use.

// ExpungeDeleted removes those of uids whose message carries \Deleted at the
// moment of the commit (IMAP EXPUNGE and UID EXPUNGE, RFC 9051 §6.4.3,
// RFC 4315 §2.1), and returns the UIDs removed. Checking the flag inside the
// same locked batch means a concurrent STORE -FLAGS (\Deleted) either lands
// first and saves its message, or after, when the message is already gone.
func (m *Manager) ExpungeDeleted(user string, mbox uint64, uids []uint32) ([]uint32, error) {
	defer m.lockUser(user)()
	t := m.newTx()
	mb, err := m.mailboxByID(t.b, user, mbox)
	if err != nil {
		t.abort()
		return nil, err
	}
	var gone []uint32
	for _, uid := range uids {
		msg, ok, err := t.message(user, mbox, uid)
		if err != nil {
			t.abort()
			return nil, err
		}
		if !ok || !msg.HasFlag(`\Deleted`) {
			continue
		}
		if err := t.b.Delete(messageKey(user, mbox, uid), nil); err != nil {
			t.abort()
			return nil, err
		}
		if err := t.b.Delete(bodyKey(user, msg.ID), nil); err != nil {
			t.abort()
			return nil, err
		}
		gone = append(gone, uid)
	}
	if len(gone) == 0 {
		t.abort()
		return nil, nil
	}
	mb.HighestModSeq++
	if err := t.putMailbox(user, mb); err != nil {
		t.abort()
		return nil, err
	}
	return gone, t.commit()
}

package mailbox

// Remote access to this node's fragments (Porcupine §2.2: the mailbox
// manager enables remote access to mailbox fragments). The mailbox's
// ordered writer on the user's manager node reads fragments and drops
// deleted mailboxes and users with these; changes to messages go through
// the replication manager (object.go).

// FragmentRequest names one cluster mailbox of a user.
type FragmentRequest struct {
	User        string `json:"user"`
	UIDValidity uint32 `json:"uidvalidity"`
}

// Empty is the reply of calls that return nothing.
type Empty struct{}

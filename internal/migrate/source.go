package migrate

// Source is where an import reads mail: a Maildir tree, mbox files, an
// IMAP server.
type Source interface {
	// Folders lists the folders to import, INBOX first.
	Folders() ([]Folder, error)
	// List returns a folder's messages without their bytes (Key, Flags,
	// Date, Size), in the source's order.
	List(f *Folder) ([]Item, error)
	// Fetch calls fn with the bytes of each of items (from List), as they
	// are to be stored (CRLF line ends), or with the error that kept one
	// from being read; an error fn returns ends the fetch with it.
	Fetch(f *Folder, items []Item, fn func(it Item, raw []byte, err error) error) error
	Close() error
}

var (
	_ Source = Maildir{}
	_ Source = (*Mbox)(nil)
	_ Source = (*IMAPSource)(nil)
)

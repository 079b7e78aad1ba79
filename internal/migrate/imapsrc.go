package migrate

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	"github.com/emersion/go-sasl"
)

// dialTimeout bounds connecting to the source server.
const dialTimeout = 30 * time.Second

// ioTimeout bounds one read or write on the source connection: a server
// that sends nothing for this long (a FETCH of a large message streams
// steadily) is taken for gone.
const ioTimeout = 2 * time.Minute

// fetchBatch bounds the messages and bytes one FETCH of bodies asks for:
// large enough that a round trip per batch costs little, small enough
// that a batch that fails is cheap to name.
const (
	fetchBatch      = 100
	fetchBatchBytes = 32 << 20
)

// IMAPSource is an IMAP server read as a source, as imapsync reads
// host1: every selectable folder (LIST "" "*"), read-only (EXAMINE, and
// BODY.PEEK so no \Seen is set), headers first to decide, then the bodies
// of what is to be copied, in batches.
type IMAPSource struct {
	c      *imapclient.Client
	prefix string // the personal namespace's prefix ("INBOX." on Courier)
	// MaxSize makes messages larger than it (by RFC822.SIZE) fail without
	// being fetched; 0: no limit.
	MaxSize int64
}

// SourceURL is a parsed --from URL.
type SourceURL struct {
	TLS      bool // imaps: implicit TLS
	Addr     string
	Host     string
	Username string
}

// ParseSourceURL reads imap[s]://user@host[:port] (a user name with "@"
// written %40). A password in the URL is refused: command lines are seen
// by every local user.
func ParseSourceURL(s string) (*SourceURL, error) {
	u, err := url.Parse(s)
	if err != nil {
		// url's error repeats the URL, password and all.
		return nil, errors.New("source: not a URL (imaps://user@host[:port])")
	}
	name := u.Redacted() // errors never show a password given by mistake
	out := &SourceURL{Host: u.Hostname()}
	port := u.Port()
	switch u.Scheme {
	case "imaps":
		out.TLS = true
		if port == "" {
			port = "993"
		}
	case "imap":
		if port == "" {
			port = "143"
		}
	default:
		return nil, fmt.Errorf("source %q: the scheme must be imap or imaps", name)
	}
	if u.User == nil || u.User.Username() == "" {
		return nil, fmt.Errorf("source %q: no user name (imaps://user@host)", name)
	}
	if _, has := u.User.Password(); has {
		return nil, fmt.Errorf("source %q: give the password with --password-file or $QUILL_IMPORT_PASSWORD, not in the URL", name)
	}
	if out.Host == "" {
		return nil, fmt.Errorf("source %q: no host", name)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("source %q: a path is not understood (every folder is imported)", name)
	}
	out.Username = u.User.Username()
	out.Addr = net.JoinHostPort(out.Host, port)
	return out, nil
}

// loopback reports whether host is this machine, where a password may
// cross without TLS.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DialIMAP connects and logs in: imaps:// with implicit TLS, imap:// with
// STARTTLS, or in the clear only to a loopback address. tlsConf may be nil
// (the system's roots).
func DialIMAP(src *SourceURL, password string, tlsConf *tls.Config) (*IMAPSource, error) {
	if tlsConf == nil {
		tlsConf = &tls.Config{}
	}
	tlsConf = tlsConf.Clone()
	if tlsConf.ServerName == "" {
		tlsConf.ServerName = src.Host
	}
	conn, err := net.DialTimeout("tcp", src.Addr, dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", src.Addr, err)
	}
	dc := &deadlineConn{Conn: conn}
	opts := &imapclient.Options{TLSConfig: tlsConf}
	var c *imapclient.Client
	switch {
	case src.TLS:
		tc := tls.Client(dc, tlsConf)
		dc.arm()
		if err := tc.Handshake(); err != nil {
			conn.Close()
			return nil, fmt.Errorf("source %s: TLS: %w", src.Addr, err)
		}
		c = imapclient.New(&deadlineConn{Conn: tc}, opts)
	case loopback(src.Host):
		c = imapclient.New(dc, opts)
	default:
		if c, err = imapclient.NewStartTLS(dc, opts); err != nil {
			return nil, fmt.Errorf("source %s: STARTTLS (needed to send a password to another host; imaps:// for implicit TLS): %w", src.Addr, err)
		}
	}
	if err := c.WaitGreeting(); err != nil {
		c.Close()
		return nil, fmt.Errorf("source %s: greeting: %w", src.Addr, err)
	}
	if c.Caps().Has(imap.CapLoginDisabled) {
		err = c.Authenticate(sasl.NewPlainClient("", src.Username, password))
	} else {
		err = c.Login(src.Username, password).Wait()
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("source %s: login as %s: %w", src.Addr, src.Username, err)
	}
	s := &IMAPSource{c: c}
	if c.Caps().Has(imap.CapNamespace) {
		if ns, err := c.Namespace().Wait(); err == nil && len(ns.Personal) > 0 {
			s.prefix = ns.Personal[0].Prefix
		}
	}
	return s, nil
}

// deadlineConn gives every read and write ioTimeout.
type deadlineConn struct{ net.Conn }

func (d *deadlineConn) arm() { d.Conn.SetDeadline(time.Now().Add(ioTimeout)) }

func (d *deadlineConn) Read(b []byte) (int, error) {
	d.Conn.SetReadDeadline(time.Now().Add(ioTimeout))
	return d.Conn.Read(b)
}

func (d *deadlineConn) Write(b []byte) (int, error) {
	d.Conn.SetWriteDeadline(time.Now().Add(ioTimeout))
	return d.Conn.Write(b)
}

// Folders implements Source: every folder LIST shows but those marked
// \Noselect or \NonExistent, with RFC 6154 attributes when the server
// has SPECIAL-USE, and the subscriptions LSUB shows.
func (s *IMAPSource) Folders() ([]Folder, error) {
	opts := &imap.ListOptions{}
	if s.c.Caps().Has(imap.CapSpecialUse) {
		opts.ReturnSpecialUse = true
	}
	list, err := s.c.List("", "*", opts).Collect()
	if err != nil {
		return nil, fmt.Errorf("source: LIST: %w", err)
	}
	subs := map[string]bool{}
	if sl, err := s.c.List("", "*", &imap.ListOptions{SelectSubscribed: true}).Collect(); err == nil {
		for _, l := range sl {
			subs[l.Mailbox] = true
		}
	}
	var out []Folder
	for _, l := range list {
		if slices.Contains(l.Attrs, imap.MailboxAttrNoSelect) || slices.Contains(l.Attrs, imap.MailboxAttrNonExistent) {
			continue
		}
		f := Folder{Name: l.Mailbox, Path: MapName(l.Mailbox, l.Delim, s.prefix), Src: l.Mailbox, Subscribed: subs[l.Mailbox]}
		for _, a := range l.Attrs {
			if slices.ContainsFunc(specialUses, func(u string) bool { return strings.EqualFold(u, string(a)) }) {
				f.SpecialUse = string(a)
			}
		}
		if f.Path == "" {
			continue
		}
		out = append(out, f)
	}
	sortFolders(out, false)
	return out, nil
}

// List implements Source: EXAMINE, then UID FETCH 1:* (UID FLAGS
// INTERNALDATE RFC822.SIZE BODY.PEEK[HEADER]), each header read for the
// key and dropped.
func (s *IMAPSource) List(f *Folder) ([]Item, error) {
	sel, err := s.c.Select(f.Src, &imap.SelectOptions{ReadOnly: true}).Wait()
	if err != nil {
		return nil, fmt.Errorf("source folder %q: EXAMINE: %w", f.Name, err)
	}
	if sel.NumMessages == 0 {
		return nil, nil
	}
	var set imap.UIDSet
	set.AddRange(1, 0) // 1:*
	cmd := s.c.Fetch(set, &imap.FetchOptions{UID: true, Flags: true, InternalDate: true, RFC822Size: true,
		BodySection: []*imap.FetchItemBodySection{{Specifier: imap.PartSpecifierHeader, Peek: true}}})
	var items []Item
	for {
		msg := cmd.Next()
		if msg == nil {
			break
		}
		var it Item
		var header []byte
		for {
			d := msg.Next()
			if d == nil {
				break
			}
			switch d := d.(type) {
			case imapclient.FetchItemDataUID:
				it.UID = uint32(d.UID)
			case imapclient.FetchItemDataFlags:
				for _, fl := range d.Flags {
					it.Flags = append(it.Flags, string(fl))
				}
			case imapclient.FetchItemDataInternalDate:
				it.Date = d.Time.UTC()
			case imapclient.FetchItemDataRFC822Size:
				it.Size = d.Size
			case imapclient.FetchItemDataBodySection:
				if d.Literal != nil {
					header, _ = io.ReadAll(d.Literal)
				}
			}
		}
		it.Flags = CleanFlags(it.Flags)
		it.Key = Key(header)
		it.ID = fmt.Sprintf("UID %d", it.UID)
		items = append(items, it)
	}
	if err := cmd.Close(); err != nil {
		return nil, fmt.Errorf("source folder %q: FETCH: %w", f.Name, err)
	}
	slices.SortFunc(items, func(a, b Item) int { return int(a.UID) - int(b.UID) })
	return items, nil
}

// Fetch implements Source: UID FETCH (BODY.PEEK[]) in batches of
// fetchBatch messages or fetchBatchBytes, each body handed on as it
// arrives.
func (s *IMAPSource) Fetch(f *Folder, items []Item, fn func(Item, []byte, error) error) error {
	if len(items) == 0 {
		return nil
	}
	if _, err := s.c.Select(f.Src, &imap.SelectOptions{ReadOnly: true}).Wait(); err != nil {
		return fmt.Errorf("source folder %q: EXAMINE: %w", f.Name, err)
	}
	for len(items) > 0 {
		n, bytes := 0, int64(0)
		var set imap.UIDSet
		byUID := map[uint32]Item{}
		for n < len(items) && n < fetchBatch && (n == 0 || bytes+items[n].Size <= fetchBatchBytes) {
			it := items[n]
			n++
			if s.MaxSize > 0 && it.Size > s.MaxSize {
				if err := fn(it, nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooBig, it.Size, s.MaxSize)); err != nil {
					return err
				}
				continue
			}
			set.AddNum(imap.UID(it.UID))
			byUID[it.UID] = it
			bytes += it.Size
		}
		items = items[n:]
		if len(byUID) == 0 {
			continue
		}
		if err := s.fetchBatch(f, set, byUID, fn); err != nil {
			return err
		}
	}
	return nil
}

// errFn wraps an error fn returned, to tell it from the source's.
type errFn struct{ error }

func (s *IMAPSource) fetchBatch(f *Folder, set imap.UIDSet, byUID map[uint32]Item, fn func(Item, []byte, error) error) error {
	cmd := s.c.Fetch(set, &imap.FetchOptions{UID: true, BodySection: []*imap.FetchItemBodySection{{Peek: true}}})
	var stop error
	for {
		msg := cmd.Next()
		if msg == nil {
			break
		}
		var uid uint32
		var body []byte
		var rerr error
		for {
			d := msg.Next()
			if d == nil {
				break
			}
			switch d := d.(type) {
			case imapclient.FetchItemDataUID:
				uid = uint32(d.UID)
			case imapclient.FetchItemDataBodySection:
				if d.Literal != nil {
					body, rerr = io.ReadAll(d.Literal)
				}
			}
		}
		it, ok := byUID[uid]
		if !ok || stop != nil {
			continue
		}
		delete(byUID, uid)
		if body == nil && rerr == nil {
			rerr = errors.New("the server sent no body")
		}
		if err := fn(it, body, rerr); err != nil {
			stop = errFn{err}
		}
	}
	err := cmd.Close()
	if stop != nil {
		return stop.(errFn).error
	}
	if err != nil {
		return fmt.Errorf("source folder %q: FETCH: %w", f.Name, err)
	}
	// Messages the server did not send (expunged meanwhile).
	for _, it := range byUID {
		if err := fn(it, nil, errors.New("the server sent nothing for it (expunged at the source since?)")); err != nil {
			return err
		}
	}
	return nil
}

// Close logs out.
func (s *IMAPSource) Close() error {
	s.c.Logout().Wait()
	return s.c.Close()
}

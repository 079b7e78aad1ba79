package imap

import (
	"github.com/emersion/go-imap/v2"
	lru "github.com/hashicorp/golang-lru"
)

// The header cache keeps the header of messages a FETCH read for header
// fields or ENVELOPE only (what a client lists a mailbox with): a message's
// bytes never change, so the next listing, by any session of the node,
// reads none of them again. Dovecot answers the same FETCH from its cache
// file; without one, each listed message cost a body read and the FETCH of
// 160 headers took several times Dovecot's (issue 13).

const (
	// headerCacheEntries bounds the headers kept per node.
	headerCacheEntries = 8192
	// maxCachedHeader is the largest header kept: with the count, the
	// cache holds at most 64 MiB, a few MiB for ordinary mail.
	maxCachedHeader = 8 << 10
)

func newHeaderCache() *lru.Cache {
	c, err := lru.New(headerCacheEntries)
	if err != nil {
		panic(err) // only for a size <= 0
	}
	return c
}

// headerOnly reports whether a FETCH needs no more of each message than its
// header: ENVELOPE, and sections HEADER, HEADER.FIELDS and
// HEADER.FIELDS.NOT of the message itself.
func headerOnly(options *imap.FetchOptions, preview, emailID bool) bool {
	if options.BodyStructure != nil || len(options.BinarySection) > 0 || len(options.BinarySectionSize) > 0 || preview || emailID {
		return false
	}
	for _, bs := range options.BodySection {
		if len(bs.Part) > 0 || bs.Specifier != imap.PartSpecifierHeader {
			return false
		}
	}
	return true
}

// header returns a message's header (with the blank line after it), from
// the cache or from its bytes.
func (s *session) header(m *msgState) ([]byte, error) {
	key := s.user + "\x00" + m.id
	if v, ok := s.srv.headers.Get(key); ok {
		return v.([]byte), nil
	}
	h, err := s.headerBytes(m.id)
	if err != nil {
		return nil, err
	}
	if len(h) <= maxCachedHeader {
		h = append([]byte(nil), h...) // not the whole body's array (a small message's)
		s.srv.headers.Add(key, h)
	}
	return h, nil
}

// headerBytes reads a message's header: from the start of its file for a
// large body held here, whose part table says where the header ends (not
// the whole body, as Body would); from its bytes otherwise.
func (s *session) headerBytes(id string) ([]byte, error) {
	if bp, ok := s.srv.store.(BodyParter); ok {
		r, t, err := bp.OpenParts(s.ctx(), s.user, id)
		if err != nil {
			return nil, err
		}
		if t != nil {
			defer r.Close()
			if t.HeaderLen <= maxPartHeader {
				return newPartsBody(id, r, t).read(0, t.HeaderLen)
			}
		}
	}
	raw, err := s.srv.store.Body(s.ctx(), s.user, id)
	if err != nil {
		return nil, err
	}
	return raw[:headerLen(raw)], nil
}

package imap

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/metrics"
)

// memIndex is one message's terms as fts.Candidates reads them (doc 1).
type memIndex map[string][]string

func (m memIndex) Terms(field string) ([]string, error) { return m[field], nil }
func (m memIndex) Postings(field, term string) ([]uint32, error) {
	for _, t := range m[field] {
		if t == term {
			return []uint32{1}, nil
		}
	}
	return nil, nil
}

// indexMisses reports a string criterion that the message matches but the
// text index would rule out, or that it does not match but the index would
// take as proven: the index must never be narrower than SEARCH, nor its
// proofs wider.
func indexMisses(raw []byte, key, needle string) string {
	var c imap.SearchCriteria
	var q fts.Query
	var ok bool
	switch key {
	case "TEXT":
		c.Text = []string{needle}
		q, ok = fts.QueryText(needle)
	case "BODY":
		c.Body = []string{needle}
		q, ok = fts.QueryBody(needle)
	default:
		c.Header = []imap.SearchCriteriaHeaderField{{Key: key, Value: needle}}
		q, ok = fts.QueryHeader(key, needle)
	}
	sm := &searchMsg{loaded: true, raw: raw, m: &msgState{}}
	ev := &evaluator{saved: map[uint32]bool{}}
	matches := ev.match(&c, sm)
	if !ok {
		return ""
	}
	if sure, err := fts.Sure(memIndex(fts.Terms(raw)), q); err != nil || (sure.Has(1) && !matches) {
		return fmt.Sprintf("%s %q does not match the message but the index proves it does (err %v)", key, needle, err)
	}
	if !matches {
		return ""
	}
	docs, narrowed, err := fts.Candidates(memIndex(fts.Terms(raw)), q)
	if err != nil || (narrowed && !docs.Has(1)) {
		return fmt.Sprintf("%s %q matches the message but the index rules it out (err %v)", key, needle, err)
	}
	return ""
}

var indexKeys = []string{"TEXT", "BODY", "Subject", "From", "To", "Cc", "X-Tag"}

func TestTextIndexNeverNarrower(t *testing.T) {
	msgs := []string{
		multipartMsg, exactMsg,
		"From: \"Caf\u00e9 Owner\" <owner (the boss)@ (main) caf\u00e9.example>\r\nTo: =?utf-8?q?J=C3=BCrgen?= <j@example.org>\r\nSubject: =?iso-8859-1?q?R=E9sum=E9?= of the topic 7 meeting\r\nX-Tag: alpha-beta_gamma\r\n\r\nHello W\u00f6rld, the word12345 is here.\r\n",
		"Subject: Long " + strings.Repeat("abcdefghij", 80) + "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\nSoft=\r\nbreak and caf=C3=A9 and " + strings.Repeat("x", 200) + "yz\r\n",
		// Addresses SEARCH matches as parsed, not as written.
		"From: <jo hn@x.org>, <jo(c)hn@y.org>, \"Jo\\hn\" <a@b.org>, \"Jo\"hn <c@d.org>\r\nTo: undisclosed, <@route:e@f.org>\r\nCc: group: g@h.org;\r\n\r\nx\r\n",
		"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain; charset=koi8-r\r\nContent-Transfer-Encoding: base64\r\n\r\n8NLJ18XU\r\n--b\r\nContent-Type: application/pdf; name=report.pdf\r\nContent-Transfer-Encoding: base64\r\n\r\nJVBERi0xLjQK\r\n--b--\r\n",
	}
	needles := []string{"topic 7", "c 7 m", "word12345", "ord123", "caf\u00e9", "CAF\u00c9", "r\u00e9sum\u00e9", "owner@caf\u00e9", "the boss", "j\u00fcrgen",
		"alpha-beta", "a-b", "hello w\u00f6", "softbreak", "soft=", "привет", "report.pdf", "pdf", "x" + strings.Repeat("x", 100) + "yz",
		"john", "john@x", "john@y.org", "jo hn", "missing_domain", "undisclosed@", "e@f.org", "g@h", "group",
		strings.Repeat("abcdefghij", 5), "fghij" + strings.Repeat("abcdefghij", 10), "e", "7", " ", "-", "@"}
	for i, m := range msgs {
		for _, key := range indexKeys {
			for _, n := range needles {
				if msg := indexMisses([]byte(m), key, n); msg != "" {
					t.Errorf("message %d: %s", i, msg)
				}
			}
		}
	}
	// And it does narrow: a word the message lacks rules it out.
	docs, ok, _ := fts.Candidates(memIndex(fts.Terms([]byte(msgs[2]))), fts.Query{Fields: []string{fts.FieldBody}, Needle: "word54321"})
	if !ok || docs.Has(1) {
		t.Fatalf("BODY word54321: narrowed %v, candidate %v; want ruled out", ok, docs.Has(1))
	}
}

// FuzzTextIndex checks, for any message and any string, that a message
// SEARCH matches is never ruled out by its terms.
func FuzzTextIndex(f *testing.F) {
	f.Add([]byte(multipartMsg), "body", uint8(0))
	f.Add([]byte("Subject: a b\r\nFrom: x@y\r\n\r\nhello"), "a b", uint8(2))
	f.Add([]byte("From: <jo (c) hn@x.org>, \"Jo\\hn\" <a@b>\r\nTo: undisclosed\r\n\r\n"), "john", uint8(3))
	f.Fuzz(func(t *testing.T, raw []byte, needle string, k uint8) {
		if msg := indexMisses(raw, indexKeys[int(k)%len(indexKeys)], needle); msg != "" {
			t.Fatal(msg)
		}
	})
}

// plainStore is the store without its text index: SEARCH reads every
// message, the answer the index must not change.
type plainStore struct{ Store }

func TestSearchWithTextIndex(t *testing.T) {
	e := newEnv(t)
	for i := range 300 {
		e.deliver(fmt.Sprintf("From: Sender %d <s%d@example.org>\r\nTo: u@example.org\r\nSubject: topic %d of %d\r\nMessage-ID: <m%d@example.org>\r\n\r\nbody line with word%d and common text\r\n", i%7, i%7, i%40, i%3, i, i*37%1000))
	}
	e.deliver("From: x@example.org\r\nSubject: =?utf-8?q?caf=C3=A9?=\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\nbGEgdHLDqHMgZ3JhbmRlIGNhZmV0acOocmU=\r\n")
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := e.core.Boxes.TextQueued()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still not indexed", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := e.raw(true)
	r.ok("SELECT INBOX")
	mb, err := e.store.Mailbox(context.Background(), testUser, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	// The index itself rules out all but the one message with word370.
	a, err := e.store.TextExcluded(context.Background(), testUser, uint64(mb.UIDValidity), []fts.Query{{Fields: []string{fts.FieldBody}, Needle: "word370"}})
	if err != nil || len(a.Skip) != 300 {
		t.Fatalf("BODY word370: index excludes %v (err %v), want 300 of 301", a, err)
	}

	searches := []string{
		`BODY word370`, `TEXT word37`, `BODY "ord99"`, `SUBJECT "topic 7"`, `SUBJECT "topic 7 "`, `FROM "sender 3"`, `FROM s3@example`,
		`TEXT "café"`, `BODY "très grande"`, `SUBJECT café`, `HEADER Message-ID "m12@"`, `TEXT "with word1"`, `NOT BODY word370`,
		`OR BODY word370 SUBJECT "topic 39"`, `BODY ""`, `TEXT e`, `SUBJECT "of 2" BODY "common"`, `TO nobody`,
		`SUBJECT "topic 3" NOT SUBJECT "of 1"`, `SUBJECT "TOPIC 1" SUBJECT "of 0"`, `SUBJECT "caf"`, `SUBJECT ""`,
	}
	// And a session's SEARCH goes through it: the 300 are not read.
	before := textExcluded(t)
	r.ok("UID SEARCH BODY word370")
	if d := textExcluded(t) - before; d != 300 {
		t.Fatalf("UID SEARCH BODY word370: the index ruled out %v messages, want 300", d)
	}
	// A SUBJECT the index proves is not read either: the 300 messages
	// whose subjects hold "topic" are matched from it.
	before = textSure(t)
	r.ok(`UID SEARCH SUBJECT "topic"`)
	if d := textSure(t) - before; d != 300 {
		t.Fatalf("UID SEARCH SUBJECT topic: the index proved %v messages, want 300", d)
	}
	for _, q := range searches {
		got := strings.Join(r.ok("UID SEARCH CHARSET UTF-8 "+q), "\n")
		want := searchWithout(t, e, q)
		if got != want {
			t.Errorf("UID SEARCH %s\n with index: %q\n reading all: %q", q, got, want)
		}
	}
}

// searchWithout runs a search on a server over the same store without
// its text index.
func searchWithout(t *testing.T, e *env, q string) string {
	t.Helper()
	srv := New(plainStore{e.store}, e.srv.auth, e.srv.cfg)
	defer srv.Shutdown(context.Background())
	pe := &env{t: t, srv: srv, core: e.core, store: e.store}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pe.addr = l.Addr().String()
	go srv.Serve(l)
	r := pe.raw(true)
	r.ok("SELECT INBOX")
	return strings.Join(r.ok("UID SEARCH CHARSET UTF-8 "+q), "\n")
}

// textExcluded reads the node's count of messages its text index ruled out.
func textExcluded(t *testing.T) float64 { return counter(t, metrics.TextExcluded) }

// textSure reads the node's count of matches its text index proved.
func textSure(t *testing.T) float64 { return counter(t, metrics.TextSure) }

func counter(t *testing.T, c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

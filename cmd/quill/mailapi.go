package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/migrate"
)

// mailTimeout bounds one message stored or read through the admin API: a
// message of the largest size crosses loopback and is replicated well
// within it.
const mailTimeout = 2 * time.Minute

// listIdle bounds the wait for the next line of a message listing: a
// listing with keys reads every body at the node, steadily.
const listIdle = 2 * time.Minute

// send makes one admin API call and returns the response of a success;
// a failure's JSON error becomes the error.
func (c *adminClient) send(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.server, "/")+path, body)
	if err != nil {
		return nil, err
	}
	if tok, _ := c.tokenValue(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API %s: %w (is `quill serve` running?)", c.server, err)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct{ Error string }
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return nil, &apiError{code: resp.StatusCode, msg: e.Error}
	}
	return nil, &apiError{code: resp.StatusCode, msg: fmt.Sprintf("admin API %s %s: %s", method, path, resp.Status)}
}

// apiError is an admin API call's refusal, with its HTTP status.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

// mailAPI is the admin API's mail calls for one user.
type mailAPI struct {
	c    *adminClient
	user string
}

func (m *mailAPI) path(p string) string { return "/api/users/" + url.PathEscape(m.user) + p }

// mailboxesReply is GET /api/users/{address}/mailboxes.
type mailboxesReply struct {
	Mailboxes []struct {
		migrate.Mailbox
		UIDValidity uint32 `json:"uidvalidity"`
		UIDNext     uint32 `json:"uidnext"`
	} `json:"mailboxes"`
	MaxMessageSize int64 `json:"max_message_size"`
}

func (m *mailAPI) mailboxes() (*mailboxesReply, error) {
	var out mailboxesReply
	if err := m.c.do("GET", m.path("/mailboxes"), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ensure makes a mailbox unless it exists, and subscribes it when asked.
func (m *mailAPI) ensure(name, specialUse string, subscribed bool) error {
	return m.c.do("POST", m.path("/mailboxes"), map[string]any{"name": name, "special_use": specialUse, "subscribed": subscribed}, nil)
}

// list returns a mailbox's messages (their keys when asked: the node
// reads every body) and its UIDVALIDITY.
func (m *mailAPI) list(name string, keys bool) ([]migrate.Item, uint32, error) {
	q := url.Values{"mailbox": {name}}
	if keys {
		q.Set("keys", "1")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := m.c.send(ctx, "GET", m.path("/messages?"+q.Encode()), "application/json", nil)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	validity, _ := strconv.ParseUint(resp.Header.Get("X-Quill-UIDValidity"), 10, 32)
	watch := time.AfterFunc(listIdle, cancel)
	defer watch.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var items []migrate.Item
	for sc.Scan() {
		watch.Reset(listIdle)
		var l struct {
			UID   uint32    `json:"uid"`
			ID    string    `json:"id"`
			Size  int64     `json:"size"`
			Date  time.Time `json:"date"`
			Flags []string  `json:"flags"`
			Key   string    `json:"key"`
			End   *int      `json:"end"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, 0, fmt.Errorf("mailbox %q listing: %w", name, err)
		}
		if l.End != nil {
			return items, uint32(validity), nil
		}
		items = append(items, migrate.Item{UID: l.UID, ID: l.ID, Size: l.Size, Date: l.Date, Flags: l.Flags, Key: l.Key})
	}
	return nil, 0, fmt.Errorf("mailbox %q listing cut short after %d messages (see the node's log): %v", name, len(items), sc.Err())
}

// appendMessage stores one message.
func (m *mailAPI) appendMessage(name string, raw []byte, flags []string, date time.Time) error {
	q := url.Values{"mailbox": {name}, "flag": flags}
	if !date.IsZero() {
		q.Set("date", date.UTC().Format(time.RFC3339))
	}
	ctx, cancel := context.WithTimeout(context.Background(), mailTimeout)
	defer cancel()
	resp, err := m.c.send(ctx, "POST", m.path("/messages?"+q.Encode()), "message/rfc822", bytes.NewReader(raw))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// setFlags sets the flags of messages of a mailbox.
func (m *mailAPI) setFlags(name string, uids []uint32, flags []string) error {
	return m.c.do("POST", m.path("/flags"), map[string]any{"mailbox": name, "uids": uids, "flags": flags}, nil)
}

// body reads one message.
func (m *mailAPI) body(id string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), mailTimeout)
	defer cancel()
	resp, err := m.c.send(ctx, "GET", m.path("/messages/"+url.PathEscape(id)), "application/json", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

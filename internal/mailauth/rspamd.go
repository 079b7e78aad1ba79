package mailauth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Rspamd asks a real rspamd (https://rspamd.com) for a spam verdict over
// its HTTP protocol: the message is POSTed to /checkv2 with the envelope in
// request headers, and the answer is JSON with a score and an action
// (rspamd's protocol documentation). Written here: the protocol is one
// request, and no well-kept Go client exists.
type Rspamd struct {
	// URL is the normal worker's base URL (http://127.0.0.1:11333).
	URL    string
	Client *http.Client
}

// rspamdTimeout bounds one check: rspamd answers in milliseconds, but its
// own DNS lookups may take a few seconds.
const rspamdTimeout = 15 * time.Second

// maxRspamdReply bounds the JSON read back.
const maxRspamdReply = 1 << 20

// SpamResult is rspamd's verdict.
type SpamResult struct {
	Score    float64 `json:"score"`
	Required float64 `json:"required_score"`
	// Action is rspamd's: "no action", "greylist", "add header",
	// "rewrite subject", "soft reject" or "reject".
	Action string `json:"action"`
}

// Check asks rspamd about one message.
func (r *Rspamd) Check(ctx context.Context, ip net.IP, helo, mailFrom string, rcpts []string, msg []byte) (SpamResult, error) {
	ctx, cancel := context.WithTimeout(ctx, rspamdTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(r.URL, "/")+"/checkv2", bytes.NewReader(msg))
	if err != nil {
		return SpamResult{}, fmt.Errorf("rspamd %s: %w", r.URL, err)
	}
	if ip != nil {
		req.Header.Set("IP", ip.String())
	}
	req.Header.Set("Helo", oneLine(helo))
	req.Header.Set("From", oneLine(mailFrom))
	for _, rc := range rcpts {
		req.Header.Add("Rcpt", oneLine(rc))
	}
	req.Header.Set("Content-Length", strconv.Itoa(len(msg)))
	c := r.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return SpamResult{}, fmt.Errorf("rspamd %s: %w", r.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxRspamdReply))
	if err != nil {
		return SpamResult{}, fmt.Errorf("rspamd %s: reading the answer: %w", r.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return SpamResult{}, fmt.Errorf("rspamd %s: %s: %s", r.URL, resp.Status, oneLine(string(body)))
	}
	var res SpamResult
	if err := json.Unmarshal(body, &res); err != nil {
		return SpamResult{}, fmt.Errorf("rspamd %s: answer is not its JSON: %w", r.URL, err)
	}
	return res, nil
}

// applySpam folds rspamd's verdict into v: reject refuses the message,
// soft reject and greylist ask for a later try, add header and rewrite
// subject send it to Junk; the score goes in a header field either way.
func (v *Verdict) applySpam(res SpamResult) {
	v.Score = res.Score
	switch res.Action {
	case "reject":
		v.Spam = true
	case "soft reject", "greylist":
		v.Defer = true
	case "add header", "rewrite subject":
		v.Quarantine = true
	}
	v.Header += fmt.Sprintf("X-Spam-Score: %.2f / %.2f (rspamd: %s)\r\n", res.Score, res.Required, oneLine(res.Action))
}

package queue

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-message"
	"github.com/emersion/go-message/textproto"
)

// TestDSNIsAMultipartReport parses a failure report as a client would:
// multipart/report with the human part, message/delivery-status with the
// RFC 3464 fields per recipient, and the original header without its
// Return-Path.
func TestDSNIsAMultipartReport(t *testing.T) {
	e := entry("bob@a.example", "carol@b.example")
	e.Recipients[0].LastReply, e.Recipients[0].Remote = "550 5.1.1 no such user", "mx.a.example [192.0.2.1:25]"
	e.Recipients[0].LastTry = t0
	e.Recipients[1].LastReply = "delivery time expired after 120h0m0s in the queue; last reply: 451 4.4.1 later"
	orig := "Return-Path: <alice@example.org>\r\nFrom: alice@example.org\r\nSubject: hello\r\n\r\nbody\r\n"
	raw := DSN{Hostname: "mail.example.org", Entry: e, Recipients: e.Recipients, Message: []byte(orig), Now: t0}.Build()

	m, err := message.Read(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	ct, params, _ := m.Header.ContentType()
	if ct != "multipart/report" || params["report-type"] != "delivery-status" {
		t.Fatalf("content type %s %v", ct, params)
	}
	if m.Header.Get("Auto-Submitted") != "auto-replied" || !strings.Contains(m.Header.Get("From"), "MAILER-DAEMON@mail.example.org") {
		t.Fatalf("header: %v", m.Header)
	}
	mr := m.MultipartReader()
	var types []string
	var status, headers string
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ct, _, _ := p.Header.ContentType()
		types = append(types, ct)
		b, _ := io.ReadAll(p.Body)
		switch ct {
		case "message/delivery-status":
			status = string(b)
		case "text/rfc822-headers":
			headers = string(b)
		}
	}
	if strings.Join(types, ",") != "text/plain,message/delivery-status,text/rfc822-headers" {
		t.Fatalf("parts %v", types)
	}
	// The per-message block, then one block per recipient (RFC 3464 §2.1).
	blocks := strings.Split(strings.TrimSpace(status), "\r\n\r\n")
	if len(blocks) != 3 {
		t.Fatalf("%d blocks in the delivery status, want 3:\n%s", len(blocks), status)
	}
	for i, b := range blocks {
		h, err := textproto.ReadHeader(bufioReader(b + "\r\n\r\n"))
		if err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
		switch i {
		case 0:
			if h.Get("Reporting-MTA") != "dns; mail.example.org" || h.Get("Arrival-Date") == "" {
				t.Errorf("per-message fields: %q", b)
			}
		case 1:
			if h.Get("Final-Recipient") != "rfc822; bob@a.example" || h.Get("Action") != "failed" || h.Get("Status") != "5.1.1" ||
				h.Get("Remote-MTA") != "dns; mx.a.example" || h.Get("Diagnostic-Code") != "smtp; 550 5.1.1 no such user" {
				t.Errorf("bob's fields: %q", b)
			}
		case 2:
			// Expired after temporary failures: delivery time expired,
			// as a permanent status in a failure report (RFC 3463).
			if h.Get("Action") != "failed" || h.Get("Status") != "5.4.7" {
				t.Errorf("carol's fields: %q", b)
			}
		}
	}
	if strings.Contains(headers, "Return-Path") || !strings.Contains(headers, "Subject: hello") || strings.Contains(headers, "body") {
		t.Errorf("quoted header: %q", headers)
	}
}

func TestDelayWarningSaysDelayedAndUntilWhen(t *testing.T) {
	e := entry("bob@a.example")
	e.Recipients[0].LastReply = "451 4.7.1 greylisted"
	raw := string(DSN{Hostname: "h", Entry: e, Recipients: e.Recipients, Delayed: true, RetryUntil: t0.Add(120 * time.Hour),
		Message: []byte("Subject: x\r\n\r\n"), Now: t0}.Build())
	for _, want := range []string{"Action: delayed", "Status: 4.7.1", "Will-Retry-Until: ", "Subject: Delayed Mail"} {
		if !strings.Contains(raw, want) {
			t.Errorf("warning lacks %q:\n%s", want, raw)
		}
	}
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

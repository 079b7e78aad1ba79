package queue

// Delivery status notifications (RFC 3464, in a multipart/report of RFC
// 6522): a failure report when recipients were refused for good or the
// queue lifetime ran out, and one delay warning when a message has waited
// long. The report goes to the envelope sender with the null sender, so a
// report that cannot be delivered is never reported in turn (RFC 5321
// §4.5.5).

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"strings"
	"time"
)

// maxReportedHeader bounds the original header quoted in a report.
const maxReportedHeader = 64 << 10

// DSN is what a report says.
type DSN struct {
	// Hostname is the reporting MTA.
	Hostname string
	Entry    *Entry
	// Recipients are those reported on; Delayed makes it a warning.
	Recipients []Recipient
	Delayed    bool
	// RetryUntil is when the queue gives up (for a warning).
	RetryUntil time.Time
	// Message is the original message; its header is quoted.
	Message []byte
	Now     time.Time
}

// Build returns the report as a message.
func (d DSN) Build() []byte {
	var b bytes.Buffer
	boundary := randomBoundary()
	subject := "Undelivered Mail Returned to Sender"
	if d.Delayed {
		subject = "Delayed Mail (still being retried)"
	}
	var id [12]byte
	rand.Read(id[:])
	fmt.Fprintf(&b, "From: Mail Delivery System <MAILER-DAEMON@%s>\r\n", d.Hostname)
	fmt.Fprintf(&b, "To: <%s>\r\n", d.Entry.From)
	fmt.Fprintf(&b, "Subject: %s\r\n", subject)
	fmt.Fprintf(&b, "Date: %s\r\n", d.Now.Format(time.RFC1123Z))
	fmt.Fprintf(&b, "Message-ID: <%s@%s>\r\n", hex.EncodeToString(id[:]), d.Hostname)
	// RFC 3834 §5: an automatic message; clients and vacation responders
	// do not answer it.
	b.WriteString("Auto-Submitted: auto-replied\r\n")
	b.WriteString("MIME-Version: 1.0\r\n")
	fmt.Fprintf(&b, "Content-Type: multipart/report; report-type=delivery-status;\r\n\tboundary=\"%s\"\r\n\r\n", boundary)
	b.WriteString("This is a MIME-encapsulated delivery status notification.\r\n")

	w := multipart.NewWriter(&b)
	w.SetBoundary(boundary)
	// The human-readable part.
	h := textproto.MIMEHeader{}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Description", "Notification")
	p, _ := w.CreatePart(h)
	if d.Delayed {
		fmt.Fprintf(p, "This is the mail system at %s.\r\n\r\nYour message could not be delivered yet to the recipients below. It stays\r\nin the queue and will be tried again until %s;\r\nyou need not send it again.\r\n\r\n",
			d.Hostname, d.RetryUntil.UTC().Format(time.RFC1123Z))
	} else {
		fmt.Fprintf(p, "This is the mail system at %s.\r\n\r\nYour message could not be delivered to the recipients below.\r\n\r\n", d.Hostname)
	}
	for _, r := range d.Recipients {
		fmt.Fprintf(p, "<%s>: %s\r\n", r.Address, orNone(r.LastReply))
	}

	// The machine-readable part (RFC 3464 §2.2, §2.3).
	h = textproto.MIMEHeader{}
	h.Set("Content-Type", "message/delivery-status")
	h.Set("Content-Description", "Delivery report")
	p, _ = w.CreatePart(h)
	fmt.Fprintf(p, "Reporting-MTA: dns; %s\r\n", d.Hostname)
	fmt.Fprintf(p, "X-Quill-Queue-ID: %s\r\n", d.Entry.ID)
	fmt.Fprintf(p, "Arrival-Date: %s\r\n", d.Entry.Created.Format(time.RFC1123Z))
	for _, r := range d.Recipients {
		p.Write([]byte("\r\n"))
		fmt.Fprintf(p, "Final-Recipient: rfc822; %s\r\n", r.Address)
		action, status := "failed", statusOfRecord(r, "5.0.0")
		if d.Delayed {
			action, status = "delayed", statusOfRecord(r, "4.0.0")
		}
		fmt.Fprintf(p, "Action: %s\r\n", action)
		fmt.Fprintf(p, "Status: %s\r\n", status)
		if host, _, _ := strings.Cut(r.Remote, " "); host != "" {
			fmt.Fprintf(p, "Remote-MTA: dns; %s\r\n", host)
		}
		if code := replyCode(r.LastReply); code != "" {
			fmt.Fprintf(p, "Diagnostic-Code: smtp; %s\r\n", r.LastReply)
		} else if r.LastReply != "" {
			fmt.Fprintf(p, "Diagnostic-Code: X-Quill; %s\r\n", r.LastReply)
		}
		if !r.LastTry.IsZero() {
			fmt.Fprintf(p, "Last-Attempt-Date: %s\r\n", r.LastTry.Format(time.RFC1123Z))
		}
		if d.Delayed {
			fmt.Fprintf(p, "Will-Retry-Until: %s\r\n", d.RetryUntil.Format(time.RFC1123Z))
		}
	}

	// The original header (RFC 6522 §3, text/rfc822-headers).
	h = textproto.MIMEHeader{}
	h.Set("Content-Type", "text/rfc822-headers")
	h.Set("Content-Description", "Undelivered message headers")
	p, _ = w.CreatePart(h)
	p.Write(headerOf(d.Message))
	w.Close()
	return b.Bytes()
}

// headerOf returns a message's header, without its trace fields'
// Return-Path, bounded by maxReportedHeader.
func headerOf(msg []byte) []byte {
	end := bytes.Index(msg, []byte("\r\n\r\n"))
	if end < 0 {
		end = len(msg)
	} else {
		end += 2
	}
	end = min(end, maxReportedHeader)
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(msg[:end]))
	sc.Buffer(make([]byte, 0, 4096), maxReportedHeader+2)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.ToLower(line), "return-path:") {
			continue
		}
		out.WriteString(line)
		out.WriteString("\r\n")
	}
	return out.Bytes()
}

// replyCode returns the SMTP code a recorded reply starts with, if any.
func replyCode(reply string) string {
	if len(reply) >= 3 && reply[0] >= '2' && reply[0] <= '5' && reply[1] >= '0' && reply[1] <= '9' && reply[2] >= '0' && reply[2] <= '9' &&
		(len(reply) == 3 || reply[3] == ' ') {
		return reply[:3]
	}
	return ""
}

// statusOfRecord takes the enhanced status from a recorded reply ("550
// 5.1.1 ..."), or def, with its class made to match def's (a temporary
// code in a failure report after expiry becomes permanent, RFC 3463 §3.1).
func statusOfRecord(r Recipient, def string) string {
	if strings.HasPrefix(r.LastReply, expiredReply) {
		return def[:1] + ".4.7" // delivery time expired (RFC 3463 §3.5)
	}
	f := strings.Fields(r.LastReply)
	st := def
	if len(f) >= 2 && replyCode(r.LastReply) != "" && isStatus(f[1]) {
		st = f[1]
	} else if len(f) >= 1 && isStatus(f[0]) {
		st = f[0]
	}
	return def[:1] + st[1:]
}

func isStatus(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) != 3 || len(s) > 11 {
		return false
	}
	for i, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" || (i == 0 && p != "2" && p != "4" && p != "5") {
			return false
		}
	}
	return true
}

func randomBoundary() string {
	var b [16]byte
	rand.Read(b[:])
	return "quill-report-" + hex.EncodeToString(b[:])
}

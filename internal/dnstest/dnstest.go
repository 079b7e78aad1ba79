// Package dnstest serves DNS records from memory on a loopback UDP port,
// for tests of what looks names up (MX and address lookups of the
// outbound queue, SPF, DKIM and DMARC records): the code under test sends
// real DNS messages, through Go's resolver, to github.com/miekg/dns.
package dnstest

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// Zone is the records served, by name (without the final dot). A name
// with records of other types only answers "no data" for a type it lacks;
// a name not in the zone gets NXDOMAIN.
type Zone struct {
	A   map[string]string // name -> IPv4 address
	MX  map[string]string // name -> one mail host (preference 10)
	TXT map[string]string // name -> text (split into 255-byte strings)
}

// Serve answers from z until the test ends, and returns the server's
// address (for --dns) and a resolver that asks it.
func Serve(t testing.TB, z Zone) (string, *net.Resolver) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		w.WriteMsg(z.answer(r))
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	addr := pc.LocalAddr().String()
	return addr, &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", addr)
	}}
}

func (z Zone) answer(r *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 60}
	a, isA := z.A[name]
	mx, isMX := z.MX[name]
	txt, isTXT := z.TXT[name]
	switch {
	case q.Qtype == dns.TypeA && isA:
		m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.ParseIP(a)})
	case q.Qtype == dns.TypeMX && isMX:
		m.Answer = append(m.Answer, &dns.MX{Hdr: hdr, Preference: 10, Mx: mx + "."})
	case q.Qtype == dns.TypeTXT && isTXT:
		var parts []string
		for len(txt) > 255 {
			parts, txt = append(parts, txt[:255]), txt[255:]
		}
		m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: append(parts, txt)})
	case isA || isMX || isTXT:
	default:
		m.Rcode = dns.RcodeNameError
	}
	return m
}

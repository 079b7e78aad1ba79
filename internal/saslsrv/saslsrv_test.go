package saslsrv

import (
	"errors"
	"testing"

	"github.com/xdg-go/scram"
)

// keysFor derives SCRAM keys as userdb.DeriveSCRAM does, with a fixed
// salt and the RFC's minimum count so the tests stay fast.
func keysFor(t testing.TB, pass string) scram.StoredCredentials {
	cl, err := scram.SHA256.NewClient("", pass, "")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: "0123456789abcdef", Iters: 4096})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// outcome records what Finish was told.
type outcome struct {
	called bool
	creds  Credentials
	err    error
}

func (o *outcome) finish(c Credentials, err error) error {
	o.called, o.creds, o.err = true, c, err
	return err
}

func lookupOnly(user string, sc scram.StoredCredentials) Lookup {
	return func(u string) (scram.StoredCredentials, error) {
		if u == user {
			return sc, nil
		}
		return scram.StoredCredentials{}, NotFound
	}
}

func TestPlain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		resp    string
		user    string
		pass    string
		wantErr error
	}{
		{"plain", "\x00bob\x00pw", "bob", "pw", nil},
		{"same authz", "bob\x00bob\x00pw", "bob", "pw", nil},
		{"other authz", "eve\x00bob\x00pw", "bob", "", ErrAuthFailed},
		{"two fields", "bob\x00pw", "", "", ErrMalformed},
		{"empty password", "\x00bob\x00", "", "", ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o outcome
			s, _ := New("plain", nil, o.finish)
			ch, done, err := s.Next(nil)
			if ch != nil || done || err != nil {
				t.Fatalf("first step without initial response: %q %v %v", ch, done, err)
			}
			_, done, err = s.Next([]byte(tc.resp))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != done {
				t.Fatalf("Next = done %v, err %v; want err %v", done, err, tc.wantErr)
			}
			if tc.wantErr == ErrMalformed {
				if o.called {
					t.Errorf("Finish called for a malformed message")
				}
				return
			}
			if !o.called || o.creds.User != tc.user || o.creds.Password != tc.pass || o.creds.Proven {
				t.Errorf("Finish got %+v", o.creds)
			}
		})
	}
}

func TestLogin(t *testing.T) {
	var o outcome
	s, _ := New(Login, nil, o.finish)
	ch, _, _ := s.Next(nil)
	if string(ch) != "Username:" {
		t.Fatalf("first challenge %q", ch)
	}
	ch, _, _ = s.Next([]byte("bob"))
	if string(ch) != "Password:" {
		t.Fatalf("second challenge %q", ch)
	}
	if _, done, err := s.Next([]byte("pw")); !done || err != nil {
		t.Fatalf("last step: %v %v", done, err)
	}
	if o.creds != (Credentials{Mechanism: Login, User: "bob", Password: "pw"}) {
		t.Errorf("credentials %+v", o.creds)
	}
	if _, _, err := s.Next([]byte("more")); !errors.Is(err, ErrMalformed) {
		t.Errorf("response after the end: %v", err)
	}
	// An initial response is the user name.
	s, _ = New(Login, nil, o.finish)
	if ch, _, _ := s.Next([]byte("bob")); string(ch) != "Password:" {
		t.Errorf("challenge after an initial response %q", ch)
	}
	s, _ = New(Login, nil, o.finish)
	if _, _, err := s.Next([]byte{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty user name: %v", err)
	}
}

// runSCRAM runs a client conversation against a server exchange and
// returns what Finish was told.
func runSCRAM(t *testing.T, lookup Lookup, user, pass string) (outcome, error) {
	var o outcome
	s, err := New(SCRAMSHA256, lookup, o.finish)
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := scram.SHA256.NewClient(user, pass, "")
	conv := cl.NewConversation()
	if ch, done, err := s.Next(nil); ch != nil || done || err != nil {
		t.Fatalf("first step: %q %v %v", ch, done, err)
	}
	msg, _ := conv.Step("")
	for {
		ch, done, err := s.Next([]byte(msg))
		if err != nil || done {
			if done && !conv.Valid() {
				t.Errorf("exchange done but the client did not check the server's proof")
			}
			return o, err
		}
		if msg, err = conv.Step(string(ch)); err != nil {
			t.Fatalf("client step on %q: %v", ch, err)
		}
	}
}

func TestSCRAM(t *testing.T) {
	lookup := lookupOnly("bob", keysFor(t, "pencil"))
	o, err := runSCRAM(t, lookup, "bob", "pencil")
	if err != nil || o.creds != (Credentials{Mechanism: SCRAMSHA256, User: "bob", Proven: true}) {
		t.Fatalf("right password: %+v, %v", o.creds, err)
	}
	o, err = runSCRAM(t, lookup, "bob", "wrong")
	if !errors.Is(err, ErrAuthFailed) || !o.called || o.creds.Proven {
		t.Fatalf("wrong password: %+v, %v", o, err)
	}
	o, err = runSCRAM(t, lookup, "alice", "pencil")
	if !errors.Is(err, ErrAuthFailed) || !o.called {
		t.Fatalf("unknown user: %+v, %v", o, err)
	}
	down := errors.New("user manager unreachable")
	o, err = runSCRAM(t, func(string) (scram.StoredCredentials, error) { return scram.StoredCredentials{}, down }, "bob", "pencil")
	if !errors.Is(err, down) || !errors.Is(o.err, down) {
		t.Fatalf("lookup failure: %+v, %v", o, err)
	}
}

// TestSCRAMFakeSaltStable checks that an unknown user gets the same salt
// each time: a salt that changed between two asks would tell that the
// user does not exist.
func TestSCRAMFakeSaltStable(t *testing.T) {
	first := func() string {
		s, _ := New(SCRAMSHA256, lookupOnly("bob", keysFor(t, "x")), (&outcome{}).finish)
		cl, _ := scram.SHA256.NewClient("nobody", "x", "")
		msg, _ := cl.NewConversation().Step("")
		ch, _, err := s.Next([]byte(msg))
		if err != nil {
			t.Fatal(err)
		}
		// server-first: r=<nonce>,s=<salt>,i=<iterations>
		for _, f := range splitComma(string(ch)) {
			if len(f) > 2 && f[:2] == "s=" {
				return f
			}
		}
		t.Fatalf("no salt in %q", ch)
		return ""
	}
	if a, b := first(), first(); a != b {
		t.Errorf("unknown user's salt changed between asks: %s, %s", a, b)
	}
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

// FuzzExchange feeds arbitrary client messages to each mechanism: no
// input may panic, and Finish may report success only for a SCRAM client
// that knew the password (impossible for random input) or for PLAIN and
// LOGIN credentials that the protocol then checks.
func FuzzExchange(f *testing.F) {
	f.Add("PLAIN", []byte("\x00bob\x00pw"), []byte{}, []byte{})
	f.Add("LOGIN", []byte("bob"), []byte("pw"), []byte{})
	f.Add("SCRAM-SHA-256", []byte("n,,n=bob,r=abcdef"), []byte("c=biws,r=abcdef,p=AAAA"), []byte{})
	f.Add("SCRAM-SHA-256", []byte("p=tls-unique,a=x,n=bob,r=a"), []byte{}, []byte("x"))
	f.Add("SCRAM-SHA-256", []byte("n,,n=b=2Cob,r=\x00"), []byte("c=,r=,p="), []byte(nil))
	sc := keysFor(f, "pencil")
	f.Fuzz(func(t *testing.T, mech string, a, b, c []byte) {
		var o outcome
		s, err := New(mech, lookupOnly("bob", sc), o.finish)
		if err != nil {
			return
		}
		for _, resp := range [][]byte{nil, a, b, c, {}} {
			_, done, err := s.Next(resp)
			if err != nil || done {
				break
			}
		}
		if o.called && o.err == nil && o.creds.Proven {
			t.Fatalf("random input proved a SCRAM login: %q %q %q", a, b, c)
		}
	})
}

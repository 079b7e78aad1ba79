package saslsrv

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/userdb"
)

type fakeVerifier struct{ down bool }

func (f fakeVerifier) Login(_ context.Context, user, pw string) (*userdb.Profile, error) {
	if f.down {
		return nil, errors.New("manager unreachable")
	}
	if user == "bob" && pw == "pw" {
		return &userdb.Profile{Address: user}, nil
	}
	return nil, userdb.ErrPasswordMismatch
}

func (f fakeVerifier) Proven(_ context.Context, user string) (*userdb.Profile, error) {
	if user == "bob" {
		return &userdb.Profile{Address: user}, nil
	}
	return nil, userdb.ErrNotFound
}

// TestCheck: one outcome per kind of ending, with the guard's delays.
func TestCheck(t *testing.T) {
	g := guard.New(guard.Limits{AuthFailDelay: time.Millisecond, AuthMaxDelay: time.Second, LockoutAfter: 100}, nil)
	remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		v         fakeVerifier
		creds     Credentials
		exErr     error
		ok, wrong bool
	}{
		{"password", fakeVerifier{}, Credentials{User: "bob", Password: "pw"}, nil, true, false},
		{"wrong password", fakeVerifier{}, Credentials{User: "bob", Password: "x"}, nil, false, true},
		{"SCRAM proven", fakeVerifier{}, Credentials{User: "bob", Proven: true}, nil, true, false},
		{"SCRAM proven, user gone since", fakeVerifier{}, Credentials{User: "eve", Proven: true}, nil, false, true},
		{"wrong proof", fakeVerifier{}, Credentials{User: "bob"}, ErrAuthFailed, false, true},
		{"manager down", fakeVerifier{down: true}, Credentials{User: "bob", Password: "pw"}, nil, false, false},
	} {
		o := Check(ctx, tc.v, g, remote, time.Hour, tc.creds, tc.exErr)
		if (o.Err == nil) != tc.ok || o.Wrong != tc.wrong || (tc.ok && o.Profile == nil) {
			t.Errorf("%s: %+v", tc.name, o)
		}
		if o.Wrong && (o.Delay == 0 || o.Delay == time.Hour) {
			t.Errorf("%s: delay %v, want the guard's", tc.name, o.Delay)
		}
	}
	if o := Check(ctx, fakeVerifier{}, nil, remote, time.Hour, Credentials{User: "bob"}, ErrAuthFailed); o.Delay != time.Hour {
		t.Errorf("without a guard: delay %v, want the fallback", o.Delay)
	}
}

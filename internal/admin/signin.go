package admin

// Who may use the admin API and the console: a request carries the node's
// admin token (the API: "Authorization: Bearer TOKEN"), or a browser holds
// a console session, got by signing in with the token or as a user whose
// profile says admin. Sessions are this node's soft state: a restart signs
// everybody out, and each node's console has its own (they are different
// origins anyway).

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/quillmail/quill/internal/userdb"
)

// sessionCookie names the console's session cookie.
const sessionCookie = "quill_console"

// sessionTTL is how long a console session lasts without a new sign-in: a
// working day.
const sessionTTL = 12 * time.Hour

// maxSessions bounds the sessions a node keeps: signing in over and over
// must not grow memory; past it the oldest go.
const maxSessions = 1000

// tokenAccount is the account name failed token sign-ins count against in
// the guard, so guessing at the token is slowed and locked out like
// guessing at a password.
const tokenAccount = "admin token"

// sessionRecheck is how often an administrator's session is checked
// against their profile again: one demoted, deleted or given a new
// password loses the console within it, on every node.
var sessionRecheck = 30 * time.Second

// recheckTimeout bounds that check; a manager that cannot answer leaves
// the session as it is (an outage must not lock the administrators out).
const recheckTimeout = 500 * time.Millisecond

type consoleSession struct {
	who     string // "admin token" or the user's address
	expires time.Time
	// pw is a digest of the administrator's password hash at sign-in, and
	// checked when the profile was last found to match it.
	pw      string
	checked time.Time
}

type sessions struct {
	mu sync.Mutex
	m  map[string]consoleSession
}

func (ss *sessions) add(who, pw string, now time.Time) string {
	var r [32]byte
	rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = map[string]consoleSession{}
	}
	if len(ss.m) >= maxSessions {
		oldest, at := "", time.Time{}
		for k, s := range ss.m {
			if s.expires.Before(now) {
				delete(ss.m, k)
				continue
			}
			if oldest == "" || s.expires.Before(at) {
				oldest, at = k, s.expires
			}
		}
		if len(ss.m) >= maxSessions {
			delete(ss.m, oldest)
		}
	}
	ss.m[id] = consoleSession{who: who, expires: now.Add(sessionTTL), pw: pw, checked: now}
	return id
}

func (ss *sessions) get(id string, now time.Time) (consoleSession, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[id]
	if !ok || now.After(s.expires) {
		delete(ss.m, id)
		return consoleSession{}, false
	}
	return s, true
}

func (ss *sessions) checkedAt(id string, now time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s, ok := ss.m[id]; ok {
		s.checked = now
		ss.m[id] = s
	}
}

// dropWho ends every session of an administrator (demoted, deleted or
// given a new password through this node).
func (ss *sessions) dropWho(who string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for id, s := range ss.m {
		if s.who == who {
			delete(ss.m, id)
		}
	}
}

// pwDigest stands for a password hash in a session: a change of password
// ends the sessions signed in with the old one.
func pwDigest(hash string) string {
	d := sha256.Sum256([]byte(hash))
	return hex.EncodeToString(d[:8])
}

// stillAdmin checks an administrator's session against their profile at
// most every sessionRecheck.
func (s *Server) stillAdmin(ctx context.Context, id string, cs consoleSession, now time.Time) bool {
	if cs.who == tokenAccount || now.Sub(cs.checked) < sessionRecheck {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, recheckTimeout)
	defer cancel()
	p, _, err := s.Users.Lookup(ctx, cs.who)
	switch {
	case errors.Is(err, userdb.ErrNotFound), err == nil && (p.Deleted || !p.Admin || pwDigest(p.PasswordHash) != cs.pw):
		s.sessions.drop(id)
		s.Logger.Info("console session ended: the user is no longer an administrator with that password", "user", cs.who)
		return false
	case err != nil:
		return true // not known now: checked again at the next request
	}
	s.sessions.checkedAt(id, now)
	return true
}

func (ss *sessions) drop(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, id)
}

type whoKey struct{}

// whoOf is who made a request (its context): "admin token", an admin
// user's address, or "" when the server has no token.
func whoOf(ctx context.Context) string {
	w, _ := ctx.Value(whoKey{}).(string)
	return w
}

// public paths need no sign-in: the health check, the console's own files
// and the sign-in page.
func public(path string) bool {
	return path == "/healthz" || path == "/signin" || strings.HasPrefix(path, "/static/")
}

// forPeople says whether a request that is not signed in should be sent
// to the sign-in page (a browser's page) rather than answered 401 (the
// API, metrics, tools).
func forPeople(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	p := r.URL.Path
	return !strings.HasPrefix(p, "/api/") && p != "/metrics" && p != "/cluster" && !strings.HasPrefix(p, "/debug/")
}

// sameOrigin guards a change made with a session cookie against other
// sites' pages (the cookie is SameSite=Strict already; this covers old
// browsers): the browser's Sec-Fetch-Site or Origin must say it came from
// the console itself.
func sameOrigin(r *http.Request) bool {
	if sfs := r.Header.Get("Sec-Fetch-Site"); sfs != "" {
		return sfs == "same-origin" || sfs == "none"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && u.Host == r.Host
	}
	return true // not a browser, or one that says nothing: the cookie is SameSite=Strict
}

func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.Token == "" || public(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		// A browser opens /?token=TOKEN once (`quill dashboard` prints
		// that address): it gets a session cookie and a clean address.
		if q := r.URL.Query().Get("token"); q != "" && r.Method == http.MethodGet &&
			subtle.ConstantTimeCompare([]byte(q), []byte(s.Token)) == 1 {
			s.startSession(w, r, tokenAccount, "")
			http.Redirect(w, r, r.URL.Path, http.StatusSeeOther)
			return
		}
		if h := r.Header.Get("Authorization"); h != "" {
			if subtle.ConstantTimeCompare([]byte(strings.TrimPrefix(h, "Bearer ")), []byte(s.Token)) == 1 {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), whoKey{}, tokenAccount)))
				return
			}
		} else if c, err := r.Cookie(sessionCookie); err == nil {
			now := time.Now()
			if cs, ok := s.sessions.get(c.Value, now); ok && s.stillAdmin(r.Context(), c.Value, cs, now) {
				if r.Method != http.MethodGet && r.Method != http.MethodHead && !sameOrigin(r) {
					writeError(w, http.StatusForbidden, errors.New("console change from another site refused"))
					return
				}
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), whoKey{}, cs.who)))
				return
			}
		}
		if forPeople(r) {
			http.Redirect(w, r, "/signin?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		writeError(w, http.StatusUnauthorized, errors.New("admin token missing or wrong (see "+TokenFile+" in the data directory; a browser signs in at /signin)"))
	})
}

func (s *Server) startSession(w http.ResponseWriter, r *http.Request, who, pw string) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.sessions.add(who, pw, time.Now()), Path: "/",
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: int(sessionTTL.Seconds())})
}

// remoteAddr is the client's address as the guard counts it.
func remoteAddr(r *http.Request) net.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return &net.TCPAddr{}
	}
	return net.TCPAddrFromAddrPort(ap)
}

// signInFailDelay is the wait before answering a wrong sign-in when the
// node has no guard (tests); the guard's grows with each failure.
const signInFailDelay = time.Second

// signIn checks a sign-in form: the token, or an admin user's address and
// password through the same check (delays, lockouts) as every protocol's
// login. It returns who signed in and, for a user, the digest of their
// password hash.
func (s *Server) signIn(r *http.Request) (string, string, error) {
	remote := remoteAddr(r)
	if s.Logins != nil {
		if err := s.Logins.LoginAllowed(remote); err != nil {
			return "", "", err
		}
	}
	fail := func(account string, err error) (string, string, error) {
		d := signInFailDelay
		if s.Logins != nil {
			d = s.Logins.LoginFailed(remote, account)
		}
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
		return "", "", err
	}
	if !sameOrigin(r) {
		return "", "", errors.New("sign-in from another site refused")
	}
	if tok := r.PostFormValue("token"); tok != "" {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(s.Token)) != 1 {
			return fail(tokenAccount, errors.New("wrong admin token"))
		}
		if s.Logins != nil {
			s.Logins.LoginSucceeded(remote)
		}
		return tokenAccount, "", nil
	}
	user, pw := strings.TrimSpace(r.PostFormValue("user")), r.PostFormValue("password")
	if user == "" || s.Verifier == nil {
		return "", "", errors.New("give the admin token, or an admin user's address and password")
	}
	o := saslsrv.Check(r.Context(), s.Verifier, s.Logins, remote, signInFailDelay, saslsrv.Credentials{User: user, Password: pw}, nil)
	switch {
	case o.Wrong:
		select {
		case <-time.After(o.Delay):
		case <-r.Context().Done():
		}
		return "", "", errors.New("wrong address or password")
	case o.Err != nil:
		s.Logger.Warn("console sign-in could not be checked", "user", user, "err", o.Err)
		return "", "", errors.New("the sign-in could not be checked now; try again")
	case !o.Profile.Admin:
		return fail(user, errors.New("user "+o.Profile.Address+" is not an administrator (quill user admin "+o.Profile.Address+" --on)"))
	}
	return o.Profile.Address, pwDigest(o.Profile.PasswordHash), nil
}

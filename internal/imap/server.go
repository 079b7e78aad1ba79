package imap

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-imap/v2"
	lru "github.com/hashicorp/golang-lru"
	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/hangup"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/writer"
	"github.com/quillmail/quill/third_party/imapserver"
)

// Config tunes a Server. Zero fields take the default in their comment.
type Config struct {
	// AuthFailDelay is how long a wrong password waits before its NO, to
	// slow password guessing. Default 1s; negative means none.
	AuthFailDelay time.Duration
	// MaxMessageBytes is the APPEND limit (RFC 7889 APPENDLIMIT). Default
	// 25 MiB, the SMTP default.
	MaxMessageBytes int64
	// IdlePoll is how often an IDLE session re-checks its mailbox even
	// without a change event (events are dropped for a slow subscriber,
	// and in a cluster some changes arrive from other nodes). Default 10s.
	IdlePoll time.Duration
	// Logger receives session errors. Default: discard.
	Logger *slog.Logger
	// TLSConfig, if set, offers STARTTLS on plain connections.
	TLSConfig *tls.Config
	// Logins, if set, decides the delay after a failed login (growing per
	// address and account) and locks out an address that fails too
	// often; without it every failure waits AuthFailDelay.
	Logins guard.Logins
	// PlaintextAuth says whether a connection not under TLS may send a
	// password (RFC 8314 §3); where it may not, the server advertises
	// LOGINDISABLED. nil allows it everywhere.
	PlaintextAuth func(net.Conn) bool
}

// maxFailedLogins is how many failed LOGIN/AUTHENTICATE a connection may
// make before it is closed.
const maxFailedLogins = 5

func (c Config) withDefaults() Config {
	if c.AuthFailDelay == 0 {
		c.AuthFailDelay = time.Second
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 25 << 20
	}
	if c.MaxMessageBytes > 1<<32-1 {
		c.MaxMessageBytes = 1<<32 - 1
	}
	if c.IdlePoll <= 0 {
		c.IdlePoll = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Server is the node's IMAP server.
type Server struct {
	store  Store
	auth   Authenticator
	cfg    Config
	recent *recentTracker
	srv    *imapserver.Server
	// headers caches message headers for header-only FETCHes
	// (headercache.go).
	headers *lru.Cache

	mu       sync.Mutex
	sessions map[*session]struct{}
	closing  bool
	done     chan struct{} // closed when the last session ends after closing
	doneOnce sync.Once
}

// Capabilities advertised (RFC 9051 §6.1.1 and each extension's RFC).
var capabilities = imap.CapSet{
	imap.CapIMAP4rev1:             {},
	imap.CapIMAP4rev2:             {},
	imap.CapNamespace:             {},
	imap.CapUIDPlus:               {},
	imap.CapESearch:               {},
	imap.CapSearchRes:             {},
	imap.CapListExtended:          {},
	imap.CapListStatus:            {},
	imap.CapMove:                  {},
	imap.CapStatusSize:            {},
	imap.CapBinary:                {},
	imap.CapChildren:              {},
	imap.CapSpecialUse:            {},
	imap.CapCreateSpecialUse:      {},
	imap.CapLiteralPlus:           {},
	imap.CapID:                    {},
	imap.CapCondStore:             {},
	imap.CapPreview:               {},
	imap.CapSort:                  {},
	imap.CapSortDisplay:           {},
	imap.CapESort:                 {},
	imap.CapObjectID:              {},
	imap.CapQResync:               {},
	imap.CapQuota:                 {},
	imap.CapMultiAppend:           {},
	imap.CapCatenate:              {},
	imapserver.CapNotify:          {},
	imapserver.CapContextSearch:   {},
	imapserver.CapContextSort:     {},
	imapserver.CapCompressDeflate: {},
	"THREAD=ORDEREDSUBJECT":       {},
	"THREAD=REFERENCES":           {},
}

// New returns an IMAP server over store, authenticating with auth.
func New(store Store, auth Authenticator, cfg Config) *Server {
	cfg = cfg.withDefaults()
	s := &Server{store: store, auth: auth, cfg: cfg, recent: newRecentTracker(), headers: newHeaderCache(),
		sessions: map[*session]struct{}{}, done: make(chan struct{})}
	s.srv = imapserver.New(&imapserver.Options{
		NewSession:       s.newSession,
		Caps:             capabilities,
		Logger:           slogPrintf{cfg.Logger},
		TLSConfig:        cfg.TLSConfig,
		InsecureAuth:     cfg.PlaintextAuth == nil,
		InsecureAuthConn: cfg.PlaintextAuth,
		ServerID:         []string{"name", "Quill", "vendor", "quillmail"},
		ErrorCode:        errorCode,
		// A client that hangs up during a command cancels the remote
		// work it started.
		CommandContext: hangup.Watch,
		CommandDone:    countCommand,
	})
	return s
}

// errorCode tells a client whether a failed command may work if tried
// again: a node that holds the mailbox or the message being unreachable, a
// call to it timing out, no node with room for a new message, or the
// mailbox's writer fenced out by another (its next operation claims the
// mailbox again) is UNAVAILABLE (RFC 5530: temporary); anything else stays
// SERVERBUG.
func errorCode(err error) imap.ResponseCode {
	if errors.Is(err, rpc.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, proxy.ErrTryLater) ||
		errors.Is(err, writer.ErrFenced) {
		return imap.ResponseCodeUnavailable
	}
	return ""
}

// countCommand counts a command by name and answer (ok, no, bad).
func countCommand(name string, result imap.StatusResponseType) {
	metrics.Commands.WithLabelValues("imap", name, strings.ToLower(string(result))).Inc()
}

type slogPrintf struct{ l *slog.Logger }

func (p slogPrintf) Printf(format string, args ...any) {
	p.l.Warn("imap", "msg", sprintf(format, args...))
}

// Serve accepts connections on l until Shutdown.
func (s *Server) Serve(l net.Listener) error { return s.srv.Serve(l) }

// Shutdown stops accepting connections and waits for sessions to end until
// ctx is done, then closes the rest.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	n := len(s.sessions)
	if n == 0 {
		s.doneOnce.Do(func() { close(s.done) })
	}
	s.mu.Unlock()
	// Close listeners, and (the library's only way) every connection: IMAP
	// sessions idle for up to 30 minutes, so waiting for them is pointless.
	// Each command in progress finishes its store write first, since
	// store calls are not interrupted.
	err := s.srv.Close()
	select {
	case <-s.done:
	case <-ctx.Done():
	}
	return err
}

func (s *Server) addSession(ss *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.sessions[ss] = struct{}{}
	return true
}

func (s *Server) removeSession(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sessions[ss]; !ok {
		return
	}
	delete(s.sessions, ss)
	if s.closing && len(s.sessions) == 0 {
		s.doneOnce.Do(func() { close(s.done) })
	}
}

func (s *Server) newSession(c *imapserver.Conn) (imapserver.Session, *imapserver.GreetingData, error) {
	ss := &session{srv: s, conn: c}
	ss.life, ss.end = context.WithCancel(context.Background())
	if !s.addSession(ss) {
		return nil, nil, &imap.Error{Type: imap.StatusResponseTypeBye, Text: "Server shutting down"}
	}
	return ss, nil, nil
}

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// User is one mailbox the workload sends to and reads from.
type User struct {
	Address  string
	Password string
}

// GenerateUsers returns the n bench users user00001@domain ... with the
// same password.
func GenerateUsers(n int, domain, password string) []User {
	users := make([]User, n)
	for i := range users {
		users[i] = User{Address: UserAddress(i, domain), Password: password}
	}
	return users
}

// ParseUsers reads a users file: one user a line, "address password" or
// just "address" (the user then gets defaultPassword). Blank lines and
// lines starting with # are skipped. The order of the file is the
// popularity order: the first user is the most popular.
func ParseUsers(r io.Reader, defaultPassword string) ([]User, error) {
	var users []User
	sc := bufio.NewScanner(r)
	for lineNo := 1; sc.Scan(); lineNo++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		u := User{Address: f[0], Password: defaultPassword}
		switch len(f) {
		case 1:
		case 2:
			u.Password = f[1]
		default:
			return nil, fmt.Errorf("users file line %d: want \"address [password]\"", lineNo)
		}
		if !strings.Contains(u.Address, "@") {
			return nil, fmt.Errorf("users file line %d: %q is not an address", lineNo, u.Address)
		}
		users = append(users, u)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("users file: no users")
	}
	return users, nil
}

// AdminTimeout bounds one request to the admin API.
const AdminTimeout = 30 * time.Second

// Creator creates users through Quill's admin HTTP API: POST /api/users
// with {"address", "password"}; 201 is created, 409 already exists.
type Creator struct {
	BaseURL string // e.g. http://127.0.0.1:8025
	Token   string // sent as "Authorization: Bearer TOKEN" when set
	// Parallel is the number of requests in flight. Passwords are hashed
	// with argon2id on the server (tens of ms each), so a few requests in
	// parallel keep its cores busy without starving them.
	Parallel int
	Client   *http.Client
	// Progress, if set, gets a progress line once a second and a last one
	// with the totals.
	Progress io.Writer
}

// CreateResult counts the outcome of Create.
type CreateResult struct {
	Created, Existed int
}

// Create creates every user; it stops at the first failure.
func (c *Creator) Create(ctx context.Context, users []User) (CreateResult, error) {
	client := c.Client
	if client == nil {
		client = &http.Client{Timeout: AdminTimeout}
	}
	parallel := max(c.Parallel, 1)
	base := strings.TrimRight(c.BaseURL, "/")
	url := base + "/api/users"
	// Users are added only in served domains: the users' domains first.
	seen := map[string]bool{}
	for _, u := range users {
		dom := u.Address[strings.LastIndexByte(u.Address, '@')+1:]
		if seen[dom] {
			continue
		}
		seen[dom] = true
		if _, err := c.post(ctx, client, base+"/api/domains", "domain "+dom, map[string]string{"name": dom}); err != nil {
			return CreateResult{}, err
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next, created, existed atomic.Int64
		errOnce                sync.Once
		firstErr               error
		wg                     sync.WaitGroup
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	done := make(chan struct{})
	if c.Progress != nil {
		go func() {
			t := time.NewTicker(progressInterval)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					fmt.Fprintf(c.Progress, "creating users: %d/%d\n", created.Load()+existed.Load(), len(users))
				}
			}
		}()
	}
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(users) {
					return
				}
				isNew, err := c.createOne(ctx, client, url, users[i])
				switch {
				case err != nil:
					fail(err)
				case isNew:
					created.Add(1)
				default:
					existed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	res := CreateResult{Created: int(created.Load()), Existed: int(existed.Load())}
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "creating users: %d/%d (%d new, %d existed)\n",
			res.Created+res.Existed, len(users), res.Created, res.Existed)
	}
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return res, firstErr
}

func (c *Creator) createOne(ctx context.Context, client *http.Client, url string, u User) (created bool, err error) {
	return c.post(ctx, client, url, "user "+u.Address, map[string]string{"address": u.Address, "password": u.Password})
}

// post creates what by POSTing v to url: true if created, false if it
// existed already (409).
func (c *Creator) post(ctx context.Context, client *http.Client, url, what string, v any) (created bool, err error) {
	body, _ := json.Marshal(v)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("create %s: %w", what, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch resp.StatusCode {
	case http.StatusCreated, http.StatusOK:
		return true, nil
	case http.StatusConflict:
		return false, nil
	}
	return false, fmt.Errorf("create %s: %s: %s", what, resp.Status, strings.TrimSpace(string(msg)))
}

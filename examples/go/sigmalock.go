// Package sigmalock takes sigma locks from Go, with the standard library only.
//
//	err := sigmalock.Run(ctx, "orders/42", nil, func(ctx context.Context, lock *sigmalock.Lock) error {
//		return storage.Write(ctx, data, lock.Token) // ctx is cancelled if the lock is lost
//	})
//
// The daemon (`sigma run`) holds the lock for this client under a client lease: a
// goroutine renews it (POST .../keepalive) and [Lock.Release] (or the end of [Run])
// gives it back; if this process dies, the daemon releases the lock one TTL after the
// last renewal.
//
// The holder's contract: every answer states a deadline, the earliest time the lock may
// go to someone else. The client counts it from when it sent the request that answered
// it ([Lock.Deadline], on the monotonic clock), and [Lock.Lost] is closed at that
// deadline unless a later renewal moved it on, whatever the daemon answered meanwhile
// (busy, no answer in time); at once if the daemon says the lock is gone (404
// not_held), that it is stopping (503 stopping), or refuses the connection (it is not
// running). Stop
// touching the resource when Lost is closed. The lease id the acquire answers is the
// secret that proves this client holds the lock; the fencing token ([Lock.Token]) is
// public: pass it to the protected resource.
package sigmalock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// DefaultTTL is the client lease when Options.TTL is zero: the daemon releases the
	// lock this long after the last renewal.
	DefaultTTL = 5 * time.Second
	// DefaultSocket is where the shipped unit and config serve the API.
	DefaultSocket = "/run/sigma/api.sock"
	// DefaultAddr is the API's default loopback port.
	DefaultAddr = "127.0.0.1:7591"
	// DefaultConfig is the daemon's config file when $SIGMA_CONFIG is not set.
	DefaultConfig = "/etc/sigma/sigma.toml"

	// How much longer than an acquire's own timeout the client waits for the daemon's
	// answer: the daemon answers a timeout itself; this only bounds a hung daemon.
	acquireSlack = 5 * time.Second
	// Deadline of a release.
	callTimeout = 30 * time.Second
	// The shortest wait between renewals.
	minWait = 50 * time.Millisecond
)

// ErrLost is what [Lock.Err] wraps once the lock is lost: stop using it.
var ErrLost = errors.New("sigma lock lost")

// Options of [Acquire] and [Run]; the zero value (or nil) takes the defaults.
type Options struct {
	// API is the daemon's address, "IP:PORT" or "unix:PATH"; empty: [DefaultAPI].
	API string
	// TTL is the client lease; zero: [DefaultTTL].
	TTL time.Duration
	// Timeout gives up the acquire after this long ([IsTimeout]: 423 not_won); zero:
	// wait as long as it takes (or until the context ends).
	Timeout time.Duration
	// TokenFile holds the bearer token of a daemon run with --api-token-file; empty:
	// $SIGMA_API_TOKEN_FILE, if set.
	TokenFile string
}

// Code is why the daemon refused a call: the code of its error answer (GET
// /v1/openapi.json lists them; docs/operating.md, "Errors", says what to do on each).
// Act on it, never on the message.
type Code string

// The daemon's codes, by HTTP status.
const (
	CodeBadRequest       Code = "bad_request"        // 400: a value, body or path that does not parse
	CodeUnknownParameter Code = "unknown_parameter"  // 400: a query parameter the route does not take
	CodeBadName          Code = "bad_name"           // 400: not a lock name
	CodeBadQuorum        Code = "bad_quorum"         // 400: a quorum the swarm cannot use
	CodeBadLease         Code = "bad_lease"          // 400: no token and lease id
	CodeBadValue         Code = "bad_value"          // 400: a lock value over 4096 bytes, or bad base64
	CodeUnauthorized     Code = "unauthorized"       // 401: no or the wrong bearer token
	CodeAdminDisabled    Code = "admin_disabled"     // 403: the daemon has no admin token
	CodeBadHost          Code = "bad_host"           // 403: Host is not loopback
	CodeBadOrigin        Code = "bad_origin"         // 403: a web page
	CodeRevokeRefused    Code = "revoke_refused"     // 403: the holder refused the revoke
	CodeNotFound         Code = "not_found"          // 404: no such route
	CodeNotHeld          Code = "not_held"           // 404: not held: stop using the lock
	CodeMethodNotAllowed Code = "method_not_allowed" // 405
	CodeLost             Code = "lost"               // 409: won, then lost before it was handed over
	CodeBodyTooLarge     Code = "body_too_large"     // 413
	CodeBadContentType   Code = "bad_content_type"   // 415
	CodeNotWon           Code = "not_won"            // 423: not won within the timeout
	CodeInternal         Code = "internal"           // 500
	CodeNotReady         Code = "not_ready"          // 503: the node does not serve
	CodeHeldBack         Code = "held_back"          // 503: a new lock waits out the takeover delay
	CodeUnresponsive     Code = "unresponsive"       // 503: the node did not answer, or stopped
	CodeStopping         Code = "stopping"           // 503: the daemon stops: a holder must stop using the lock
	CodeBusy             Code = "busy"               // 503: too many requests at once
	CodeTooManyWaiters   Code = "too_many_waiters"   // 503: too many acquires wait for this lock
	CodeTooManyLocks     Code = "too_many_locks"     // 503: the daemon holds as many locks as it may
)

// Error is a refusal of the daemon: its HTTP status, the code of its body (empty from
// something that is not a sigma daemon) and its message.
type Error struct {
	Status  int
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// CodeOf is the daemon's code in err, or "" if err is not a refusal of the daemon.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// IsTimeout reports whether err says the lock was not won within Options.Timeout (423
// not_won).
func IsTimeout(err error) bool {
	return CodeOf(err) == CodeNotWon
}

// IsUnreachable reports whether err says no daemon answers at the address: nothing
// listens there, or the socket does not exist.
func IsUnreachable(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// gone reports whether a renewal's error means the lock is lost now: the daemon says it
// is not held, or that it stops, or it is not running.
func gone(err error) bool {
	switch CodeOf(err) {
	case CodeNotHeld, CodeStopping:
		return true
	}
	return IsUnreachable(err)
}

// DefaultAPI is where the daemon listens when no address is given: $SIGMA_API, else the
// `api` of its config file ($SIGMA_CONFIG, else /etc/sigma/sigma.toml), else its socket
// if it exists, else the default port. A client never falls back to a port that any
// local process could have bound while the daemon is down when the daemon's config
// names its socket.
func DefaultAPI() string {
	if api := os.Getenv("SIGMA_API"); api != "" {
		return api
	}
	config := os.Getenv("SIGMA_CONFIG")
	if config == "" {
		config = DefaultConfig
	}
	if f, err := os.Open(config); err == nil {
		api, _ := configAPI(f)
		f.Close()
		if api != "" {
			return api
		}
	}
	if _, err := os.Stat(DefaultSocket); err == nil {
		return "unix:" + DefaultSocket
	}
	return DefaultAddr
}

// configAPI reads the top-level `api = "..."` of a TOML config file: a basic or literal
// string on one line (the daemon's config files have no other form of it).
func configAPI(r io.Reader) (string, error) {
	lines := bufio.NewScanner(r)
	for lines.Scan() {
		line := strings.TrimSpace(lines.Text())
		if strings.HasPrefix(line, "[") {
			return "", nil // a table: the top-level keys are behind
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(key) != "api" {
			continue
		}
		value = strings.TrimSpace(value)
		if value == "" {
			return "", fmt.Errorf("api: no value")
		}
		quote := value[0]
		if quote != '"' && quote != '\'' {
			return "", fmt.Errorf("api: not a string: %s", value)
		}
		end := strings.IndexByte(value[1:], quote)
		if end < 0 {
			return "", fmt.Errorf("api: unterminated string: %s", value)
		}
		s := value[1 : end+1]
		if quote == '"' && strings.Contains(s, `\`) {
			return strconv.Unquote(`"` + s + `"`)
		}
		return s, nil
	}
	return "", lines.Err()
}

// client speaks to one daemon's API.
type client struct {
	api    string
	base   string // http://IP:PORT, or http://localhost over a unix socket
	http   *http.Client
	bearer string
}

func newClient(opts *Options) (*client, error) {
	api := opts.API
	if api == "" {
		api = DefaultAPI()
	}
	// Loopback only: never through a proxy from the environment.
	transport := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: 5 * time.Second}
	base := "http://" + api
	if strings.HasPrefix(api, "unix:") {
		path := strings.TrimPrefix(api, "unix:")
		base = "http://localhost"
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	c := &client{api: api, base: base, http: &http.Client{Transport: transport}}
	tokenFile := opts.TokenFile
	if tokenFile == "" {
		tokenFile = os.Getenv("SIGMA_API_TOKEN_FILE")
	}
	if tokenFile != "" {
		token, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("the API token file: %w", err)
		}
		c.bearer = strings.TrimSpace(string(token))
	}
	return c, nil
}

// post sends POST /v1/locks/NAME/ACTION and decodes a 200 answer into out.
func (c *client) post(ctx context.Context, name, action string, query url.Values, body, out any) error {
	u := c.base + "/v1/locks/" + url.PathEscape(name) + "/" + action
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	if body == nil {
		body = struct{}{}
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(data))
	if err != nil {
		return err
	}
	// A JSON content type on every POST: the daemon refuses what a web form could send.
	req.Header.Set("Content-Type", "application/json")
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode >= 400 {
		var e struct {
			Error string `json:"error"`
			Code  Code   `json:"code"`
		}
		if json.Unmarshal(answer, &e) != nil || e.Error == "" {
			e.Error = http.StatusText(resp.StatusCode)
		}
		return &Error{Status: resp.StatusCode, Code: e.Code, Message: e.Error}
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return fmt.Errorf("bad answer from the sigma daemon: %w", err)
	}
	return nil
}

// holder is what keep-alive and release send: the token and the secret lease id.
type holder struct {
	Token uint64 `json:"token"`
	Lease string `json:"lease"`
}

// Lock is a lock held through a daemon, renewed in the background until released or
// lost.
type Lock struct {
	// Name is the lock's name.
	Name string
	// Token is the fencing token: public; pass it to the protected resource, which
	// refuses tokens lower than one it has seen.
	Token uint64

	c     *client
	lease string // the secret: never printed
	ttl   time.Duration

	mu       sync.Mutex
	deadline time.Time // after it the lock may be someone else's (monotonic)
	err      error     // why the lock was lost, once it was

	lost     chan struct{} // closed when lost
	stop     chan struct{} // closed by Release: the renewer ends
	renewing chan struct{} // closed when the renewer ended
	once     sync.Once     // closes lost
	stopOnce sync.Once     // closes stop
}

// Acquire waits until the lock named name is held for this client (or opts.Timeout, or
// ctx ends) and renews it in the background until [Lock.Release].
func Acquire(ctx context.Context, name string, opts *Options) (*Lock, error) {
	if opts == nil {
		opts = &Options{}
	}
	c, err := newClient(opts)
	if err != nil {
		return nil, err
	}
	ttl := opts.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	query := url.Values{"ttl_ms": {strconv.FormatInt(ttl.Milliseconds(), 10)}}
	if opts.Timeout > 0 {
		query.Set("timeout_ms", strconv.FormatInt(opts.Timeout.Milliseconds(), 10))
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout+acquireSlack)
		defer cancel()
	}
	var acquired struct {
		Token uint64 `json:"token"`
		Lease string `json:"lease"`
	}
	if err := c.post(ctx, name, "acquire", query, nil, &acquired); err != nil {
		return nil, err
	}
	l := &Lock{
		Name: name, Token: acquired.Token, c: c, lease: acquired.Lease, ttl: ttl,
		lost: make(chan struct{}), stop: make(chan struct{}), renewing: make(chan struct{}),
	}
	// The acquire's deadline counts from its answer, which may have come late: renew
	// once at once so that the deadline counts from a send.
	l.deadline = time.Now()
	if err := l.renewOnce(); err != nil {
		l.markLost(fmt.Errorf("at once: %w", err))
		close(l.renewing)
		_ = l.Release(context.Background()) // lost already: a failure says nothing new
		return nil, l.Err()
	}
	go l.renew()
	return l, nil
}

// Deadline is the time after which the lock may be someone else's, unless a renewal
// moves it on.
func (l *Lock) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Lost is closed when the lock is lost: at its deadline with no renewal that moved it,
// or at once when the daemon says it is gone or stopping. Stop using the lock then.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err is nil while the lock is held, and says why once [Lock.Lost] is closed (it wraps
// [ErrLost]).
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lock) markLost(why error) {
	l.once.Do(func() {
		l.mu.Lock()
		l.err = fmt.Errorf("%w: %s token %d: %v", ErrLost, l.Name, l.Token, why)
		l.mu.Unlock()
		close(l.lost)
	})
}

// renewOnce sends a keep-alive and moves the deadline to its answer, counted from the
// send. It gives up at the current deadline: an answer after it comes too late.
func (l *Lock) renewOnce() error {
	sent := time.Now()
	budget := l.ttl
	if d := l.Deadline(); d.After(sent) {
		budget = d.Sub(sent)
		if budget < minWait {
			budget = minWait
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	var kept struct {
		ValidForMs int64 `json:"valid_for_ms"`
	}
	if err := l.c.post(ctx, l.Name, "keepalive", nil, holder{l.Token, l.lease}, &kept); err != nil {
		return err
	}
	l.mu.Lock()
	if d := sent.Add(time.Duration(kept.ValidForMs) * time.Millisecond); d.After(l.deadline) {
		l.deadline = d
	}
	l.mu.Unlock()
	return nil
}

// renew keeps the lock until Release, or marks it lost: half-way to the deadline, at
// most every quarter of the TTL.
func (l *Lock) renew() {
	defer close(l.renewing)
	for {
		left := time.Until(l.Deadline())
		if left <= 0 {
			l.markLost(errors.New("no renewal answered before the deadline"))
			return
		}
		wait := left / 2
		if wait < minWait {
			wait = minWait
		}
		if wait > l.ttl/4 {
			wait = l.ttl / 4
		}
		if wait > left {
			wait = left
		}
		timer := time.NewTimer(wait)
		select {
		case <-l.stop:
			timer.Stop()
			return
		case <-timer.C:
		}
		if !time.Now().Before(l.Deadline()) {
			continue
		}
		if err := l.renewOnce(); err != nil && gone(err) {
			l.markLost(err)
			return
		}
		// Any other failure (busy, no answer in time): try again until the deadline.
	}
}

// Release stops the renewals and gives the lock back. A lock the daemon no longer holds
// (lost, expired) or a daemon that is gone is no error: [Lock.Lost] is closed then.
func (l *Lock) Release(ctx context.Context) error {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.renewing
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	var released struct{}
	err := l.c.post(ctx, l.Name, "release", nil, holder{l.Token, l.lease}, &released)
	if err != nil && gone(err) {
		l.markLost(fmt.Errorf("at release: %w", err))
		return nil
	}
	return err
}

// Run holds the lock named name while fn runs, then releases it. fn's context is
// cancelled when the lock is lost (or ctx ends): fn must stop touching the resource
// then. Run returns fn's error; else [ErrLost] (wrapped) if the lock was lost while fn
// ran; else the release's error.
func Run(ctx context.Context, name string, opts *Options, fn func(ctx context.Context, lock *Lock) error) error {
	lock, err := Acquire(ctx, name, opts)
	if err != nil {
		return err
	}
	held, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lock.Lost():
			cancel()
		case <-held.Done():
		}
	}()
	ferr := fn(held, lock)
	lostWhileRunning := lock.Err()
	cancel()
	// Released even when ctx has ended.
	rerr := lock.Release(context.Background())
	switch {
	case ferr != nil:
		return ferr
	case lostWhileRunning != nil:
		return lostWhileRunning
	default:
		return rerr
	}
}

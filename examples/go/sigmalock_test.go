package sigmalock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeDaemon answers an acquire, then each keep-alive with keepalive(n), n counting
// from 1; it answers valid_for_ms 300 where keepalive returns 0.
func fakeDaemon(t *testing.T, keepalive func(n int64, w http.ResponseWriter, r *http.Request) int) string {
	t.Helper()
	var n int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // then a client that gives up cancels r.Context()
		if r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusUnsupportedMediaType)
			return
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			fmt.Fprint(w, `{"name":"x","token":7,"lease":"00112233445566778899aabbccddeeff","valid_for_ms":300}`)
		case strings.HasSuffix(r.URL.Path, "/keepalive"):
			status := keepalive(atomic.AddInt64(&n, 1), w, r)
			if status == 0 {
				fmt.Fprint(w, `{"valid_for_ms":300}`)
			} else if status > 0 {
				w.WriteHeader(status)
				fmt.Fprintf(w, `{"error":"refused","code":%q}`, map[int]string{404: "not_held", 503: "busy"}[status])
			}
		default:
			fmt.Fprint(w, `{}`)
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// lostAfter acquires through api and answers how long after the last confirmed
// renewal's deadline the lock was lost (negative: before it).
func lostAfter(t *testing.T, api string) time.Duration {
	t.Helper()
	lock, err := Acquire(context.Background(), "x", &Options{API: api, TTL: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release(context.Background()) //nolint:errcheck
	select {
	case <-lock.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("never lost")
	}
	if !errors.Is(lock.Err(), ErrLost) {
		t.Fatalf("Err: %v", lock.Err())
	}
	return time.Since(lock.Deadline())
}

func TestLostAtTheDeadlineWhenTheDaemonHangs(t *testing.T) {
	api := fakeDaemon(t, func(n int64, w http.ResponseWriter, r *http.Request) int {
		if n <= 3 {
			return 0
		}
		<-r.Context().Done() // hung: no answer
		return -1
	})
	if late := lostAfter(t, api); late < 0 || late > 250*time.Millisecond {
		t.Fatalf("lost %v after the deadline", late)
	}
}

func TestBusyMovesNoDeadline(t *testing.T) {
	api := fakeDaemon(t, func(n int64, w http.ResponseWriter, r *http.Request) int {
		if n <= 2 {
			return 0
		}
		return http.StatusServiceUnavailable
	})
	if late := lostAfter(t, api); late < 0 || late > 250*time.Millisecond {
		t.Fatalf("lost %v after the deadline", late)
	}
}

func TestNotHeldIsLostAtOnce(t *testing.T) {
	api := fakeDaemon(t, func(n int64, w http.ResponseWriter, r *http.Request) int {
		if n <= 2 {
			return 0
		}
		return http.StatusNotFound
	})
	if late := lostAfter(t, api); late > -100*time.Millisecond {
		t.Fatalf("lost %v after the deadline, not at once", late)
	}
}

func TestRunCancelsItsContextWhenLost(t *testing.T) {
	api := fakeDaemon(t, func(n int64, w http.ResponseWriter, r *http.Request) int {
		if n <= 2 {
			return 0
		}
		return http.StatusNotFound
	})
	err := Run(context.Background(), "x", &Options{API: api, TTL: 400 * time.Millisecond},
		func(ctx context.Context, lock *Lock) error {
			if lock.Token != 7 {
				t.Errorf("token %d", lock.Token)
			}
			<-ctx.Done()
			return nil
		})
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Run: %v", err)
	}
}

func TestConfigAPI(t *testing.T) {
	for config, want := range map[string]string{
		"api = \"unix:/run/sigma/api.sock\"\n":                      "unix:/run/sigma/api.sock",
		"# a comment\nlisten = ['x']\n  api='127.0.0.1:7000' # x\n": "127.0.0.1:7000",
		"[metrics]\napi = \"127.0.0.1:1\"\n":                        "",
		"apis = \"x\"\n":                                            "",
	} {
		got, err := configAPI(strings.NewReader(config))
		if err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", config, got, err, want)
		}
	}
}

func TestNotWonIsATimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusLocked)
		fmt.Fprint(w, `{"error":"lock x not won within 100 ms","code":"not_won"}`)
	}))
	defer srv.Close()
	_, err := Acquire(context.Background(), "x", &Options{API: strings.TrimPrefix(srv.URL, "http://"), Timeout: 100 * time.Millisecond})
	if !IsTimeout(err) || CodeOf(err) != CodeNotWon {
		t.Fatalf("Acquire: %v (code %q)", err, CodeOf(err))
	}
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusLocked {
		t.Fatalf("Acquire: %#v", err)
	}
}

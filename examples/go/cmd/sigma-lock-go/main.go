// Command sigma-lock-go holds a sigma lock for a while: the Go client's counterpart of
// examples/python/sigma_lock.py, with the same options and output.
//
//	sigma-lock-go [--api 127.0.0.1:7591|unix:PATH] [--hold SECONDS] [--ttl SECONDS] [--timeout SECONDS] NAME
//
// It prints `acquired NAME token T`, holds the lock, prints `released NAME token T`; or
// `lost NAME token T` (exit 76) if the lock is lost meanwhile. Exit 75: not won within
// --timeout; 69: no daemon, or it refused.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"example.invalid/sigma/sigmalock"
)

func main() {
	flags := flag.NewFlagSet("sigma-lock-go", flag.ExitOnError)
	api := flags.String("api", "", "the daemon's API, IP:PORT or unix:PATH [$SIGMA_API, else the daemon's config file's, else unix:/run/sigma/api.sock if it exists, else 127.0.0.1:7591]")
	hold := flags.Float64("hold", 0, "seconds to hold the lock")
	ttl := flags.Float64("ttl", 5, "client lease in seconds")
	timeout := flags.Float64("timeout", 0, "give up after this many seconds (0: wait as long as it takes)")
	flags.Usage = func() {
		fmt.Fprintln(flags.Output(), "usage: sigma-lock-go [options] NAME\nHold a sigma lock for a while.")
		flags.PrintDefaults()
	}
	// Options before and after the name, as in sigma_lock.py.
	var names []string
	for args := os.Args[1:]; ; {
		_ = flags.Parse(args)
		if flags.NArg() == 0 {
			break
		}
		names = append(names, flags.Arg(0))
		args = flags.Args()[1:]
	}
	if len(names) != 1 {
		flags.Usage()
		os.Exit(64)
	}
	if *api == "" {
		*api = sigmalock.DefaultAPI()
	}
	opts := &sigmalock.Options{API: *api, TTL: seconds(*ttl), Timeout: seconds(*timeout)}
	os.Exit(run(names[0], opts, seconds(*hold)))
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func run(name string, opts *sigmalock.Options, hold time.Duration) int {
	lock, err := sigmalock.Acquire(context.Background(), name, opts)
	if err != nil {
		return failed(opts.API, err)
	}
	fmt.Printf("acquired %s token %d\n", lock.Name, lock.Token)
	select {
	case <-lock.Lost():
		fmt.Printf("lost %s token %d\n", lock.Name, lock.Token)
		fmt.Fprintf(os.Stderr, "sigma-lock-go: %v\n", lock.Err())
		_ = lock.Release(context.Background()) // lost already: a failure says nothing new
		return 76
	case <-time.After(hold):
	}
	if err := lock.Release(context.Background()); err != nil {
		return failed(opts.API, err)
	}
	fmt.Printf("released %s token %d\n", lock.Name, lock.Token)
	return 0
}

// failed says why on stderr and answers the exit code.
func failed(api string, err error) int {
	var refused *sigmalock.Error
	switch {
	case errors.Is(err, sigmalock.ErrLost):
		fmt.Fprintf(os.Stderr, "sigma-lock-go: %v\n", err)
		return 76
	case sigmalock.IsTimeout(err):
		fmt.Fprintf(os.Stderr, "sigma-lock-go: %v\n", err)
		return 75
	case errors.As(err, &refused):
		fmt.Fprintf(os.Stderr, "sigma-lock-go: %v\n", err)
		return 69
	default:
		fmt.Fprintf(os.Stderr, "sigma-lock-go: cannot reach the sigma daemon at %s (is `sigma run` running?): %v\n", api, err)
		return 69
	}
}

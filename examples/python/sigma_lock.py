#!/usr/bin/env python3
"""A sigma lock from Python, with the standard library only.

    with SigmaLock("orders/42") as lock:       # blocks until held
        storage.write(data, fencing_token=lock.token)

The daemon (`sigma run`) holds the lock for this client under a client lease: the lock is
renewed by a background thread (`POST .../keepalive`) and released on leaving the block;
if this process dies, the daemon releases the lock one TTL after the last renewal.

The holder's contract: every answer states a deadline, the earliest time the lock may go
to someone else. The client counts it from when it *sent* the renewal that answered it
(`lock.deadline`, on `time.monotonic()`), and `lock.lost` is set at that deadline unless
a later renewal moved it on, whatever the daemon answered meanwhile (busy, a timeout, a
refused connection); at once if the daemon says the lock is gone or that it is stopping.
Stop touching the resource when `lock.lost` is set. The lease id the acquire answers is
the secret that proves this client holds the lock; the fencing token is public.

As a command: python3 sigma_lock.py [--api 127.0.0.1:7591] [--hold SECONDS] [--ttl SECONDS] NAME
prints `acquired NAME token T`, holds the lock, prints `released NAME token T`.
"""

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request


class SigmaError(Exception):
    """A refusal of the daemon (status, code, message)."""

    def __init__(self, status, code, message):
        super().__init__(f"HTTP {status} {code or ''}: {message}")
        self.status, self.code = status, code


class SigmaLock:
    def __init__(self, name, api=None, timeout_s=None, ttl_s=5.0, token_file=None):
        self.name = name
        self.api = api or os.environ.get("SIGMA_API", "127.0.0.1:7591")
        self.timeout_s, self.ttl_s = timeout_s, ttl_s
        token_file = token_file or os.environ.get("SIGMA_API_TOKEN_FILE")
        self.bearer = open(token_file).read().strip() if token_file else None
        self.token = None
        self._lease = None  # the secret: never printed
        self.deadline = None  # time.monotonic() after which the lock may be someone else's
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer = None

    def _post(self, action, body=None, query=None, timeout=30):
        path = urllib.parse.quote(self.name, safe="") + "/" + action
        url = f"http://{self.api}/v1/locks/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        # A JSON content type on every POST: the daemon refuses what a web form could send.
        headers = {"Content-Type": "application/json"}
        if self.bearer:
            headers["Authorization"] = "Bearer " + self.bearer
        data = json.dumps(body or {}).encode()
        request = urllib.request.Request(url, data=data, method="POST", headers=headers)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
        try:
            with opener.open(request, timeout=timeout) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            try:
                err = json.load(e)
            except ValueError:
                err = {}
            raise SigmaError(e.code, err.get("code"), err.get("error", e.reason)) from None

    def acquire(self):
        query = {"ttl_ms": int(self.ttl_s * 1000)}
        wait = None
        if self.timeout_s is not None:
            query["timeout_ms"] = int(self.timeout_s * 1000)
            wait = self.timeout_s + 5
        answer = self._post("acquire", query=query, timeout=wait)
        self.token, self._lease = answer["token"], answer["lease"]
        # The acquire's deadline counts from its answer, which may have come late: renew
        # once at once so that the deadline counts from a send.
        self.deadline = time.monotonic()
        try:
            self._renew_once()
        except (SigmaError, OSError) as e:
            self.lost.set()
            self.release()
            raise SigmaError(409, "lost", f"lock lost at once: {e}") from None
        self._renewer = threading.Thread(target=self._renew, daemon=True)
        self._renewer.start()
        return self

    def _renew_once(self):
        sent = time.monotonic()
        budget = max(0.05, self.deadline - sent) if self.deadline > sent else self.ttl_s
        kept = self._post("keepalive", {"token": self.token, "lease": self._lease}, timeout=budget)
        self.deadline = max(self.deadline, sent + kept["valid_for_ms"] / 1000)

    def _renew(self):
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.lost.set()  # no renewal in time: the lock may be someone else's now
                return
            if self._stop.wait(min(max(left / 2, 0.05), self.ttl_s / 4, left)):
                return
            if time.monotonic() >= self.deadline:
                continue
            try:
                self._renew_once()
            except SigmaError as e:
                if e.status == 404 or e.code == "stopping":  # gone, or the daemon stops
                    self.lost.set()
                    return
            except urllib.error.URLError as e:
                if isinstance(e.reason, ConnectionRefusedError):  # the daemon is gone
                    self.lost.set()
                    return
            except OSError:
                pass  # no answer in time: try again until the deadline

    def release(self):
        self._stop.set()
        if self._renewer:
            self._renewer.join()
        try:
            self._post("release", {"token": self.token, "lease": self._lease})
        except SigmaError as e:
            if e.status != 404:
                raise
            self.lost.set()
        except OSError:
            self.lost.set()  # the daemon is gone: the lock runs out on its own

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


def main():
    parser = argparse.ArgumentParser(description="Hold a sigma lock for a while.")
    parser.add_argument("name")
    parser.add_argument("--api", default=None, help="IP:PORT of the daemon's API [$SIGMA_API or 127.0.0.1:7591]")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to hold the lock")
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    parser.add_argument("--ttl", type=float, default=5.0, help="client lease in seconds")
    args = parser.parse_args()
    with SigmaLock(args.name, api=args.api, timeout_s=args.timeout, ttl_s=args.ttl) as lock:
        print(f"acquired {lock.name} token {lock.token}", flush=True)
        lock.lost.wait(args.hold)
        if lock.lost.is_set():
            print(f"lost {lock.name} token {lock.token}", flush=True)
            raise SystemExit(76)
    print(f"released {lock.name} token {lock.token}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except SigmaError as e:
        print(f"sigma_lock.py: {e}", file=sys.stderr)
        raise SystemExit(75 if e.status == 408 else 69)

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

A value with the lock, watching it and leader election:

    with SigmaLock("jobs/leader", value="10.0.0.7:8080") as lock:   # campaign
        lock.set_value("10.0.0.7:9090")                             # proclaim
    for state in watch("jobs/leader"):    # dicts: state, holder (token, value), waiters
        print(state["seq"], state["state"])
    for leader in observe("jobs/leader"):  # each leader (or new value) once, in token order
        print(leader["token"], leader.get("value"))

A semaphore (at most K holders of a name at once) is the same with `slots=K`:
`lock.slot` says which slot is held, `lock.held` names its lock (`NAME/.slot/N`), whose
fencing token `lock.token` is.

Installed with `pip install ./examples/python` (the module `sigma_lock` and the command
`sigma-lock-py`), or copied: it is one file.

As a command: python3 sigma_lock.py [--api 127.0.0.1:7591|unix:PATH] [--hold SECONDS] [--ttl SECONDS] [--timeout SECONDS] [--value TEXT] [--slots K] NAME
prints `acquired NAME token T` (NAME/.slot/N with --slots), holds the lock, prints `released NAME token T`;
with --observe, prints each leader of NAME as a JSON line instead.
"""

import argparse
import base64
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.parse


class SigmaError(Exception):
    """A refusal of the daemon: its HTTP `status`, its `code` (one of `ERRORS`; None
    from something that is not a sigma daemon) and its message. Raised as the subclass
    that says what to do (docs/operating.md, "Errors"); act on the class or the code,
    never on the message."""

    def __init__(self, status, code, message):
        super().__init__(f"HTTP {status} {code or ''}: {message}")
        self.status, self.code = status, code


class BadRequest(SigmaError):
    """The request is wrong (a name, a quorum, a parameter, a route): fix it."""


class Denied(SigmaError):
    """Not allowed: no or the wrong bearer token, not from this host, a revoke the
    holder refused."""


class NotWon(SigmaError):
    """423 `not_won`: the lock was not won within the timeout. Try again, or give up."""


class LockGone(SigmaError):
    """The lock is not (or no longer) held for this client: `not_held`, `lost`, or
    `stopping` (the daemon stops). A holder must stop using the lock now; an acquire may
    go to another daemon."""


class Unavailable(SigmaError):
    """The daemon cannot serve it now (busy, not ready, stopped, failed): retry later or
    through another daemon."""


# Every code of the daemon's ErrorCode (GET /v1/openapi.json lists them) and the error
# it raises here.
ERRORS = {
    "bad_request": BadRequest,
    "unknown_parameter": BadRequest,
    "bad_name": BadRequest,
    "bad_quorum": BadRequest,
    "bad_lease": BadRequest,
    "bad_value": BadRequest,
    "not_found": BadRequest,
    "method_not_allowed": BadRequest,
    "body_too_large": BadRequest,
    "bad_content_type": BadRequest,
    "unauthorized": Denied,
    "admin_disabled": Denied,
    "bad_host": Denied,
    "bad_origin": Denied,
    "revoke_refused": Denied,
    "not_won": NotWon,
    "not_held": LockGone,
    "lost": LockGone,
    "stopping": LockGone,
    "not_ready": Unavailable,
    "held_back": Unavailable,
    "unresponsive": Unavailable,
    "busy": Unavailable,
    "too_many_waiters": Unavailable,
    "too_many_locks": Unavailable,
    "internal": Unavailable,
}


def _refusal(status, code, message):
    """The error of an answer `status` with `code`: its class by ERRORS."""
    return ERRORS.get(code, SigmaError)(status, code, message)


def default_api():
    """Where the daemon listens when no address is given: the `api` of its config file
    ($SIGMA_CONFIG, else /etc/sigma/sigma.toml), else its socket if it exists, else the
    default port. A client never falls back to a port that any local process could
    have bound while the daemon is down when the daemon's config names its socket."""
    try:
        import tomllib  # Python 3.11 and newer

        with open(os.environ.get("SIGMA_CONFIG", "/etc/sigma/sigma.toml"), "rb") as f:
            api = tomllib.load(f).get("api")
        if api:
            return api
    except (ImportError, FileNotFoundError):
        pass
    return "unix:/run/sigma/api.sock" if os.path.exists("/run/sigma/api.sock") else "127.0.0.1:7591"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the daemon's unix socket (`--api unix:PATH`)."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _connect(api, timeout):
    """An HTTP connection to the daemon at `api` (IP:PORT or unix:PATH)."""
    if api.startswith("unix:"):
        return _UnixConnection(api[len("unix:"):], timeout)
    host, port = api.rsplit(":", 1)
    return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)


def _bearer(token_file):
    token_file = token_file or os.environ.get("SIGMA_API_TOKEN_FILE")
    return open(token_file).read().strip() if token_file else None


def _value_fields(value):
    """The JSON fields of a value: `value` for text, `value_base64` for other bytes."""
    if isinstance(value, bytes):
        try:
            return {"value": value.decode("utf-8")}
        except UnicodeDecodeError:
            return {"value_base64": base64.b64encode(value).decode("ascii")}
    return {"value": value}


def _events(route, name, api=None, interval_s=0.5, token_file=None):
    """The server-sent events of GET /v1/{route}/{name}: yields (event, data as a dict);
    a SigmaError for the daemon's refusal or its error event (which ends the stream)."""
    api = api or os.environ.get("SIGMA_API") or default_api()
    path = f"/v1/{route}/" + urllib.parse.quote(name, safe="")
    path += "?" + urllib.parse.urlencode({"interval_ms": int(interval_s * 1000)})
    headers = {"Accept": "text/event-stream"}
    bearer = _bearer(token_file)
    if bearer:
        headers["Authorization"] = "Bearer " + bearer
    # The daemon sends a comment every 15 s: a minute without a line means it is gone.
    conn = _connect(api, 60)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        if resp.status >= 400:
            try:
                err = json.loads(resp.read())
            except ValueError:
                err = {}
            raise _refusal(resp.status, err.get("code"), err.get("error", resp.reason))
        event, data = "message", []
        while True:
            line = resp.readline()
            if not line:
                return
            line = line.decode("utf-8").rstrip("\r\n")
            if line.startswith("event:"):
                event = line[len("event:"):].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:"):].lstrip(" "))
            elif not line and data:
                body = json.loads("\n".join(data))
                if event == "error":
                    raise _refusal(503, body.get("code"), body.get("error"))
                yield event, body
                event, data = "message", []
    finally:
        conn.close()


def watch(name, api=None, interval_s=0.5, token_file=None):
    """Follows lock `name`: yields its state (a dict: `seq`, `state` held/free/unknown,
    `holder` with `token` and `value`, `waiters`) each time it changes, the first at once.
    Holders come once and in token order (docs/operating.md, "Watch")."""
    for _, state in _events("watch", name, api, interval_s, token_file):
        yield state


def observe(name, api=None, interval_s=0.5, token_file=None):
    """Follows the leader of election `name`: yields each new holder (a dict with
    `token`, `value` or `value_base64`, `value_version`) once and in token order."""
    for _, leader in _events("observe", name, api, interval_s, token_file):
        yield leader


class SigmaLock:
    def __init__(self, name, api=None, timeout_s=None, ttl_s=5.0, token_file=None, value=None, slots=None):
        self.name = name
        self.slots = slots  # a semaphore of this many slots; None: a lock
        self.slot = None  # the slot held (with slots)
        self.held = None  # the lock held: name, or NAME/.slot/N with slots
        self.api = api or os.environ.get("SIGMA_API") or default_api()
        self.timeout_s, self.ttl_s = timeout_s, ttl_s
        self.value = value  # attached at acquire: text (str) or bytes, at most 4096 bytes
        self.bearer = _bearer(token_file)
        self.token = None
        self._lease = None  # the secret: never printed
        self.deadline = None  # time.monotonic() after which the lock may be someone else's
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer = None

    def _connection(self, timeout):
        return _connect(self.api, timeout)

    def _post(self, action, body=None, query=None, timeout=30):
        path = "/v1/locks/" + urllib.parse.quote(self.name, safe="") + "/" + action
        if query:
            path += "?" + urllib.parse.urlencode(query)
        # A JSON content type on every POST: the daemon refuses what a web form could send.
        headers = {"Content-Type": "application/json"}
        if self.bearer:
            headers["Authorization"] = "Bearer " + self.bearer
        conn = self._connection(timeout)
        try:
            conn.request("POST", path, body=json.dumps(body or {}).encode(), headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status >= 400:
            try:
                err = json.loads(data)
            except ValueError:
                err = {}
            raise _refusal(resp.status, err.get("code"), err.get("error", resp.reason))
        return json.loads(data)

    def acquire(self):
        query = {"ttl_ms": int(self.ttl_s * 1000)}
        wait = None
        if self.timeout_s is not None:
            query["timeout_ms"] = int(self.timeout_s * 1000)
            wait = self.timeout_s + 5
        if self.slots is not None:
            query["slots"] = int(self.slots)
        body = _value_fields(self.value) if self.value is not None else None
        answer = self._post("acquire", body, query=query, timeout=wait)
        self.token, self._lease = answer["token"], answer["lease"]
        self.held, self.slot = answer["name"], answer.get("slot")
        # The acquire's deadline counts from its answer, which may have come late: renew
        # once at once so that the deadline counts from a send.
        self.deadline = time.monotonic()
        try:
            self._renew_once()
        except (SigmaError, OSError) as e:
            self.lost.set()
            self.release()
            raise LockGone(409, "lost", f"lock lost at once: {e}") from None
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
            except LockGone:  # not held any more, or the daemon stops
                self.lost.set()
                return
            except SigmaError:
                pass  # busy, not ready: try again until the deadline
            except (ConnectionRefusedError, FileNotFoundError):  # the daemon is gone
                self.lost.set()
                return
            except OSError:
                pass  # no answer in time: try again until the deadline

    def set_value(self, value):
        """Replaces the held lock's value (text or bytes, at most 4096 bytes): watchers
        and observers see it; answers its version (1 was the acquire's)."""
        body = {"token": self.token, "lease": self._lease, **_value_fields(value)}
        answer = self._post("value", body)
        self.value = value
        return answer["value_version"]

    def release(self):
        self._stop.set()
        if self._renewer:
            self._renewer.join()
        try:
            self._post("release", {"token": self.token, "lease": self._lease})
        except LockGone:
            self.lost.set()
        except OSError:
            self.lost.set()  # the daemon is gone: the lock runs out on its own

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


def _main():
    parser = argparse.ArgumentParser(description="Hold a sigma lock for a while.")
    parser.add_argument("name")
    parser.add_argument("--api", default=None, help="the daemon's API, IP:PORT or unix:PATH [$SIGMA_API, else the daemon's config file's, else unix:/run/sigma/api.sock if it exists, else 127.0.0.1:7591]")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to hold the lock")
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    parser.add_argument("--ttl", type=float, default=5.0, help="client lease in seconds")
    parser.add_argument("--value", default=None, help="a value to attach to the lock while held")
    parser.add_argument("--observe", action="store_true", help="print each leader's value instead (JSON lines)")
    parser.add_argument("--slots", type=int, default=None, help="a semaphore: one of this many slots (1 to 64)")
    args = parser.parse_args()
    api = args.api or os.environ.get("SIGMA_API") or default_api()
    if args.observe:
        try:
            for leader in observe(args.name, api=api, interval_s=0.1):
                print(json.dumps(leader), flush=True)
        except OSError as e:
            print(f"{parser.prog}: cannot reach the sigma daemon at {api}: {e}", file=sys.stderr)
            raise SystemExit(69) from None
        return
    try:
        with SigmaLock(
            args.name, api=api, timeout_s=args.timeout, ttl_s=args.ttl, value=args.value, slots=args.slots
        ) as lock:
            print(f"acquired {lock.held} token {lock.token}", flush=True)
            lock.lost.wait(args.hold)
            if lock.lost.is_set():
                print(f"lost {lock.held} token {lock.token}", flush=True)
                raise SystemExit(76)
    except OSError as e:
        print(f"{parser.prog}: cannot reach the sigma daemon at {api} (is `sigma run` running?): {e}", file=sys.stderr)
        raise SystemExit(69) from None
    print(f"released {lock.held} token {lock.token}", flush=True)


def main():
    """The command (`sigma-lock-py` once installed with pip)."""
    try:
        _main()
    except SigmaError as e:
        print(f"{os.path.basename(sys.argv[0])}: {e}", file=sys.stderr)
        raise SystemExit(75 if isinstance(e, NotWon) else 69) from None


if __name__ == "__main__":
    main()

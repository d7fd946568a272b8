/**
 * A sigma lock from Node, with Node's built-in modules only.
 *
 * ```ts
 * import { withLock } from "sigma-lock";
 * await withLock("orders/42", async (lock, lost) => {
 *   await storage.write(data, { fencingToken: lock.token, signal: lost }); // lost: aborted if the lock is
 * });
 * ```
 *
 * The daemon (`sigma run`) holds the lock for this client under a client lease: a timer
 * renews it (`POST .../keepalive`) and `release()` (or the end of `withLock`) gives it
 * back; if this process dies, the daemon releases the lock one TTL after the last
 * renewal. A held lock's timer keeps the process alive until it is released or lost.
 *
 * The holder's contract: every answer states a deadline, the earliest time the lock may
 * go to someone else. The client counts it from when it *sent* the request that answered
 * it (`lock.deadline`, on `performance.now()`), and `lock.lost` (an `AbortSignal`) is
 * aborted at that deadline unless a later renewal moved it on, whatever the daemon
 * answered meanwhile (busy, no answer in time); at once if the daemon says the lock is
 * gone (404 `not_held`), that it is stopping (503 `stopping`), or refuses the connection
 * (it is not running). Stop touching the resource when `lost` is aborted. The lease id the acquire
 * answers is the secret that proves this client holds the lock; the fencing token
 * (`lock.token`, a `bigint`: it is a 64-bit integer) is public: pass it to the protected
 * resource.
 *
 * @module
 */

import { existsSync, readFileSync } from "node:fs";
import * as http from "node:http";
import { performance } from "node:perf_hooks";

/** The client lease when none is given: the daemon releases the lock this long after the last renewal. */
export const DEFAULT_TTL_MS = 5000;
/** Where the shipped unit and config serve the API. */
export const DEFAULT_SOCKET = "/run/sigma/api.sock";
/** The API's default loopback port. */
export const DEFAULT_ADDR = "127.0.0.1:7591";
/** The daemon's config file when `$SIGMA_CONFIG` is not set. */
export const DEFAULT_CONFIG = "/etc/sigma/sigma.toml";

/** How much longer than an acquire's own timeout the client waits for the daemon's answer: the daemon answers a timeout itself; this only bounds a hung daemon. */
const ACQUIRE_SLACK_MS = 5000;
/** Deadline of a release. */
const CALL_TIMEOUT_MS = 30_000;
/** The shortest wait between renewals. */
const MIN_WAIT_MS = 50;

/** Options of {@link acquire} and {@link withLock}; all optional. */
export interface Options {
  /** The daemon's address, `IP:PORT` or `unix:PATH`; absent: {@link defaultApi}. */
  api?: string;
  /** The client lease in ms; absent: {@link DEFAULT_TTL_MS}. */
  ttlMs?: number;
  /** Give up the acquire after this many ms (a {@link SigmaError} with `isTimeout`: 423 `not_won`); absent: wait as long as it takes. */
  timeoutMs?: number;
  /** The bearer token's file, for a daemon run with `--api-token-file`; absent: `$SIGMA_API_TOKEN_FILE`, if set. */
  tokenFile?: string;
  /** Gives up a waiting acquire when aborted; `withLock` also passes it on to its function. */
  signal?: AbortSignal;
}

/** Every code of the daemon's error answers (`GET /v1/openapi.json` lists them; docs/operating.md, "Errors", says what to do on each), by HTTP status. */
export const ERROR_CODES = [
  "bad_request", // 400: a value, body or path that does not parse
  "unknown_parameter", // 400: a query parameter the route does not take
  "bad_name", // 400: not a lock name
  "bad_quorum", // 400: a quorum the swarm cannot use
  "bad_lease", // 400: no token and lease id
  "bad_value", // 400: a lock value over 4096 bytes, or bad base64
  "unauthorized", // 401: no or the wrong bearer token
  "admin_disabled", // 403: the daemon has no admin token
  "bad_host", // 403: Host is not loopback
  "bad_origin", // 403: a web page
  "revoke_refused", // 403: the holder refused the revoke
  "not_found", // 404: no such route
  "not_held", // 404: not held: stop using the lock
  "method_not_allowed", // 405
  "lost", // 409: won, then lost before it was handed over
  "body_too_large", // 413
  "bad_content_type", // 415
  "not_won", // 423: not won within the timeout
  "internal", // 500
  "not_ready", // 503: the node does not serve
  "held_back", // 503: a new lock waits out the takeover delay
  "unresponsive", // 503: the node did not answer, or stopped
  "stopping", // 503: the daemon stops: a holder must stop using the lock
  "busy", // 503: too many requests at once
  "too_many_waiters", // 503: too many acquires wait for this lock
  "too_many_locks", // 503: the daemon holds as many locks as it may
] as const;

/** Why the daemon refused a call. Act on it, never on the message. */
export type ErrorCode = (typeof ERROR_CODES)[number];

function isErrorCode(code: unknown): code is ErrorCode {
  return (ERROR_CODES as readonly unknown[]).includes(code);
}

/** A refusal of the daemon: its HTTP status, the {@link ErrorCode} of its body (`undefined` from something that is not a sigma daemon, or a code this client does not know) and its message. */
export class SigmaError extends Error {
  constructor(
    readonly status: number,
    readonly code: ErrorCode | undefined,
    message: string,
  ) {
    super(`HTTP ${status}${code ? " " + code : ""}: ${message}`);
    this.name = "SigmaError";
  }

  /** The lock was not won within `timeoutMs` (423 `not_won`). */
  get isTimeout(): boolean {
    return this.code === "not_won";
  }
}

/** Why a lock was lost: the reason of `lock.lost`. Stop using the lock. */
export class LostError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "LostError";
  }
}

/** No daemon answers at the address: nothing listens there, or the socket does not exist. */
export function isUnreachable(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === "ECONNREFUSED" || code === "ENOENT";
}

/** A renewal's error that means the lock is lost now: not held, the daemon stops, or it is not running. */
function gone(err: unknown): boolean {
  if (err instanceof SigmaError) return err.code === "not_held" || err.code === "stopping";
  return isUnreachable(err);
}

/**
 * Where the daemon listens when no address is given: `$SIGMA_API`, else the `api` of its
 * config file (`$SIGMA_CONFIG`, else /etc/sigma/sigma.toml), else its socket if it
 * exists, else the default port. A client never falls back to a port that any local
 * process could have bound while the daemon is down when the daemon's config names its
 * socket.
 */
export function defaultApi(): string {
  if (process.env.SIGMA_API) return process.env.SIGMA_API;
  let config: string | undefined;
  try {
    config = readFileSync(process.env.SIGMA_CONFIG || DEFAULT_CONFIG, "utf8");
  } catch {
    // no config file
  }
  const api = config === undefined ? undefined : configApi(config);
  if (api) return api;
  return existsSync(DEFAULT_SOCKET) ? "unix:" + DEFAULT_SOCKET : DEFAULT_ADDR;
}

/** The top-level `api = "..."` of a TOML config file: a basic or literal string on one line (the daemon's config files have no other form of it). */
export function configApi(toml: string): string | undefined {
  for (const raw of toml.split("\n")) {
    const line = raw.trim();
    if (line.startsWith("[")) return undefined; // a table: the top-level keys are behind
    const m = /^api\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)')/.exec(line);
    if (m) return m[2] ?? JSON.parse(`"${m[1]}"`);
  }
  return undefined;
}

/** Gives up a request after its budget. */
class NoAnswer extends Error {
  constructor(ms: number) {
    super(`no answer within ${Math.round(ms)} ms`);
    this.name = "NoAnswer";
  }
}

/** Speaks to one daemon's API. */
class Client {
  readonly #target: http.RequestOptions;
  readonly #bearer: string | undefined;

  constructor(
    readonly api: string,
    tokenFile: string | undefined,
  ) {
    if (api.startsWith("unix:")) {
      this.#target = { socketPath: api.slice("unix:".length), host: "localhost" };
    } else {
      const colon = api.lastIndexOf(":");
      this.#target = { host: api.slice(0, colon).replace(/^\[|\]$/g, ""), port: Number(api.slice(colon + 1)) };
    }
    this.#bearer = tokenFile ? readFileSync(tokenFile, "utf8").trim() : undefined;
  }

  /** POST /v1/locks/NAME/ACTION; the 200 answer's body, with the token as a string (it is a 64-bit integer). */
  post(
    name: string,
    action: string,
    req: { body?: string; query?: Record<string, string>; timeoutMs?: number; signal?: AbortSignal },
  ): Promise<Record<string, unknown>> {
    let path = `/v1/locks/${encodeURIComponent(name)}/${action}`;
    if (req.query) path += "?" + new URLSearchParams(req.query).toString();
    const body = req.body ?? "{}";
    // A JSON content type on every POST: the daemon refuses what a web form could send.
    const headers: http.OutgoingHttpHeaders = { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) };
    if (this.#bearer) headers.Authorization = "Bearer " + this.#bearer;
    return new Promise((resolve, reject) => {
      // A connection of its own (agent: false): nothing pooled outlives the call.
      const request = http.request({ ...this.#target, method: "POST", path, headers, agent: false, signal: req.signal }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("error", fail);
        res.on("end", () => {
          clearTimeout(timer);
          const text = Buffer.concat(chunks).toString("utf8");
          let answer: Record<string, unknown> = {};
          try {
            answer = JSON.parse(text.replace(/"token"\s*:\s*(\d+)/g, '"token":"$1"'));
          } catch {
            if ((res.statusCode ?? 500) < 400) return reject(new Error(`bad answer from the sigma daemon: ${text}`));
          }
          const status = res.statusCode ?? 500;
          if (status >= 400) {
            const message = typeof answer.error === "string" ? answer.error : (res.statusMessage ?? "");
            return reject(new SigmaError(status, isErrorCode(answer.code) ? answer.code : undefined, message));
          }
          resolve(answer);
        });
      });
      const timer = req.timeoutMs === undefined ? undefined : setTimeout(() => request.destroy(new NoAnswer(req.timeoutMs!)), req.timeoutMs);
      function fail(e: unknown) {
        clearTimeout(timer);
        reject(e);
      }
      request.on("error", fail);
      request.end(body);
    });
  }
}

/** A lock held through a daemon, renewed in the background until released or lost. Made by {@link acquire}. */
export class Lock {
  /** Aborted when the lock is lost (its `reason` a {@link LostError}): at its deadline with no renewal that moved it, or at once when the daemon says it is gone or stopping. Stop using the lock then. */
  readonly lost: AbortSignal;
  readonly #lost = new AbortController();
  readonly #client: Client;
  readonly #lease: string; // the secret: never printed
  readonly #ttlMs: number;
  #deadline: number;
  #stopped = false;
  #wake: (() => void) | undefined;
  #renewer: Promise<void> = Promise.resolve();

  private constructor(
    /** The lock's name. */
    readonly name: string,
    /** The fencing token: public; pass it to the protected resource, which refuses tokens lower than one it has seen. */
    readonly token: bigint,
    client: Client,
    lease: string,
    ttlMs: number,
  ) {
    this.lost = this.#lost.signal;
    this.#client = client;
    this.#lease = lease;
    this.#ttlMs = ttlMs;
    this.#deadline = performance.now();
  }

  /** See {@link acquire}. */
  static async acquire(name: string, opts: Options = {}): Promise<Lock> {
    const client = new Client(opts.api || defaultApi(), opts.tokenFile || process.env.SIGMA_API_TOKEN_FILE);
    const ttlMs = opts.ttlMs ?? DEFAULT_TTL_MS;
    const query: Record<string, string> = { ttl_ms: String(Math.round(ttlMs)) };
    let timeoutMs: number | undefined;
    if (opts.timeoutMs !== undefined) {
      query.timeout_ms = String(Math.round(opts.timeoutMs));
      timeoutMs = opts.timeoutMs + ACQUIRE_SLACK_MS;
    }
    const answer = await client.post(name, "acquire", { query, timeoutMs, signal: opts.signal });
    const lock = new Lock(name, BigInt(answer.token as string), client, answer.lease as string, ttlMs);
    // The acquire's deadline counts from its answer, which may have come late: renew
    // once at once so that the deadline counts from a send.
    try {
      await lock.#renewOnce();
    } catch (e) {
      lock.#lose(`at once: ${e instanceof Error ? e.message : e}`, e);
      await lock.release().catch(() => {});
      throw lock.lost.reason;
    }
    lock.#renewer = lock.#renew();
    return lock;
  }

  /** When (on `performance.now()`) the lock may be someone else's, unless a renewal moves it on. */
  get deadline(): number {
    return this.#deadline;
  }

  #lose(why: string, cause?: unknown): void {
    if (!this.#lost.signal.aborted) {
      this.#lost.abort(new LostError(`sigma lock lost: ${this.name} token ${this.token}: ${why}`, { cause }));
    }
  }

  /** Sends a keep-alive and moves the deadline to its answer, counted from the send. Gives up at the current deadline: an answer after it comes too late. */
  async #renewOnce(): Promise<void> {
    const sent = performance.now();
    const budget = this.#deadline > sent ? Math.max(MIN_WAIT_MS, this.#deadline - sent) : this.#ttlMs;
    const body = `{"token":${this.token},"lease":${JSON.stringify(this.#lease)}}`;
    const kept = await this.#client.post(this.name, "keepalive", { body, timeoutMs: budget });
    this.#deadline = Math.max(this.#deadline, sent + Number(kept.valid_for_ms));
  }

  /** Keeps the lock until release, or marks it lost: half-way to the deadline, at most every quarter of the TTL. */
  async #renew(): Promise<void> {
    for (;;) {
      const left = this.#deadline - performance.now();
      if (left <= 0) {
        this.#lose("no renewal answered before the deadline");
        return;
      }
      if (await this.#sleep(Math.min(Math.max(left / 2, MIN_WAIT_MS), this.#ttlMs / 4, left))) return;
      if (performance.now() >= this.#deadline) continue;
      try {
        await this.#renewOnce();
      } catch (e) {
        if (gone(e)) {
          this.#lose(e instanceof Error ? e.message : String(e), e);
          return;
        }
        // Any other failure (busy, no answer in time): try again until the deadline.
      }
    }
  }

  /** Waits `ms`; true if `release()` cut the wait short. */
  #sleep(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      if (this.#stopped) return resolve(true);
      const timer = setTimeout(() => {
        this.#wake = undefined;
        resolve(false);
      }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        resolve(true);
      };
    });
  }

  /** Stops the renewals and gives the lock back. A lock the daemon no longer holds (lost, expired) or a daemon that is gone is no error: `lost` is aborted then. */
  async release(): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    await this.#renewer;
    const body = `{"token":${this.token},"lease":${JSON.stringify(this.#lease)}}`;
    try {
      await this.#client.post(this.name, "release", { body, timeoutMs: CALL_TIMEOUT_MS });
    } catch (e) {
      if (!gone(e)) throw e;
      this.#lose(`at release: ${e instanceof Error ? e.message : e}`, e);
    }
  }
}

/** Waits until the lock named `name` is held for this client (or `timeoutMs`, or `signal`), and renews it in the background until `release()`. */
export function acquire(name: string, opts?: Options): Promise<Lock> {
  return Lock.acquire(name, opts);
}

/** A signal aborted when `a` or `b` is (`AbortSignal.any`, which Node 18 lacks), and how to stop listening to them. */
function either(a: AbortSignal, b: AbortSignal): [AbortSignal, () => void] {
  const both = new AbortController();
  const listeners = [a, b].map((s) => {
    const abort = () => both.abort(s.reason);
    if (s.aborted) abort();
    else s.addEventListener("abort", abort, { once: true });
    return () => s.removeEventListener("abort", abort);
  });
  return [both.signal, () => listeners.forEach((stop) => stop())];
}

/**
 * Holds the lock named `name` while `fn` runs, then releases it. `fn`'s signal is
 * aborted when the lock is lost (or `opts.signal` is): `fn` must stop touching the
 * resource then. Answers what `fn` answers; throws what it throws, else the
 * {@link LostError} if the lock was lost while it ran, else the release's error.
 */
export async function withLock<T>(name: string, fn: (lock: Lock, signal: AbortSignal) => Promise<T> | T, opts?: Options): Promise<T> {
  const lock = await acquire(name, opts);
  const [signal, unlisten] = opts?.signal ? either(lock.lost, opts.signal) : [lock.lost, () => {}];
  let result: T;
  try {
    result = await fn(lock, signal);
  } catch (e) {
    await lock.release().catch(() => {});
    throw e;
  } finally {
    unlisten();
  }
  const lostWhileRunning: unknown = lock.lost.aborted ? lock.lost.reason : undefined;
  await lock.release();
  if (lostWhileRunning !== undefined) throw lostWhileRunning;
  return result;
}

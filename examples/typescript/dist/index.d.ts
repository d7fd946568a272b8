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
/** The client lease when none is given: the daemon releases the lock this long after the last renewal. */
export declare const DEFAULT_TTL_MS = 5000;
/** Where the shipped unit and config serve the API. */
export declare const DEFAULT_SOCKET = "/run/sigma/api.sock";
/** The API's default loopback port. */
export declare const DEFAULT_ADDR = "127.0.0.1:7591";
/** The daemon's config file when `$SIGMA_CONFIG` is not set. */
export declare const DEFAULT_CONFIG = "/etc/sigma/sigma.toml";
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
export declare const ERROR_CODES: readonly ["bad_request", "unknown_parameter", "bad_name", "bad_quorum", "bad_lease", "bad_value", "unauthorized", "admin_disabled", "bad_host", "bad_origin", "revoke_refused", "not_found", "not_held", "method_not_allowed", "lost", "body_too_large", "bad_content_type", "not_won", "internal", "not_ready", "held_back", "unresponsive", "stopping", "busy", "too_many_waiters", "too_many_locks"];
/** Why the daemon refused a call. Act on it, never on the message. */
export type ErrorCode = (typeof ERROR_CODES)[number];
/** A refusal of the daemon: its HTTP status, the {@link ErrorCode} of its body (`undefined` from something that is not a sigma daemon, or a code this client does not know) and its message. */
export declare class SigmaError extends Error {
    readonly status: number;
    readonly code: ErrorCode | undefined;
    constructor(status: number, code: ErrorCode | undefined, message: string);
    /** The lock was not won within `timeoutMs` (423 `not_won`). */
    get isTimeout(): boolean;
}
/** Why a lock was lost: the reason of `lock.lost`. Stop using the lock. */
export declare class LostError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
/** No daemon answers at the address: nothing listens there, or the socket does not exist. */
export declare function isUnreachable(err: unknown): boolean;
/**
 * Where the daemon listens when no address is given: `$SIGMA_API`, else the `api` of its
 * config file (`$SIGMA_CONFIG`, else /etc/sigma/sigma.toml), else its socket if it
 * exists, else the default port. A client never falls back to a port that any local
 * process could have bound while the daemon is down when the daemon's config names its
 * socket.
 */
export declare function defaultApi(): string;
/** The top-level `api = "..."` of a TOML config file: a basic or literal string on one line (the daemon's config files have no other form of it). */
export declare function configApi(toml: string): string | undefined;
/** A lock held through a daemon, renewed in the background until released or lost. Made by {@link acquire}. */
export declare class Lock {
    #private;
    /** The lock's name. */
    readonly name: string;
    /** The fencing token: public; pass it to the protected resource, which refuses tokens lower than one it has seen. */
    readonly token: bigint;
    /** Aborted when the lock is lost (its `reason` a {@link LostError}): at its deadline with no renewal that moved it, or at once when the daemon says it is gone or stopping. Stop using the lock then. */
    readonly lost: AbortSignal;
    private constructor();
    /** See {@link acquire}. */
    static acquire(name: string, opts?: Options): Promise<Lock>;
    /** When (on `performance.now()`) the lock may be someone else's, unless a renewal moves it on. */
    get deadline(): number;
    /** Stops the renewals and gives the lock back. A lock the daemon no longer holds (lost, expired) or a daemon that is gone is no error: `lost` is aborted then. */
    release(): Promise<void>;
}
/** Waits until the lock named `name` is held for this client (or `timeoutMs`, or `signal`), and renews it in the background until `release()`. */
export declare function acquire(name: string, opts?: Options): Promise<Lock>;
/**
 * Holds the lock named `name` while `fn` runs, then releases it. `fn`'s signal is
 * aborted when the lock is lost (or `opts.signal` is): `fn` must stop touching the
 * resource then. Answers what `fn` answers; throws what it throws, else the
 * {@link LostError} if the lock was lost while it ran, else the release's error.
 */
export declare function withLock<T>(name: string, fn: (lock: Lock, signal: AbortSignal) => Promise<T> | T, opts?: Options): Promise<T>;

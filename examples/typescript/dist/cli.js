#!/usr/bin/env node
/**
 * Holds a sigma lock for a while: the Node client's counterpart of
 * examples/python/sigma_lock.py, with the same options and output.
 *
 *     sigma-lock-ts [--api 127.0.0.1:7591|unix:PATH] [--hold SECONDS] [--ttl SECONDS] [--timeout SECONDS] NAME
 *
 * It prints `acquired NAME token T`, holds the lock, prints `released NAME token T`; or
 * `lost NAME token T` (exit 76) if the lock is lost meanwhile. Exit 75: not won within
 * --timeout; 69: no daemon, or it refused.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { acquire, defaultApi, LostError, SigmaError } from "./index.js";
const USAGE = `usage: sigma-lock-ts [options] NAME
Hold a sigma lock for a while.
  --api ADDR         the daemon's API, IP:PORT or unix:PATH [$SIGMA_API, else the daemon's config
                     file's, else unix:/run/sigma/api.sock if it exists, else 127.0.0.1:7591]
  --hold SECONDS     seconds to hold the lock (0)
  --ttl SECONDS      client lease in seconds (5)
  --timeout SECONDS  give up after this many seconds (wait as long as it takes)`;
function seconds(value, flag) {
    if (value === undefined)
        return undefined;
    const s = Number(value);
    if (!Number.isFinite(s) || s < 0) {
        console.error(`sigma-lock-ts: --${flag}: not a number of seconds: ${value}\n${USAGE}`);
        process.exit(64);
    }
    return s * 1000;
}
async function main() {
    let parsed;
    try {
        parsed = parseArgs({
            options: {
                api: { type: "string" },
                hold: { type: "string" },
                ttl: { type: "string" },
                timeout: { type: "string" },
                help: { type: "boolean", short: "h" },
            },
            allowPositionals: true,
        });
    }
    catch (e) {
        console.error(`sigma-lock-ts: ${e instanceof Error ? e.message : e}\n${USAGE}`);
        return 64;
    }
    const { values, positionals } = parsed;
    if (values.help) {
        console.log(USAGE);
        return 0;
    }
    if (positionals.length !== 1) {
        console.error(USAGE);
        return 64;
    }
    const name = positionals[0];
    const api = values.api || defaultApi();
    const holdMs = seconds(values.hold, "hold") ?? 0;
    let lock;
    try {
        lock = await acquire(name, { api, ttlMs: seconds(values.ttl, "ttl"), timeoutMs: seconds(values.timeout, "timeout") });
    }
    catch (e) {
        return failed(api, e);
    }
    console.log(`acquired ${lock.name} token ${lock.token}`);
    const lost = await new Promise((resolve) => {
        const timer = setTimeout(() => resolve(false), holdMs);
        lock.lost.addEventListener("abort", () => {
            clearTimeout(timer);
            resolve(true);
        });
    });
    if (lost) {
        console.log(`lost ${lock.name} token ${lock.token}`);
        console.error(`sigma-lock-ts: ${lock.lost.reason.message}`);
        await lock.release().catch(() => { }); // lost already: a failure says nothing new
        return 76;
    }
    try {
        await lock.release();
    }
    catch (e) {
        return failed(api, e);
    }
    console.log(`released ${lock.name} token ${lock.token}`);
    return 0;
}
/** Says why on stderr and answers the exit code. */
function failed(api, e) {
    if (e instanceof LostError) {
        console.error(`sigma-lock-ts: ${e.message}`);
        return 76;
    }
    if (e instanceof SigmaError) {
        console.error(`sigma-lock-ts: ${e.message}`);
        return e.isTimeout ? 75 : 69;
    }
    console.error(`sigma-lock-ts: cannot reach the sigma daemon at ${api} (is \`sigma run\` running?): ${e instanceof Error ? e.message : e}`);
    return 69;
}
process.exitCode = await main();

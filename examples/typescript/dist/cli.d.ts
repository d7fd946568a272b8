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
export {};

//! Command holders: `sigma lock NAME -- CMD` run for real, in a loop, through the
//! testnet's nodes (`sigma-testnet run --holders N`), as a script or a cron job holds a
//! lock. Each command writes when it started and when it stopped (at its natural end,
//! or when `sigma lock` told it to stop with SIGTERM) into a file of its own; the check
//! is on those timestamps: no two commands of one lock may run at once. This is the
//! holder contract seen from the commands themselves: a daemon that released a lock
//! under a running command (an overloaded API, a graceful stop, a dead daemon) shows up
//! here even when the daemons' own bookkeeping looks fine.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;

use super::workload::{world, NodeState, Shared};

/// Options of the command holders.
#[derive(Clone, Debug)]
pub struct HolderOptions {
    /// Holder loops (0: none).
    pub holders: usize,
    /// Locks they share (`testnet-cmd0`, …).
    pub locks: usize,
    /// How long each command runs unless stopped.
    pub hold: Duration,
    /// The `sigma` binary.
    pub sigma_bin: PathBuf,
    /// Where the commands write their timestamps.
    pub dir: PathBuf,
    /// Seed of the node choices.
    pub seed: u64,
}

/// One command's run, as it recorded it (ns since the Unix epoch).
#[derive(Clone, Debug, Serialize)]
pub struct Held {
    /// Lock index.
    pub lock: usize,
    /// Holder loop.
    pub holder: usize,
    /// Fencing token it was given.
    pub token: u64,
    /// When it started.
    pub start_ns: u128,
    /// When it stopped: its own last line, or, if it was killed before it could write
    /// one, when `sigma lock` exited.
    pub end_ns: u128,
    /// `sigma lock`'s exit status (76: the lock was lost while the command ran).
    pub exit: Option<i32>,
}

/// Two commands of one lock that ran at once.
#[derive(Clone, Debug, Serialize)]
pub struct Overlap {
    /// Lock index.
    pub lock: usize,
    /// The earlier command's token and holder.
    pub first: (u64, usize),
    /// The later command's token and holder.
    pub second: (u64, usize),
    /// How long they ran together, ms.
    pub ms: f64,
}

/// What the holders did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HolderReport {
    /// Commands that ran (got the lock).
    pub commands: usize,
    /// Of which `sigma lock` reported the lock lost (exit 76).
    pub lost: usize,
    /// `sigma lock` runs that did not get the lock (timeout, daemon gone, not ready).
    pub not_acquired: usize,
    /// Pairs of commands of one lock that ran at once.
    pub overlaps: Vec<Overlap>,
}

/// The running holder loops.
pub struct Holders {
    stop: Arc<AtomicBool>,
    runs: Arc<Mutex<Vec<Held>>>,
    not_acquired: Arc<Mutex<usize>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The lock name of command lock `i`.
pub fn lock_name(i: usize) -> String {
    format!("testnet-cmd{i}")
}

impl Holders {
    /// Starts `opts.holders` loops (none if 0).
    pub fn start(opts: &HolderOptions, shared: &Shared) -> std::io::Result<Holders> {
        std::fs::create_dir_all(&opts.dir)?;
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(Mutex::new(Vec::new()));
        let not_acquired = Arc::new(Mutex::new(0));
        let tasks = (0..opts.holders)
            .map(|h| {
                let (opts, shared, stop, runs, not_acquired) =
                    (opts.clone(), shared.clone(), stop.clone(), runs.clone(), not_acquired.clone());
                tokio::spawn(async move {
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed ^ (h as u64).wrapping_mul(0x9e37));
                    let lock = h % opts.locks.max(1);
                    let mut seq = 0u64;
                    while !stop.load(Ordering::SeqCst) {
                        let up: Vec<_> = {
                            let w = world(&shared);
                            w.nodes.iter().filter(|s| s.state == NodeState::Up).map(|s| s.api).collect()
                        };
                        if up.is_empty() {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                        let api = up[rng.gen_range(0..up.len())];
                        seq += 1;
                        let file = opts.dir.join(format!("h{h}-{seq}.log"));
                        match run_once(&opts, lock, &api.to_string(), &file).await {
                            Some((token, start_ns, end_ns, exit)) => {
                                let held = Held { lock, holder: h, token, start_ns, end_ns, exit };
                                runs.lock().unwrap_or_else(|e| e.into_inner()).push(held);
                            }
                            None => *not_acquired.lock().unwrap_or_else(|e| e.into_inner()) += 1,
                        }
                    }
                })
            })
            .collect();
        Ok(Holders { stop, runs, not_acquired, tasks })
    }

    /// Lets the commands running now end (within `grace`), then checks what they wrote.
    pub async fn stop(self, grace: Duration) -> HolderReport {
        self.stop.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + grace;
        for mut t in self.tasks {
            if tokio::time::timeout_at(deadline, &mut t).await.is_err() {
                t.abort();
            }
        }
        let runs = std::mem::take(&mut *self.runs.lock().unwrap_or_else(|e| e.into_inner()));
        let not_acquired = *self.not_acquired.lock().unwrap_or_else(|e| e.into_inner());
        HolderReport {
            commands: runs.len(),
            lost: runs.iter().filter(|r| r.exit == Some(76)).count(),
            not_acquired,
            overlaps: overlaps(&runs),
        }
    }
}

/// One `sigma lock` run: `(token, start, end, exit status)` if the command ran.
async fn run_once(opts: &HolderOptions, lock: usize, api: &str, file: &Path) -> Option<(u64, u128, u128, Option<i32>)> {
    let f = file.display();
    let hold = opts.hold.as_secs_f64();
    // `sleep & wait` so that the TERM trap runs at once; `date +%s%N` as the command's
    // own clock.
    let script = format!(
        "trap 'echo end $(date +%s%N) >> {f}; exit 0' TERM; echo start $(date +%s%N) $SIGMA_FENCING_TOKEN >> {f}; \
         sleep {hold:.3} & wait $!; echo end $(date +%s%N) >> {f}"
    );
    let status = tokio::process::Command::new(&opts.sigma_bin)
        .args(["lock", &lock_name(lock), "--api", api, "--timeout", "20s", "--ttl", "2s", "--grace", "500ms"])
        .args(["--", "sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .ok();
    let exited_ns = now_ns();
    let text = std::fs::read_to_string(file).ok()?;
    let mut start = None;
    let mut end = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["start", t, token] => start = Some((t.parse().ok()?, token.parse().ok()?)),
            ["end", t] => end = end.or(t.parse().ok()),
            _ => {}
        }
    }
    let (start_ns, token) = start?;
    Some((token, start_ns, end.unwrap_or(exited_ns), status.and_then(|s| s.code())))
}

fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Pairs of runs of one lock whose [start, end] intervals intersect.
pub fn overlaps(runs: &[Held]) -> Vec<Overlap> {
    let mut found = Vec::new();
    let locks = runs.iter().map(|r| r.lock).max().map_or(0, |m| m + 1);
    for lock in 0..locks {
        let mut mine: Vec<&Held> = runs.iter().filter(|r| r.lock == lock).collect();
        mine.sort_by_key(|r| r.start_ns);
        let mut latest: Option<&Held> = None;
        for r in mine {
            if let Some(prev) = latest {
                if r.start_ns < prev.end_ns {
                    let ms = (prev.end_ns.min(r.end_ns) - r.start_ns) as f64 / 1e6;
                    found.push(Overlap { lock, first: (prev.token, prev.holder), second: (r.token, r.holder), ms });
                }
            }
            if latest.is_none_or(|p| r.end_ns > p.end_ns) {
                latest = Some(r);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(lock: usize, holder: usize, start_ns: u128, end_ns: u128) -> Held {
        Held { lock, holder, token: start_ns as u64, start_ns, end_ns, exit: Some(0) }
    }

    #[test]
    fn successive_commands_do_not_overlap_and_concurrent_ones_do() {
        let ms = 1_000_000;
        let back_to_back = [held(0, 0, 0, 10 * ms), held(0, 1, 10 * ms, 20 * ms), held(1, 2, 5 * ms, 15 * ms)];
        assert!(overlaps(&back_to_back).is_empty());
        // A long first run that a later one starts inside, after a short one in between.
        let nested = [held(0, 0, 0, 30 * ms), held(0, 1, 31 * ms, 40 * ms), held(0, 2, 10 * ms, 12 * ms)];
        let found = overlaps(&nested);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].first.1, found[0].second.1), (0, 2));
        assert!((found[0].ms - 2.0).abs() < 1e-9);
    }
}

//! Election observers (`sigma-testnet run --observers K`): the first lock
//! (`testnet-r0`) is an election whose candidates are its HTTP clients (each campaigns
//! with its client id as the value), and K watchers follow it through the nodes
//! (`GET /v1/watch/{name}`, observer j through node j, failing over when its node is
//! down), recording every state they are told and when their stream was down.
//!
//! The check, per observer, against the leaders' own terms (the clients' critical
//! sections on that lock):
//! - **order**: within one stream, the held states' (token, value version) never go
//!   back;
//! - **every leader seen**: a leader whose term outlasted the watch's delay bound
//!   ([`SEEN_WITHIN`]) was named by the observer, unless the observer could not
//!   tell during that term: its stream was down, or it was told `unknown` (the
//!   replicas that answered could not tell, or the holder's node did not answer),
//!   which is what a partition, a kill or a pause makes it say. A leader missed while
//!   the observer was told the lock was free or held by another is a broken promise.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use sigma_daemon::client::Client;
use sigma_node::watch::{Held, LockState};

use super::check::Cs;
use super::workload::{world, NodeState, Shared};

/// How often the observers' watches inspect the lock.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// A leader term at least this long must be seen: the watch's delay bound (an
/// interval, then an inspection: at most [`sigma_node::watch::QUESTION_DEADLINE`] for
/// the hosts and as long for the holder) and half a second for a loaded machine.
pub const SEEN_WITHIN: Duration = Duration::from_millis(100 + 2 * 1000 + 500);

/// What one observer was told.
#[derive(Debug, Default)]
struct Log {
    /// (when, stream number, state).
    states: Vec<(Duration, u32, LockState)>,
    /// Times its stream was down: (from, to).
    down: Vec<(Duration, Duration)>,
}

/// The running observers.
pub struct Observers {
    logs: Vec<Arc<Mutex<Log>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A leader an observer missed while it could tell.
#[derive(Clone, Debug, Serialize)]
pub struct Missed {
    /// Observer.
    pub observer: usize,
    /// The leader's token.
    pub token: u64,
    /// Its term, ms since the workload started.
    pub enter_ms: f64,
    /// End of its term.
    pub exit_ms: f64,
    /// What the observer was told from the state in force at the term's start to its
    /// end: `ms: state [token]`.
    pub told: Vec<String>,
}

/// What the observers saw, checked.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ObserverReport {
    /// Observers.
    pub observers: usize,
    /// Leaders (terms on the election lock) long enough to be seen.
    pub long_terms: usize,
    /// (observer, leaders it named) of those.
    pub seen: Vec<usize>,
    /// Missed while the observer's stream was down or it was told `unknown`.
    pub excused: usize,
    /// Missed while it could tell: a broken promise.
    pub missed: Vec<Missed>,
    /// Held states whose (token, version) went back within one stream.
    pub out_of_order: usize,
    /// States received in all.
    pub states: usize,
    /// Streams opened in all (one per observer, more after failovers).
    pub streams: u32,
}

impl Observers {
    /// Starts `count` observers of `name`; times are counted from `start`.
    pub fn start(count: usize, name: &str, shared: &Shared, http: &reqwest::Client, start: Instant) -> Observers {
        let stop = Arc::new(AtomicBool::new(false));
        let mut logs = Vec::new();
        let mut tasks = Vec::new();
        for j in 0..count {
            let log = Arc::new(Mutex::new(Log::default()));
            logs.push(log.clone());
            let (shared, http, stop, name) = (shared.clone(), http.clone(), stop.clone(), name.to_owned());
            tasks.push(tokio::spawn(observe(j, name, shared, http, stop, start, log)));
        }
        Observers { logs, stop, tasks }
    }

    /// Stops the observers and checks what they saw against the leaders' `terms`.
    pub async fn stop(self, terms: &[Cs]) -> ObserverReport {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        let logs: Vec<Log> =
            self.logs.into_iter().map(|l| std::mem::take(&mut *l.lock().unwrap_or_else(|e| e.into_inner()))).collect();
        check(&logs, terms)
    }
}

fn node_up(shared: &Shared, i: usize) -> bool {
    world(shared).nodes.get(i).is_some_and(|s| s.state == NodeState::Up)
}

async fn observe(
    j: usize,
    name: String,
    shared: Shared,
    http: reqwest::Client,
    stop: Arc<AtomicBool>,
    start: Instant,
    log: Arc<Mutex<Log>>,
) {
    let mut stream = 0u32;
    let mut down_since = Some(start.elapsed());
    while !stop.load(Ordering::SeqCst) {
        // Its own node (j mod N) if up, else the next that is.
        let Some((node, api)) = world(&shared).up_from(j) else {
            tokio::time::sleep(INTERVAL).await;
            continue;
        };
        let Ok(mut events) = Client::with_http(api, http.clone()).watch(&name, Some(INTERVAL)).await else {
            tokio::time::sleep(INTERVAL).await;
            continue;
        };
        stream += 1;
        // Down until the first state of this stream arrives (a watch's first state
        // comes at once); a stream ends with its node (killed, paused: the stream of a
        // paused node stays open and silent, so the node's state is checked).
        loop {
            tokio::select! {
                next = events.next() => {
                    let Some(Ok(state)) = next else { break };
                    let now = start.elapsed();
                    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(from) = down_since.take() {
                        l.down.push((from, now));
                    }
                    l.states.push((now, stream, state));
                }
                () = tokio::time::sleep(INTERVAL) => {
                    if !node_up(&shared, node) || stop.load(Ordering::SeqCst) {
                        break;
                    }
                }
            }
        }
        if down_since.is_none() {
            down_since = Some(start.elapsed());
        }
    }
    if let Some(from) = down_since {
        log.lock().unwrap_or_else(|e| e.into_inner()).down.push((from, start.elapsed()));
    }
}

fn check(logs: &[Log], terms: &[Cs]) -> ObserverReport {
    let long: Vec<&Cs> = terms.iter().filter(|t| t.exit.saturating_sub(t.enter) >= SEEN_WITHIN).collect();
    let mut r = ObserverReport { observers: logs.len(), long_terms: long.len(), ..ObserverReport::default() };
    for (o, log) in logs.iter().enumerate() {
        r.states += log.states.len();
        r.streams += log.states.iter().map(|(_, s, _)| *s).max().unwrap_or(0);
        let mut last: Option<(u32, (u64, u32))> = None;
        for (_, stream, st) in &log.states {
            if let (Held::Held, Some(h)) = (st.state, &st.holder) {
                let seen = (h.token.unwrap_or(0), h.value_version);
                if last.is_some_and(|(s, prev)| s == *stream && seen < prev) {
                    r.out_of_order += 1;
                }
                last = Some((*stream, seen));
            }
        }
        let named = |token: u64| {
            log.states
                .iter()
                .any(|(_, _, s)| s.state == Held::Held && s.holder.as_ref().and_then(|h| h.token) == Some(token))
        };
        let mut seen = 0;
        for t in &long {
            if named(t.token) {
                seen += 1;
                continue;
            }
            // Could it tell during the term? Not if its stream was down, or it was told
            // unknown (the state in force at the term's start counts too).
            let down = log.down.iter().any(|(from, to)| *from < t.exit && *to > t.enter);
            let in_force = log.states.iter().rev().find(|(at, _, _)| *at <= t.enter);
            let unknown = in_force.is_some_and(|(_, _, s)| s.state == Held::Unknown)
                || log.states.iter().any(|(at, _, s)| *at > t.enter && *at < t.exit && s.state == Held::Unknown);
            if down || unknown {
                r.excused += 1;
            } else {
                let from = log.states.iter().rposition(|(at, _, _)| *at <= t.enter).unwrap_or(0);
                let told = log.states[from..]
                    .iter()
                    .take_while(|(at, _, _)| *at < t.exit)
                    .map(|(at, _, s)| {
                        let token = s.holder.as_ref().and_then(|h| h.token).map_or(String::new(), |t| format!(" {t}"));
                        format!("{:.0}: {:?}{token}", at.as_secs_f64() * 1e3, s.state)
                    })
                    .collect();
                r.missed.push(Missed {
                    observer: o,
                    token: t.token,
                    enter_ms: t.enter.as_secs_f64() * 1e3,
                    exit_ms: t.exit.as_secs_f64() * 1e3,
                    told,
                });
            }
        }
        r.seen.push(seen);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use sigma_node::inspect::{AcquisitionRef, HolderView};

    fn held(seq: u64, token: u64) -> LockState {
        let holder = HolderView {
            acquisition: AcquisitionRef { peer: "p".into(), counter: token },
            replicas: 3,
            token: Some(token),
            valid_for_ms: Some(900),
            lease_left_ms: 900,
            value: None,
            value_base64: None,
            value_version: 0,
        };
        LockState { name: "x".into(), seq, state: Held::Held, holder: Some(holder), waiters: 0, answered: 3, n: 3 }
    }

    fn unknown(seq: u64) -> LockState {
        LockState { name: "x".into(), seq, state: Held::Unknown, holder: None, waiters: 0, answered: 1, n: 3 }
    }

    fn term(token: u64, enter: u64, exit: u64) -> Cs {
        Cs {
            client: 0,
            resource: 0,
            node: 0,
            token,
            enter: Duration::from_secs(enter),
            exit: Duration::from_secs(exit),
            valid_until: Duration::from_secs(exit),
        }
    }

    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_leader_missed_while_the_observer_could_tell_is_caught() {
        assert_eq!(SEEN_WITHIN, INTERVAL + 2 * sigma_node::watch::QUESTION_DEADLINE + Duration::from_millis(500));
        let terms = [term(10, 1, 4), term(20, 5, 8), term(30, 9, 12), term(40, 13, 13)];
        // Sees 10 and 30; told unknown during 20's term; 40's term is too short to count.
        let log = Log {
            states: vec![(at(2), 1, held(1, 10)), (at(6), 1, unknown(2)), (at(10), 1, held(3, 30))],
            down: vec![(at(0), at(1))],
        };
        let r = check(&[log], &terms);
        assert_eq!((r.long_terms, r.seen.clone(), r.excused, r.missed.len(), r.out_of_order), (3, vec![2], 1, 0, 0));
        // The same, but told it was still 10 during 20's term: 20 missed while it could tell.
        let log = Log { states: vec![(at(2), 1, held(1, 10)), (at(10), 1, held(3, 30))], down: vec![] };
        let r = check(&[log], &terms);
        assert_eq!(r.missed.iter().map(|m| m.token).collect::<Vec<_>>(), vec![20]);
    }

    #[test]
    fn order_is_checked_within_a_stream() {
        let log = Log {
            states: vec![(at(2), 1, held(1, 30)), (at(3), 1, held(2, 10)), (at(4), 2, held(1, 5))],
            down: vec![],
        };
        let r = check(&[log], &[]);
        assert_eq!((r.out_of_order, r.streams), (1, 2), "a new stream may start anywhere");
    }
}

//! `sigma watch` (a lock's states as they change) and `sigma observe` (its leaders).

use std::io::Write as _;
use std::time::Duration;

use clap::Args;
use sigma_daemon::client::{ClientError, Events};
use sigma_node::inspect::HolderView;
use sigma_node::watch::{Held, LockState};

use super::api::{api_error, ApiArgs};
use super::{init_tracing, parse_duration};

#[derive(Args, Debug)]
pub(crate) struct WatchArgs {
    /// Lock name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) api: ApiArgs,
    /// How often the daemon inspects the lock (100ms to 60s): a change shows within
    /// about this long plus one inspection.
    #[arg(long, value_parser = parse_duration, default_value = "500ms")]
    pub(crate) interval: Duration,
    /// One JSON object per line (the daemon's events as they come).
    #[arg(long)]
    pub(crate) json: bool,
}

/// A state on one line: `3 held token 1764… by 12D3…#7 value "…" (version 2), 1 waiting`.
fn state_line(s: &LockState) -> String {
    let holder = |h: &HolderView| format!("{}#{}", h.acquisition.peer, h.acquisition.counter);
    let what = match (s.state, &s.holder) {
        (Held::Held, Some(h)) => {
            let mut line = format!("held token {} by {}", h.token.unwrap_or(0), holder(h));
            line.push_str(&value_words(h));
            line
        }
        (Held::Unknown, Some(h)) => format!("unknown: {} owns the replicas but did not answer", holder(h)),
        (Held::Unknown, None) => format!("unknown: {} of {} replica hosts answered", s.answered, s.n),
        (_, _) => "free".to_owned(),
    };
    format!("{} {what}, {} waiting", s.seq, s.waiters)
}

fn value_words(h: &HolderView) -> String {
    match (&h.value, &h.value_base64) {
        (Some(v), _) => format!(" value {} (version {})", sigma_node::value::quoted(v), h.value_version),
        (None, Some(b)) => format!(" value (base64) {b} (version {})", h.value_version),
        (None, None) => String::new(),
    }
}

pub(crate) async fn watch(args: WatchArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    let what = format!("watch {}", args.name);
    let events = args.api.connect()?.watch(&args.name, Some(args.interval)).await.map_err(|e| api_error(&what, e))?;
    print_events(events, &what, |state| if args.json { serde_json::to_string(state) } else { Ok(state_line(state)) })
        .await
}

pub(crate) async fn observe(args: WatchArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    let what = format!("observe {}", args.name);
    let leaders =
        args.api.connect()?.observe(&args.name, Some(args.interval)).await.map_err(|e| api_error(&what, e))?;
    // etcdctl's convention: the leader's value, a line each (JSON with --json).
    print_events(leaders, &what, |leader: &HolderView| {
        if args.json {
            serde_json::to_string(leader)
        } else {
            Ok(leader.value.clone().or(leader.value_base64.clone()).unwrap_or_default())
        }
    })
    .await
}

/// Prints each event as `line` renders it, until the stream ends (an error: the daemon
/// does not end a watch) or fails.
async fn print_events<T: serde::de::DeserializeOwned>(
    mut events: Events<T>,
    what: &str,
    line: impl Fn(&T) -> serde_json::Result<String>,
) -> anyhow::Result<u8> {
    let mut out = std::io::stdout();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| api_error(what, e))?;
        writeln!(out, "{}", line(&event)?)?;
        out.flush()?;
    }
    Err(api_error(what, ClientError::Decode("the daemon ended the stream".to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sigma_node::inspect::AcquisitionRef;

    #[test]
    fn a_state_reads_on_one_line() {
        let h = HolderView {
            acquisition: AcquisitionRef { peer: "P".into(), counter: 7 },
            replicas: 3,
            token: Some(42),
            valid_for_ms: Some(900),
            lease_left_ms: 900,
            value: Some("10.0.0.1:5432".into()),
            value_base64: None,
            value_version: 2,
        };
        let s =
            LockState { name: "x".into(), seq: 3, state: Held::Held, holder: Some(h), waiters: 1, answered: 5, n: 5 };
        assert_eq!(state_line(&s), "3 held token 42 by P#7 value \"10.0.0.1:5432\" (version 2), 1 waiting");
        let free = LockState { state: Held::Free, holder: None, waiters: 0, ..s.clone() };
        assert_eq!(state_line(&free), "3 free, 0 waiting");
        let unknown = LockState { state: Held::Unknown, holder: None, answered: 2, ..free };
        assert_eq!(state_line(&unknown), "3 unknown: 2 of 5 replica hosts answered, 0 waiting");
    }
}

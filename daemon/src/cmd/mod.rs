//! The subcommands of `sigma`, one module each, and what they share: exit codes,
//! errors that carry one, durations on the command line, logging.

use std::path::PathBuf;
use std::time::Duration;

pub(crate) mod admin;
pub(crate) mod api;
pub(crate) mod lock;
pub(crate) mod run;
pub(crate) mod status;
pub(crate) mod top;
pub(crate) mod watch;

/// Exit code of `sigma lock` when the lock was not acquired within `--timeout`.
pub(crate) const EXIT_TIMEOUT: u8 = 75;
/// How long `sigma lock --try` tries.
pub(crate) const TRY_TIMEOUT: Duration = Duration::from_secs(1);
/// Exit code of `sigma lock` when the lock was lost while the command ran.
pub(crate) const EXIT_LOST: u8 = 76;
/// Exit code when the daemon cannot be reached or fails.
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code for a request the daemon refused (bad lock name or quorum).
pub(crate) const EXIT_USAGE: u8 = 64;
/// Exit code of `sigma lock` when the daemon does not serve: it has not joined its
/// swarm yet, or reaches no majority of the peers it knows.
pub(crate) const EXIT_NOT_READY: u8 = 78;

/// An error with a chosen exit code.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: u8,
    pub(crate) msg: String,
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Fail {}

pub(crate) fn fail(code: u8, msg: impl Into<String>) -> anyhow::Error {
    Fail { code, msg: msg.into() }.into()
}

/// Parses "500ms", "10s", "2m", "1h", "1m30s", "1.5s"; a bare number is seconds.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty duration".to_owned());
    }
    let bad = || format!("bad duration {s:?}: expected e.g. 500ms, 10s, 2m, 1h, 1m30s");
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        rest = &rest[unit_len..];
        let part = Duration::try_from_secs_f64(value * scale).map_err(|_| bad())?;
        total = total.checked_add(part).ok_or_else(bad)?;
    }
    Ok(total)
}

pub(crate) fn init_tracing(default: &str) {
    init_tracing_as(LogFormat::Text, default);
}

/// Logs on stderr, filtered by RUST_LOG (else `default`), as text or JSON lines. Colours
/// only on a terminal (and not with `$NO_COLOR`): a journal, a file or a pipe gets
/// plain text, not escape sequences.
pub(crate) fn init_tracing_as(format: LogFormat, default: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The default key file: `key` in systemd's $STATE_DIRECTORY (`StateDirectory=sigma`),
/// else in $XDG_STATE_HOME/sigma, else in ~/.local/state/sigma.
pub(crate) fn default_key_file() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = env("STATE_DIRECTORY")
        // systemd may pass several, separated by ':'; the first is ours.
        .map(|d| PathBuf::from(d.to_string_lossy().split(':').next().unwrap_or_default()))
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("sigma")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/sigma")))?;
    Some(dir.join("key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("10s"), Ok(ms(10_000)));
        assert_eq!(parse_duration("2m"), Ok(ms(120_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration("1.5s"), Ok(ms(1_500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration(" 3 "), Ok(ms(3_000)));
        assert_eq!(parse_duration("0.25"), Ok(ms(250)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations() {
        for s in ["", "ms", "10x", "-1s", "s10", "1.2.3s", "10 s", "1e999", "-5", "NaN", "inf", "99999999999999999999h"]
        {
            assert!(parse_duration(s).is_err(), "{s:?} parsed as {:?}", parse_duration(s));
        }
    }
}

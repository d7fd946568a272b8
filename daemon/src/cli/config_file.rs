//! `sigma run --config FILE` (part of the `sigma` binary, not of the library).
//!
//! The file is TOML, one `flag-name = value` per option of `sigma run`, lists as
//! arrays:
//!
//! ```toml
//! listen = ["/ip4/0.0.0.0/tcp/7590", "/ip4/0.0.0.0/udp/7590/quic-v1"]
//! bootstrap = ["/ip4/192.0.2.10/tcp/7590/p2p/12D3KooW…"]
//! api = "127.0.0.1:7591"
//! metrics = "0.0.0.0:9590"
//! log-format = "json"
//! allow-peers-file = "/etc/sigma/peers"
//! ```
//!
//! Every option of `sigma run` also reads an environment variable (`SIGMA_…`, see
//! `sigma run --help`). The file is applied by setting, before the command line is
//! parsed, each of those variables that is not already set: so the command line wins
//! over the environment, and the environment over the file. An unknown setting is an
//! error (a typo must not be silently ignored).

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{bail, Context as _};

/// Applies the config file named by `--config` in `args` (or by $SIGMA_CONFIG) when
/// the command is `sigma run`.
pub fn apply(args: Vec<OsString>) -> anyhow::Result<()> {
    if args.get(1).and_then(|a| a.to_str()) != Some("run") {
        return Ok(());
    }
    let Some(path) = config_path(&args[2..]).or_else(|| std::env::var_os("SIGMA_CONFIG").map(PathBuf::from)) else {
        return Ok(());
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("config file {}", path.display()))?;
    let known = settings();
    for (name, value) in to_env(&text, &known).with_context(|| format!("config file {}", path.display()))? {
        if std::env::var_os(&name).is_none() {
            // Still single-threaded: the runtime starts after parsing.
            std::env::set_var(&name, value);
        }
    }
    Ok(())
}

/// The daemon's config file of the shipped unit, where the client commands look for the
/// API's address when none is given.
pub const DEFAULT_CONFIG: &str = "/etc/sigma/sigma.toml";

/// The `api` setting of the daemon's config file ($SIGMA_CONFIG, else
/// [`DEFAULT_CONFIG`]), if that file exists and sets one. The client commands go where
/// the daemon listens, and never fall back to a port that any local process could have
/// bound while the daemon is down.
pub fn configured_api() -> anyhow::Result<Option<String>> {
    let path = std::env::var_os("SIGMA_CONFIG").map_or_else(|| PathBuf::from(DEFAULT_CONFIG), PathBuf::from);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("the daemon's config file {}", path.display())),
    };
    let table: toml::Table =
        text.parse().with_context(|| format!("the daemon's config file {}: not valid TOML", path.display()))?;
    Ok(table.get("api").and_then(toml::Value::as_str).map(str::to_owned))
}

/// The value of `--config PATH` or `--config=PATH` (before any `--`).
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_str()?;
        if a == "--" {
            return None;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    None
}

/// `sigma run`'s options that have an environment variable: (flag name, variable).
pub fn settings() -> Vec<(String, String)> {
    let cmd = <crate::Cli as clap::CommandFactory>::command();
    let run = cmd.find_subcommand("run").expect("sigma run exists");
    run.get_arguments()
        .filter_map(|a| Some((a.get_long()?.to_owned(), a.get_env()?.to_str()?.to_owned())))
        .filter(|(long, _)| long != "config")
        .collect()
}

/// The (variable, value) pairs a config file sets.
fn to_env(text: &str, known: &[(String, String)]) -> anyhow::Result<Vec<(String, String)>> {
    let table: toml::Table = text.parse().context("not valid TOML")?;
    let mut out = Vec::new();
    for (key, value) in table {
        let Some((_, var)) = known.iter().find(|(long, _)| *long == key) else {
            let names: Vec<&str> = known.iter().map(|(l, _)| l.as_str()).collect();
            bail!("unknown setting {key:?} (known: {})", names.join(", "));
        };
        let text = match value {
            toml::Value::Array(items) => {
                items.into_iter().map(|v| scalar(&key, v)).collect::<anyhow::Result<Vec<_>>>()?.join(",")
            }
            v => scalar(&key, v)?,
        };
        out.push((var.clone(), text));
    }
    Ok(out)
}

fn scalar(key: &str, value: toml::Value) -> anyhow::Result<String> {
    Ok(match value {
        toml::Value::String(s) => {
            if s.contains(',') {
                bail!("{key}: a value may not contain ',' (lists are TOML arrays)");
            }
            s
        }
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => bail!("{key}: expected a string, number, boolean or array, got {}", other.type_str()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_option_is_a_setting() {
        let known = settings();
        for name in [
            "listen",
            "bootstrap",
            "key-file",
            "api",
            "metrics",
            "log-format",
            "n",
            "m",
            "admin-peer",
            "allow-peer",
            "allow-peers-file",
            "swarm-key",
        ] {
            assert!(known.iter().any(|(l, _)| l == name), "{name} has no environment variable");
        }
        let cmd = <crate::Cli as clap::CommandFactory>::command();
        let run = cmd.find_subcommand("run").unwrap();
        let missing: Vec<_> = run
            .get_arguments()
            .filter(|a| a.get_long().is_some() && a.get_env().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(missing.is_empty(), "options without an environment variable: {missing:?}");
    }

    #[test]
    fn values_become_variables_and_typos_are_errors() {
        let known = settings();
        let env = to_env(
            "listen = [\"/ip4/0.0.0.0/tcp/1\", \"/ip4/0.0.0.0/udp/1/quic-v1\"]\nn = 5\nm = 3\nephemeral-key = true\n",
            &known,
        )
        .unwrap();
        assert!(env.contains(&("SIGMA_LISTEN".to_owned(), "/ip4/0.0.0.0/tcp/1,/ip4/0.0.0.0/udp/1/quic-v1".to_owned())));
        assert!(env.contains(&("SIGMA_N".to_owned(), "5".to_owned())));
        assert!(env.contains(&("SIGMA_EPHEMERAL_KEY".to_owned(), "true".to_owned())));
        let err = to_env("lisen = \"x\"", &known).unwrap_err().to_string();
        assert!(err.contains("unknown setting \"lisen\""), "{err}");
        assert!(to_env("api = {x = 1}", &known).is_err());
        assert!(to_env("not toml", &known).is_err());
        assert!(to_env("api = \"a,b\"", &known).is_err());
    }

    #[test]
    fn the_flag_is_found_before_the_command() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(config_path(&args(&["--config", "a.toml"])), Some("a.toml".into()));
        assert_eq!(config_path(&args(&["--api", "x", "--config=b.toml"])), Some("b.toml".into()));
        assert_eq!(config_path(&args(&["--api", "x"])), None);
        assert_eq!(config_path(&args(&["--", "--config", "c"])), None);
    }
}

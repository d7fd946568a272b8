//! How the client commands reach the local daemon's control API: address, tokens, the
//! exit code of a failed call.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use sigma_daemon::client::{Client, ClientError};
use sigma_daemon::http::{self, ErrorCode, DEFAULT_API};

use super::{default_key_file, fail, EXIT_NOT_READY, EXIT_TIMEOUT, EXIT_UNAVAILABLE, EXIT_USAGE};
use crate::cli::config_file;

/// How the client commands reach the local daemon's control API.
#[derive(Args, Debug)]
pub(crate) struct ApiArgs {
    /// Control API of the local daemon: IP:PORT or unix:PATH [default: $SIGMA_API, else
    /// the `api` of the daemon's config file ($SIGMA_CONFIG, else /etc/sigma/sigma.toml),
    /// else unix:/run/sigma/api.sock if that socket exists, else 127.0.0.1:7591].
    #[arg(long, value_name = "IP:PORT|unix:PATH")]
    pub(crate) api: Option<String>,
    /// File holding the API's bearer token (the daemon's --api-token-file).
    #[arg(long, value_name = "PATH", env = "SIGMA_API_TOKEN_FILE")]
    pub(crate) api_token_file: Option<PathBuf>,
    /// File holding the daemon's admin token, for `sigma release` (the daemon's
    /// --admin-token-file) [default: admin.token in the default state directory, else
    /// /var/lib/sigma/admin.token, if readable].
    #[arg(long, value_name = "PATH", env = "SIGMA_ADMIN_TOKEN_FILE")]
    pub(crate) admin_token_file: Option<PathBuf>,
}

impl ApiArgs {
    /// A client of the daemon's API (with its token, if one is given).
    pub(crate) fn connect(&self) -> anyhow::Result<Client> {
        let given = match self.api.clone().or_else(|| std::env::var("SIGMA_API").ok()) {
            Some(s) => Some(s),
            None => config_file::configured_api().map_err(|e| fail(EXIT_USAGE, format!("{e:#}")))?,
        };
        let addr = match given {
            Some(s) => http::ApiAddr::parse(&s)?,
            None if std::path::Path::new(http::DEFAULT_API_SOCKET).exists() => {
                http::ApiAddr::Unix(http::DEFAULT_API_SOCKET.into())
            }
            None => http::ApiAddr::parse(DEFAULT_API)?,
        };
        let mut client = Client::new(addr);
        if let Some(path) = &self.api_token_file {
            let token = read_token(path)
                .map_err(|e| fail(EXIT_UNAVAILABLE, format!("API token file {}: {e:#}", path.display())))?;
            client = client
                .with_token(&token)
                .map_err(|_| fail(EXIT_USAGE, format!("API token file {}: not a valid token", path.display())))?;
        }
        let admin = match &self.admin_token_file {
            Some(path) => Some(
                read_token(path)
                    .map_err(|e| fail(EXIT_UNAVAILABLE, format!("admin token file {}: {e:#}", path.display())))?,
            ),
            // The daemons this user runs, then the shipped unit's; unreadable: none.
            None => default_key_file()
                .and_then(|k| Some(k.parent()?.join(ADMIN_TOKEN_FILE)))
                .into_iter()
                .chain([PathBuf::from("/var/lib/sigma").join(ADMIN_TOKEN_FILE)])
                .find_map(|p| read_token(&p).ok()),
        };
        match admin {
            Some(token) => client
                .with_admin_token(&token)
                .map_err(|_| fail(EXIT_USAGE, "the admin token is not a valid token".to_owned())),
            None => Ok(client),
        }
    }
}

/// The exit code for a failed call (`what` names the command in the message).
pub(crate) fn api_error(what: &str, e: ClientError) -> anyhow::Error {
    let exit = e.code().map_or(EXIT_UNAVAILABLE, exit_code);
    fail(exit, format!("{what}: {e}"))
}

/// The exit code of a call the daemon refused with `code` (the commands that expect a
/// code, as `sigma lock` does `not_won`, say more first).
fn exit_code(code: ErrorCode) -> u8 {
    use ErrorCode as C;
    match code {
        // What the command line asked for is wrong.
        C::BadRequest | C::UnknownParameter | C::BadName | C::BadQuorum | C::BadLease | C::BadValue => EXIT_USAGE,
        C::NotReady | C::HeldBack => EXIT_NOT_READY,
        C::NotWon => EXIT_TIMEOUT,
        // The daemon would not, or could not, serve it.
        C::Unauthorized
        | C::AdminDisabled
        | C::BadHost
        | C::BadOrigin
        | C::RevokeRefused
        | C::NotFound
        | C::NotHeld
        | C::MethodNotAllowed
        | C::Lost
        | C::BodyTooLarge
        | C::BadContentType
        | C::Internal
        | C::Unresponsive
        | C::Stopping
        | C::Busy
        | C::TooManyWaiters
        | C::TooManyLocks => EXIT_UNAVAILABLE,
    }
}

/// The token in `path` (surrounding whitespace removed; must not be empty).
pub(crate) fn read_token(path: &std::path::Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)?.trim().to_owned();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("the token must be one word of printable ASCII");
    }
    Ok(token)
}

/// A token file: read from `path`, or, if it does not exist, a new random token written
/// there with mode 0600. The file appears whole or not at all (written aside, then
/// linked into place), so daemons that share it and start together read one token.
pub(crate) fn load_or_create_token(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if path.exists() {
        return read_token(path);
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".{}.new", std::process::id()));
    let aside = PathBuf::from(aside);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&aside)?;
    writeln!(file, "{token}")?;
    drop(file);
    let linked = std::fs::hard_link(&aside, path);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => {
            tracing::info!(path = %path.display(), "created a token file");
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_token(path),
        Err(e) => Err(e.into()),
    }
}

/// The admin token file's name, in the directory of the daemon's key file by default.
pub(crate) const ADMIN_TOKEN_FILE: &str = "admin.token";

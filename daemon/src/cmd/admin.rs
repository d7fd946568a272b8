//! The operators' commands: `sigma inspect`, `sigma release` (break-lock) and `sigma
//! admin forget`.

use clap::{Args, Subcommand};
use sigma_daemon::client::ClientError;
use sigma_daemon::http::ErrorCode;

use super::api::{api_error, ApiArgs};
use super::{fail, init_tracing};

#[derive(Args, Debug)]
pub(crate) struct InspectArgs {
    /// Lock name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) api: ApiArgs,
    /// Print the daemon's JSON answer.
    #[arg(long)]
    pub(crate) json: bool,
    /// One line per replica (by default they are summed up in one line).
    #[arg(long)]
    pub(crate) replicas: bool,
    /// NAME is a semaphore of K slots: show each slot's lock (NAME/.slot/0 … K−1), its
    /// holder and waiters (with --json, an array of the answers).
    #[arg(long, value_name = "K")]
    pub(crate) slots: Option<u16>,
}

#[derive(Args, Debug)]
pub(crate) struct ReleaseArgs {
    /// Lock name.
    pub(crate) name: String,
    /// The holder's fencing token (from `sigma inspect NAME`, or the holder's
    /// SIGMA_FENCING_TOKEN).
    #[arg(long)]
    pub(crate) token: u64,
    #[command(flatten)]
    pub(crate) api: ApiArgs,
}

#[derive(Subcommand, Debug)]
pub(crate) enum AdminCmd {
    /// Take peers gone for good (killed, decommissioned, never to return) out of this
    /// daemon's membership counts at once. A peer stopped gracefully leaves by itself;
    /// one killed stays a departed member, and a swarm that lost more than half its
    /// members that way serves again only once every survivor has forgotten them: run
    /// this on each. A peer alive here, or on the member list, is refused. Forgetting a
    /// peer that is in fact alive behind a partition lets both sides serve: only
    /// forget what you know is gone. Exit status 0 if all were forgotten, 1 if one was
    /// refused, 69 if the daemon cannot be reached.
    Forget {
        /// Peer ids (from `sigma status`, which lists departed members).
        #[arg(required = true)]
        peers: Vec<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
}

pub(crate) async fn inspect(args: InspectArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    if let Some(k) = args.slots {
        return inspect_slots(&args, k).await;
    }
    let view = args.api.connect()?.inspect(&args.name).await.map_err(|e| api_error("inspect", e))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", view.render_with(args.replicas));
    }
    Ok(0)
}

/// `sigma inspect NAME --slots K`: each slot's lock in turn.
async fn inspect_slots(args: &InspectArgs, k: u16) -> anyhow::Result<u8> {
    use sigma_node::semaphore;
    semaphore::check(&args.name, k).map_err(|e| fail(super::EXIT_USAGE, format!("inspect {}: {e}", args.name)))?;
    let client = args.api.connect()?;
    let mut views = Vec::new();
    for slot in 0..k {
        let lock = semaphore::slot_lock_name(&args.name, slot);
        let view = client.inspect(&lock).await.map_err(|e| api_error("inspect", e))?;
        if !args.json {
            println!("slot {slot}:");
            print!("{}", view.render_with(args.replicas));
        }
        views.push(view);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&views)?);
    }
    Ok(0)
}

pub(crate) async fn release_cmd(args: ReleaseArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    match args.api.connect()?.revoke(&args.name, args.token).await {
        Ok(done) => {
            println!("revoked {} token {} (held through peer {})", done.name, done.token, done.holder);
            Ok(0)
        }
        // Nothing was revoked: nobody holds it under that token, or its holder said no.
        Err(ClientError::Refused { code: ErrorCode::NotHeld | ErrorCode::RevokeRefused, message }) => {
            Err(fail(1, format!("release: {message}")))
        }
        Err(e) => Err(api_error("release", e)),
    }
}

pub(crate) async fn forget_cmd(peers: &[String], api: ApiArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    match api.connect()?.forget(peers).await {
        Ok(answer) => {
            for p in &answer.forgotten {
                println!("forgotten {p}");
            }
            for r in &answer.refused {
                println!("refused   {}: {}", r.peer, r.reason);
            }
            Ok(u8::from(!answer.refused.is_empty()))
        }
        Err(e) => Err(api_error("admin forget", e)),
    }
}

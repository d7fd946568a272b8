//! embed: sigma inside an existing libp2p application.
//!
//! The application has its own `#[derive(NetworkBehaviour)]` (here: ping and identify,
//! standing for whatever it already runs) and adds `sigma_behaviour::Behaviour` as one
//! more field. It owns its `Swarm` and its event loop; sigma is driven like any other
//! behaviour: call `acquire` / `release`, react to `Event::Acquired` / `Event::Lost`.
//! Two such applications ("alice" and "bob") run in this one program, each with its own
//! swarm on 127.0.0.1, and take turns holding one lock.
//!
//! Run: `cargo run -p sigma-examples --bin embed`

use std::time::Duration;

use anyhow::{bail, ensure};
use clap::Parser;
use futures::StreamExt;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{identify, identity, noise, ping, tcp, yamux, Multiaddr, PeerId, Swarm, SwarmBuilder};
use sigma_behaviour::AcquisitionId;
use tokio::time::Instant;
use tracing_subscriber::EnvFilter;

/// Sigma embedded in an application's own libp2p swarm: two apps take turns on a lock.
#[derive(Parser, Debug)]
struct Args {
    /// The lock to take.
    #[arg(long, default_value = "examples/embed")]
    lock: String,
    /// How long each app holds the lock, in ms.
    #[arg(long, default_value_t = 300)]
    hold_ms: u64,
    /// Give up (exit non-zero) after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout_s: u64,
}

/// The application's behaviour: what it already had (ping, identify), plus sigma.
#[derive(NetworkBehaviour)]
struct AppBehaviour {
    ping: ping::Behaviour,
    identify: identify::Behaviour,
    sigma: sigma_behaviour::Behaviour,
}

impl AppBehaviour {
    fn new(key: &identity::Keypair) -> Self {
        AppBehaviour {
            ping: ping::Behaviour::new(ping::Config::new().with_interval(Duration::from_secs(1))),
            identify: identify::Behaviour::new(identify::Config::new("/embed-demo/1.0.0".into(), key.public())),
            // The paper's quorum (32 replicas, 24 votes) and a 10 s lease; see
            // `sigma_behaviour::proto::Config` to change them.
            sigma: sigma_behaviour::Behaviour::new(&key, sigma_behaviour::Config::default()),
        }
    }
}

/// One application: its swarm and what it is doing with the lock.
struct App {
    name: &'static str,
    swarm: Swarm<AppBehaviour>,
    acquisition: Option<AcquisitionId>,
    release_at: Option<Instant>,
}

impl App {
    fn new(name: &'static str) -> anyhow::Result<Self> {
        let swarm = SwarmBuilder::with_new_identity()
            .with_tokio()
            .with_tcp(tcp::Config::default().nodelay(true), noise::Config::new, yamux::Config::default)?
            .with_behaviour(AppBehaviour::new)?
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
            .build();
        Ok(App { name, swarm, acquisition: None, release_at: None })
    }

    /// Listens on a loopback port and returns the address (with `/p2p/<peer id>`).
    async fn listen(&mut self) -> anyhow::Result<Multiaddr> {
        self.swarm.listen_on("/ip4/127.0.0.1/tcp/0".parse()?)?;
        loop {
            if let SwarmEvent::NewListenAddr { address, .. } = self.swarm.select_next_some().await {
                println!("{}: listening on {address}", self.name);
                return Ok(address.with(libp2p::multiaddr::Protocol::P2p(*self.swarm.local_peer_id())));
            }
        }
    }

    fn acquire(&mut self, lock: &str) -> anyhow::Result<()> {
        let id = self.swarm.behaviour_mut().sigma.acquire(lock, None)?;
        println!("{}: acquire({lock:?}) -> {id}", self.name);
        self.acquisition = Some(id);
        Ok(())
    }

    fn release(&mut self) {
        if let Some(id) = self.acquisition.take() {
            println!("{}: release({id})", self.name);
            self.swarm.behaviour_mut().sigma.release(id);
        }
        self.release_at = None;
    }

    /// The application's event handling; sigma's events are two more match arms.
    /// Returns the fencing token when the lock was acquired.
    fn on_event(&mut self, event: SwarmEvent<AppBehaviourEvent>, hold: Duration) -> Option<u64> {
        let name = self.name;
        match event {
            SwarmEvent::ConnectionEstablished { peer_id, .. } => println!("{name}: connected to {}", short(&peer_id)),
            SwarmEvent::Behaviour(AppBehaviourEvent::Ping(ping::Event { peer, result: Ok(rtt), .. })) => {
                println!("{name}: ping {} in {} µs", short(&peer), rtt.as_micros());
            }
            // Sigma places lock replicas on peers it can route to: give it the listen
            // addresses identify learns (an app using mDNS or its own discovery does the same).
            SwarmEvent::Behaviour(AppBehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. })) => {
                println!("{name}: identify: {} listens on {:?}", short(&peer_id), info.listen_addrs);
                for addr in info.listen_addrs {
                    self.swarm.behaviour_mut().sigma.add_address(&peer_id, addr);
                }
            }
            SwarmEvent::Behaviour(AppBehaviourEvent::Sigma(sigma_behaviour::Event::Acquired {
                id,
                resource,
                token,
                valid_until,
                votes,
                distinct_peers,
            })) => {
                let valid = valid_until.saturating_duration_since(std::time::Instant::now());
                println!(
                    "{name}: Acquired {id} {resource:?}: token {token}, {votes} votes from {distinct_peers} peers, \
                     valid for {} ms (renewed while held)",
                    valid.as_millis()
                );
                self.release_at = Some(Instant::now() + hold);
                return Some(token);
            }
            SwarmEvent::Behaviour(AppBehaviourEvent::Sigma(sigma_behaviour::Event::Lost { id, reason })) => {
                println!("{name}: Lost {id}: {reason:?}");
                self.release();
            }
            _ => {}
        }
        None
    }

    fn routable(&self) -> bool {
        self.swarm.behaviour().sigma.routable_peers() > 0
    }
}

fn short(peer: &PeerId) -> String {
    let s = peer.to_string();
    format!("…{}", &s[s.len() - 6..])
}

async fn run(args: Args) -> anyhow::Result<()> {
    let hold = Duration::from_millis(args.hold_ms);
    let mut alice = App::new("alice")?;
    let mut bob = App::new("bob")?;
    println!("alice is {}, bob is {}", short(alice.swarm.local_peer_id()), short(bob.swarm.local_peer_id()));
    let alice_addr = alice.listen().await?;
    bob.listen().await?;
    bob.swarm.dial(alice_addr)?;

    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let mut started = false;
    let mut holder: Option<&str> = None;
    let mut holders: Vec<(&str, u64)> = Vec::new();
    loop {
        // Once both know each other, both ask for the lock; one waits for the other.
        if !started && alice.routable() && bob.routable() {
            alice.acquire(&args.lock)?;
            bob.acquire(&args.lock)?;
            started = true;
        }
        if started && alice.acquisition.is_none() && bob.acquisition.is_none() {
            break;
        }
        let next_release = [alice.release_at, bob.release_at].into_iter().flatten().min();
        let acquired = tokio::select! {
            event = alice.swarm.select_next_some() => alice.on_event(event, hold).map(|t| ("alice", t)),
            event = bob.swarm.select_next_some() => bob.on_event(event, hold).map(|t| ("bob", t)),
            () = tokio::time::sleep_until(next_release.unwrap_or(deadline)), if next_release.is_some() => {
                for app in [&mut alice, &mut bob] {
                    if app.release_at.is_some_and(|t| t <= Instant::now()) {
                        app.release();
                        holder = None;
                    }
                }
                None
            }
            () = tokio::time::sleep_until(deadline) => bail!("timed out"),
        };
        if let Some((name, token)) = acquired {
            ensure!(holder.is_none(), "{name} acquired the lock while {holder:?} held it");
            holder = Some(name);
            holders.push((name, token));
        }
    }

    // Keep both swarms running a moment so the last RELEASE messages go out.
    let flush = tokio::time::sleep(Duration::from_millis(200));
    tokio::pin!(flush);
    loop {
        tokio::select! {
            event = alice.swarm.select_next_some() => { alice.on_event(event, hold); }
            event = bob.swarm.select_next_some() => { bob.on_event(event, hold); }
            () = &mut flush => break,
        }
    }

    let [(first, t1), (second, t2)] = holders[..] else { bail!("expected two holders, got {holders:?}") };
    println!("lock held by {first} (token {t1}), then by {second} (token {t2})");
    ensure!(first != second && t2 > t1, "expected both apps in turn, with increasing tokens");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")))
        .with_writer(std::io::stderr)
        .init();
    run(Args::parse()).await
}

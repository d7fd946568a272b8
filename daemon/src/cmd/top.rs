//! `sigma top`: a live view of this peer, its swarm's members and the swarm's locks,
//! redrawn every `--interval` until `q` or Ctrl-C. Not on a terminal (a pipe, a file, a
//! script), or with `--once`, it prints one frame as plain text and exits.
//!
//! The terminal is driven with crossterm alone (raw mode, the alternate screen, the
//! cursor, keys, the size): one screen of text redrawn each interval needs no widget
//! layer. Whatever ends the view (a key, SIGTERM, an error, a panic) restores the
//! terminal first ([`Screen`]'s `Drop`).

use std::io::{IsTerminal as _, Write as _};
use std::time::Duration;

use clap::Args;
use sigma_daemon::client::Client;
use sigma_node::listing::SwarmLocks;
use sigma_node::Status;
use tokio::signal::unix::{signal, SignalKind};

use super::api::{api_error, ApiArgs};
use super::{init_tracing, parse_duration};

#[derive(Args, Debug)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    pub(crate) api: ApiArgs,
    /// How often the view is redrawn (the swarm's locks are asked of every member each
    /// time).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) interval: Duration,
    /// Print one frame as plain text and exit (what happens anyway when stdout is not a
    /// terminal).
    #[arg(long)]
    pub(crate) once: bool,
}

/// The width of a frame printed as text.
const TEXT_WIDTH: usize = 160;
/// The shortest interval (each frame asks every member).
const MIN_INTERVAL: Duration = Duration::from_millis(100);

pub(crate) async fn top(args: TopArgs) -> anyhow::Result<u8> {
    init_tracing("warn");
    let client = args.api.connect()?;
    if args.once || !std::io::stdout().is_terminal() {
        let (status, locks) = fetch(&client).await;
        let status = status.map_err(|e| api_error("top", e))?;
        let locks = locks.map_err(|e| api_error("top", e))?;
        let lines = render(&status, Ok(&locks), TEXT_WIDTH, usize::MAX);
        let mut out = std::io::stdout().lock();
        for line in lines {
            writeln!(out, "{}", line.trim_end())?;
        }
        return Ok(0);
    }
    live(&client, args.interval.max(MIN_INTERVAL)).await
}

async fn fetch(
    client: &Client,
) -> (Result<Status, sigma_daemon::client::ClientError>, Result<SwarmLocks, sigma_daemon::client::ClientError>) {
    tokio::join!(client.status(), client.swarm_locks())
}

/// What the key reader tells the view.
enum Input {
    Quit,
    Redraw,
}

/// The terminal in the view's modes; restored when dropped.
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        crossterm::terminal::enable_raw_mode()?;
        let screen = Screen;
        crossterm::execute!(std::io::stdout(), crossterm::terminal::EnterAlternateScreen, crossterm::cursor::Hide)?;
        Ok(screen)
    }

    fn draw(&self, lines: &[String]) -> std::io::Result<()> {
        use crossterm::{cursor::MoveTo, queue, style::Print, terminal::Clear, terminal::ClearType};
        let mut out = std::io::stdout().lock();
        for (row, line) in lines.iter().enumerate() {
            let row = u16::try_from(row).unwrap_or(u16::MAX);
            queue!(out, MoveTo(0, row), Print(line), Clear(ClearType::UntilNewLine))?;
        }
        let below = u16::try_from(lines.len()).unwrap_or(u16::MAX);
        queue!(out, MoveTo(0, below), Clear(ClearType::FromCursorDown))?;
        out.flush()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ =
            crossterm::execute!(std::io::stdout(), crossterm::cursor::Show, crossterm::terminal::LeaveAlternateScreen);
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

async fn live(client: &Client, interval: Duration) -> anyhow::Result<u8> {
    let (tx, mut inputs) = tokio::sync::mpsc::channel(8);
    // SIGTERM, SIGHUP, and SIGINT sent by another process (raw mode makes Ctrl-C a
    // key): a clean quit, the terminal restored.
    for kind in [SignalKind::terminate(), SignalKind::hangup(), SignalKind::interrupt()] {
        let mut signal = signal(kind)?;
        let tx = tx.clone();
        tokio::spawn(async move {
            if signal.recv().await.is_some() {
                let _ = tx.send(Input::Quit).await;
            }
        });
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || read_keys(&tx, &stop))
    };
    let screen = Screen::enter()?;
    let result = async {
        loop {
            // A key is heard while the daemon is being asked, too.
            let fetching = fetch(client);
            tokio::pin!(fetching);
            let (status, locks) = loop {
                tokio::select! {
                    fetched = &mut fetching => break fetched,
                    input = inputs.recv() => match input {
                        Some(Input::Redraw) => {}
                        Some(Input::Quit) | None => return anyhow::Ok(0),
                    },
                }
            };
            let (width, height) = crossterm::terminal::size().unwrap_or((80, 24));
            let lines = match &status {
                Ok(status) => render(status, locks.as_ref().map_err(|e| e.to_string()), width.into(), height.into()),
                Err(e) => vec![format!("sigma top: the daemon does not answer: {e}"), String::new(), HELP.to_owned()],
            };
            screen.draw(&lines)?;
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                input = inputs.recv() => match input {
                    Some(Input::Redraw) => {}
                    Some(Input::Quit) | None => return Ok(0),
                },
            }
        }
    }
    .await;
    drop(screen);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = reader.join();
    result
}

/// Reads keys until `q`, Escape or Ctrl-C (raw mode: no SIGINT), or until `stop`.
fn read_keys(tx: &tokio::sync::mpsc::Sender<Input>, stop: &std::sync::atomic::AtomicBool) {
    use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        match event::poll(Duration::from_millis(100)) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(_) => {
                let _ = tx.blocking_send(Input::Quit);
                return;
            }
        }
        let input = match event::read() {
            Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => match k.code {
                KeyCode::Char('q' | 'Q') | KeyCode::Esc => Input::Quit,
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Input::Quit,
                _ => continue,
            },
            Ok(Event::Resize(..)) => Input::Redraw,
            Ok(_) => continue,
            Err(_) => Input::Quit,
        };
        let quit = matches!(input, Input::Quit);
        if tx.blocking_send(input).is_err() || quit {
            return;
        }
    }
}

const HELP: &str = "q: quit";

/// A peer id cut short: its head (past the `12D3KooW` every ed25519 id shares) and tail.
fn short(peer: &str) -> String {
    let body = peer.strip_prefix("12D3KooW").unwrap_or(peer);
    let chars: Vec<char> = body.chars().collect();
    if chars.len() <= 12 {
        return body.to_owned();
    }
    let head: String = chars[..6].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}…{tail}")
}

/// Cuts `s` to `width` characters.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// One frame: this peer, the members, the swarm's locks, at most `height` lines of at
/// most `width` characters.
pub(crate) fn render(status: &Status, locks: Result<&SwarmLocks, String>, width: usize, height: usize) -> Vec<String> {
    let me = status.peer_id.to_string();
    // A peer by its name (if any) and short id.
    let who = |peer: &str| -> String {
        let name = if peer == me { status.name.as_ref() } else { None }
            .or_else(|| status.peer_names.get(peer))
            .or_else(|| locks.as_ref().ok().and_then(|l| l.names.get(peer)));
        match name {
            Some(name) => format!("{name} {}", short(peer)),
            None => short(peer),
        }
    };
    let mut lines = Vec::new();
    lines.push(format!(
        "sigma top: {} {}  {}  members {} of {} reachable  replicas hosted {}",
        status.name.as_deref().unwrap_or("(no name)"),
        short(&me),
        status.readiness,
        status.reachable_members,
        status.members,
        status.replicas_hosted,
    ));
    if !status.ready {
        lines.push(format!("  {}", status.readiness_detail));
    } else if status.held_back_ms > 0 {
        lines.push(format!("  new locks wait {} ms more (the takeover delay)", status.held_back_ms));
    }
    lines.push(String::new());
    lines.push(format!("MEMBERS ({})", status.member_peers.len() + 1));
    lines.push(format!("  {:<30} this peer", who(&me)));
    for m in &status.member_peers {
        let peer = m.peer.to_string();
        lines.push(format!("  {:<30} {}", who(&peer), if m.alive { "alive" } else { "departed" }));
    }
    lines.push(String::new());
    match &locks {
        Err(e) => lines.push(format!("LOCKS: not listed: {e}")),
        Ok(locks) => {
            let held = locks.locks.iter().filter(|l| !l.holders.is_empty()).count();
            let waiting: usize = locks.locks.iter().map(|l| l.waiters.len()).sum();
            lines.push(format!(
                "LOCKS ({held} held, {waiting} waiting; {} of {} peers answered)",
                locks.answered, locks.asked
            ));
            let mut rows =
                vec![["LOCK".to_owned(), "HOLDER".into(), "TOKEN".into(), "VALID FOR".into(), "QUEUE".into()]];
            for l in &locks.locks {
                let queue = match l.waiters.first() {
                    Some(next) => format!("{} (next: {})", l.waiters.len(), who(&next.peer)),
                    None => "0".to_owned(),
                };
                if l.holders.is_empty() {
                    rows.push([l.name.clone(), "-".into(), "-".into(), "-".into(), queue.clone()]);
                }
                for h in &l.holders {
                    let valid = format!("{} ms", h.valid_for_ms);
                    rows.push([l.name.clone(), who(&h.peer), h.token.to_string(), valid, queue.clone()]);
                }
            }
            if rows.len() == 1 {
                lines.push("  none held or waited for".to_owned());
            } else {
                for line in sigma_node::listing::aligned(&rows, [false, false, true, true, false]) {
                    lines.push(format!("  {line}"));
                }
            }
            for p in &locks.unanswered {
                lines.push(format!("  no answer from {} (its locks are missing)", who(p)));
            }
        }
    }
    // The help line stays on screen: the rest is cut to leave room for it.
    let room = height.saturating_sub(2);
    if lines.len() > room {
        let left = lines.len() - room + 1;
        lines.truncate(room.saturating_sub(1));
        lines.push(format!("… {left} more lines (a taller terminal shows them)"));
    }
    lines.push(String::new());
    lines.push(HELP.to_owned());
    lines.into_iter().map(|l| cut(&l, width)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> Status {
        serde_json::from_value(serde_json::json!({
            "peer_id": "12D3KooWCvMB8bNejnjo62m4zX2K6VemeFSiUzMahVB66YWnduDz",
            "name": "db-3",
            "listen_addrs": [], "external_addrs": [], "connected_peers": [], "connections": 0,
            "routable_peers": 2, "replicas_hosted": 30, "locks_held": [], "locks_waiting": [], "waiting": [],
            "token_regressions": 0, "ready": true, "readiness": "serving", "readiness_detail": "serving",
            "members": 3, "reachable_members": 2, "takeover_delay_ms": 0,
            "member_peers": [
                {"peer": "12D3KooWDjufHcNjq2veZnXxVDCzV7etQ5BhRq2z9RjgSzVaKn4e", "alive": true},
                {"peer": "12D3KooWRmJNEkUr29nsigwq34jK4Kdrx1JoQt82Z52hULa4PMDm", "alive": false},
            ],
            "peer_names": {"12D3KooWDjufHcNjq2veZnXxVDCzV7etQ5BhRq2z9RjgSzVaKn4e": "db-1"},
            "state": sigma_behaviour::StateSizes::default(),
        }))
        .expect("a status")
    }

    fn locks() -> SwarmLocks {
        serde_json::from_value(serde_json::json!({
            "asked": 2, "answered": 2, "unanswered": [], "truncated": [],
            "locks": [{
                "name": "deploy",
                "holders": [{"peer": "12D3KooWDjufHcNjq2veZnXxVDCzV7etQ5BhRq2z9RjgSzVaKn4e", "counter": 1, "token": 77, "valid_for_ms": 2981}],
                "waiters": [{"peer": "12D3KooWCvMB8bNejnjo62m4zX2K6VemeFSiUzMahVB66YWnduDz", "counter": 2, "position": 1, "votes": 3}],
            }],
        }))
        .expect("a listing")
    }

    #[test]
    fn a_frame_shows_the_peer_the_members_and_the_locks() {
        let lines = render(&status(), Ok(&locks()), 200, 100);
        let text = lines.join("\n");
        assert!(lines[0].starts_with("sigma top: db-3 CvMB8b…duDz  serving  members 2 of 3 reachable"), "{text}");
        assert!(text.contains("db-3 CvMB8b…duDz") && text.contains("this peer"), "{text}");
        assert!(text.contains("db-1 DjufHc…Kn4e") && text.contains("alive"), "{text}");
        assert!(text.contains("RmJNEk…PMDm") && text.contains("departed"), "{text}");
        assert!(text.contains("LOCKS (1 held, 1 waiting; 2 of 2 peers answered)"), "{text}");
        let row = lines.iter().find(|l| l.trim_start().starts_with("deploy")).expect("the lock's row");
        assert!(row.contains("db-1 DjufHc…Kn4e") && row.contains(" 77 ") && row.contains("2981 ms"), "{row}");
        assert!(row.ends_with("1 (next: db-3 CvMB8b…duDz)"), "{row}");
        assert_eq!(lines.last().map(String::as_str), Some(HELP));
    }

    #[test]
    fn a_frame_fits_its_terminal() {
        let lines = render(&status(), Err("timed out".into()), 30, 8);
        assert!(lines.len() <= 8, "{lines:#?}");
        assert!(lines.iter().all(|l| l.chars().count() <= 30), "{lines:#?}");
        assert!(lines.iter().any(|l| l.contains("more lines")), "{lines:#?}");
        assert_eq!(lines.last().map(String::as_str), Some(HELP));
    }
}

//! Semaphores end to end through the `sigma` binary and the HTTP API: four `sigma lock
//! NAME --slots 2 -- cmd` at once never run more than two commands at a time (by the
//! order of the lines the commands append), hold mode prints the slot, inspect --slots
//! shows both holders, and a third
//! `--try` is refused, bad slot counts and reserved names are usage errors (exit 64,
//! 400), and an HTTP holder of a slot renews and releases it under either name.

use std::process::Stdio;

use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::Command;

mod daemon;

use daemon::{daemon_with, eventually, get_json, http, Daemon, PATIENCE, SIGMA};

async fn one_daemon(dir: &std::path::Path) -> Daemon {
    let d = daemon_with(dir, "sem", &[], &["--listen", "/ip4/127.0.0.1/tcp/0"]).await;
    let status = format!("http://{}/v1/status", d.api);
    eventually("the daemon to serve", || async { get_json(&status).await["ready"] == true }).await;
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_commands_on_two_slots_never_run_three_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = one_daemon(dir.path()).await;
    let file = dir.path().join("cs.log");
    let script = format!(
        "echo \"start $$ $SIGMA_LOCK_SLOT $SIGMA_LOCK_NAME $SIGMA_FENCING_TOKEN\" >> {f}; sleep 0.4; echo \"end $$ \
         $SIGMA_LOCK_SLOT\" >> {f}",
        f = file.display()
    );
    let runs: Vec<_> =
        (0..4).map(|_| daemon::sigma_lock(&d.api, "jobs/pool", &["--slots", "2"], &script).output()).collect();
    let outputs = tokio::time::timeout(PATIENCE, futures::future::join_all(runs)).await.expect("sigma lock hung");
    for o in &outputs {
        let o = o.as_ref().unwrap();
        assert!(o.status.success(), "sigma lock failed: {:?}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    }
    // In the order the commands wrote: never three started and not ended, and the ones
    // running together on distinct slots, each named by its slot lock.
    let text = std::fs::read_to_string(&file).unwrap();
    let (mut running, mut most) = (Vec::<(String, String)>::new(), 0);
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words[0] {
            "start" => {
                let (pid, slot) = (words[1].to_owned(), words[2].to_owned());
                assert!(slot == "0" || slot == "1", "SIGMA_LOCK_SLOT {slot}:\n{text}");
                assert_eq!(words[3], format!("jobs/pool/.slot/{slot}"), "SIGMA_LOCK_NAME:\n{text}");
                assert!(words[4].parse::<u64>().is_ok(), "SIGMA_FENCING_TOKEN:\n{text}");
                assert!(running.iter().all(|(_, s)| *s != slot), "slot {slot} run twice at once:\n{text}");
                running.push((pid, slot));
                most = most.max(running.len());
            }
            "end" => running.retain(|(pid, _)| pid != words[1]),
            other => panic!("{other}: {text}"),
        }
    }
    eprintln!("at most {most} commands at once:\n{text}");
    assert_eq!(text.lines().count(), 8, "every command ran once:\n{text}");
    assert!(most <= 2, "{most} commands at once on 2 slots:\n{text}");
    let v = get_json(&format!("http://{}/v1/status", d.api)).await;
    assert_eq!(v["locks_held"], Value::Array(vec![]), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_mode_prints_the_slot_try_is_refused_and_bad_slots_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let d = one_daemon(dir.path()).await;
    let mut slots = Vec::new();
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut holder = Command::new(SIGMA)
            .args(["lock", "by-hand", "--slots", "2", "--api", &d.api])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap()).lines();
        let slot = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(s) = line.strip_prefix("SIGMA_LOCK_SLOT=") {
                    return s.to_owned();
                }
            }
            panic!("sigma lock --slots printed no SIGMA_LOCK_SLOT");
        })
        .await
        .expect("sigma lock --slots held nothing");
        slots.push(slot);
        holders.push(holder);
    }
    slots.sort();
    assert_eq!(slots, ["0", "1"]);
    // Inspect shows each slot's lock and its holder.
    let out = Command::new(SIGMA).args(["inspect", "by-hand", "--slots", "2", "--api", &d.api]).output().await.unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for slot in ["slot 0:", "slot 1:", "by-hand/.slot/0", "by-hand/.slot/1"] {
        assert!(shown.contains(slot), "{slot}: {shown}");
    }
    assert_eq!(shown.matches(", token ").count(), 2, "a holder per slot: {shown}");
    let out = daemon::sigma_lock(&d.api, "by-hand", &["--slots", "2", "--try"], "echo ran").output().await.unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "the command ran without a slot");
    for h in &holders {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(h.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    }
    for mut h in holders {
        let status = tokio::time::timeout(PATIENCE, h.wait()).await.unwrap().unwrap();
        assert!(status.success(), "released on SIGINT: {status:?}");
    }

    for (args, says) in [
        (&["--slots", "0"][..], "between 1 and 64"),
        (&["--slots", "65"], "between 1 and 64"),
        (&["--slots", "many"], "invalid value"),
    ] {
        let out = daemon::sigma_lock(&d.api, "x", args, "echo ran").output().await.unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {said}");
        assert!(said.contains(says) && out.stdout.is_empty(), "{args:?}: {said}");
    }
    let out = daemon::sigma_lock(&d.api, "x/.slot/0", &[], "echo ran").output().await.unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{said}");
    assert!(said.contains("reserved for semaphore slots"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_slot_holder_renews_and_releases_under_either_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = one_daemon(dir.path()).await;
    let post = |path: String, body: Value| {
        let url = format!("http://{}{path}", d.api);
        async move {
            let r = http().post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, a) = post("/v1/locks/api%2Fpool/acquire?slots=2&timeout_ms=20000".into(), Value::Null).await;
    assert_eq!(status, 200, "{a}");
    let slot = a["slot"].as_u64().expect("the answer says the slot");
    assert_eq!(a["name"], format!("api/pool/.slot/{slot}"), "{a}");
    let holder = serde_json::json!({"token": a["token"], "lease": a["lease"]});
    let (status, kept) = post("/v1/locks/api%2Fpool/keepalive".into(), holder.clone()).await;
    assert_eq!(status, 200, "renewed under the semaphore's name: {kept}");
    let slot_lock = format!("/v1/locks/api%2Fpool%2F.slot%2F{slot}");
    let (status, kept) = post(format!("{slot_lock}/keepalive"), holder.clone()).await;
    assert_eq!(status, 200, "renewed under the slot's name: {kept}");
    let (status, other) = post("/v1/locks/api%2Fother/keepalive".into(), holder.clone()).await;
    assert_eq!((status, other["code"].as_str()), (404, Some("not_held")), "{other}");
    // A plain lock answer has no slot.
    let (_, plain) = post("/v1/locks/api%2Fplain/acquire?timeout_ms=20000".into(), Value::Null).await;
    assert!(plain.get("slot").is_none(), "{plain}");
    let (status, released) = post("/v1/locks/api%2Fpool/release".into(), holder).await;
    assert_eq!(status, 200, "{released}");

    for (query, code) in [
        ("slots=0", "bad_request"),
        ("slots=65", "bad_request"),
        ("slots=70000", "bad_request"),
        ("slots=two", "bad_request"),
    ] {
        let (status, e) = post(format!("/v1/locks/api%2Fpool/acquire?{query}"), Value::Null).await;
        assert_eq!((status, e["code"].as_str()), (400, Some(code)), "{query}: {e}");
    }
    let (status, e) = post("/v1/locks/api%2F.slot%2F1/acquire".into(), Value::Null).await;
    assert_eq!((status, e["code"].as_str()), (400, Some("bad_name")), "{e}");
    let doc = get_json(&format!("http://{}/v1/openapi.json", d.api)).await;
    let params = &doc["paths"]["/v1/locks/{name}/acquire"]["post"]["parameters"];
    assert!(params.as_array().unwrap().iter().any(|p| p["name"] == "slots"), "{params}");
}

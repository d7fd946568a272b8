//! `sim paper --quick` end to end: every file is written, and the checks that do not
//! depend on run length hold.

use sigma_testnet::sim::paper::{run, PaperOptions};

#[test]
fn quick_paper_run_writes_every_figure() {
    let out = std::env::temp_dir().join(format!("sigma-paper-test-{}", std::process::id()));
    let opts = PaperOptions { out: out.clone(), quick: true, seed: 1, threads: 2 };
    let result = run(&opts).expect("paper run");
    for file in [
        "runs.csv",
        "fig2-analytic.csv",
        "fig2-analytic.svg",
        "fig2-measured.csv",
        "fig3-strawman.svg",
        "fig7-sigma-vs-strawman.svg",
        "fig8-resets.svg",
        "fig8-resets-takeover-delay.svg",
        "fig8-resets-no-recovery.svg",
        "fig8-loss.svg",
        "messages.svg",
        "summary.txt",
    ] {
        let len = std::fs::metadata(out.join(file)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "seed 1: {file} missing or empty in {}", out.display());
    }
    for must in ["no exclusion violation", "every violation involves", "no budget violation", "sigma saturated"] {
        let failed: Vec<_> = result.targets.iter().filter(|t| t.name.contains(must) && !t.pass).collect();
        assert!(failed.is_empty(), "seed 1: {failed:?}\n{}", result.summary);
    }
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap_or_default();
    assert!(runs.lines().count() > 60, "seed 1: runs.csv has {} lines", runs.lines().count());
    std::fs::remove_dir_all(&out).ok();
}

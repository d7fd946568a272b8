//! `sigma-testnet sim paper`: the paper's experiments regenerated from the protocol
//! core — Fig. 2 (analytic and measured), Fig. 3, Fig. 7, Fig. 8 and the message cost —
//! as CSV, SVG plots and a printed summary with the targets checked.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::baselines::backoff::Backoff;
use anyhow::Result;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sigma_behaviour::proto::{Config, Recovery};

use super::analysis::{binomial_interval, saturated_handoff, violation_probability};
use super::engine::{self, Report, SimConfig};
use super::latency::Latency;
use super::protocol::{Sigma, Strawman};
use crate::plot::{write_chart, write_csv, Chart, Series, SeriesStyle};

/// Options of a paper run.
#[derive(Clone, Debug)]
pub struct PaperOptions {
    /// Output directory (CSV, SVG, summary).
    pub out: PathBuf,
    /// Short windows and fewer points (CI).
    pub quick: bool,
    /// Base seed; run k uses `seed + k`.
    pub seed: u64,
    /// Worker threads.
    pub threads: usize,
}

/// The strawman's backoff rule in every figure: uniform in [0, 1 s) after each
/// collision (the paper's "random period").
pub const STRAWMAN_BACKOFF: Backoff = Backoff::Constant { window: Duration::from_secs(1) };

/// A strawman run stops once this many clients wait at once: its backlog only grows
/// from there (the ALOHA collapse) and simulating every retry of thousands of clients
/// would cost minutes for a throughput of about zero.
pub const STRAWMAN_MAX_BACKLOG: usize = 400;

/// Sigma's default informed-backoff slack (percent of T_w): the core's
/// ([`Config::retry_slack_percent`]; a test checks they agree).
const DEFAULT_SLACK: u32 = 50;

/// The slack of the rules measured before the default became 50%: the no-recovery
/// rule and INQUIRE keep it, so their curves are those of their time.
const EARLIER_SLACK: u32 = 25;

/// Name of Sigma runs with the paper's exact informed-backoff rule (retry at T_w).
pub const PAPER_BACKOFF: &str = "sigma-paper-backoff";

/// Name of Sigma runs with the takeover delay on every reset (default retry rule).
pub const TAKEOVER_DELAY: &str = "sigma-takeover-delay";

/// Mean replica lifetimes of Fig. 8 (seconds).
pub const LIFETIMES: [f64; 6] = [30.0, 100.0, 300.0, 1_000.0, 3_000.0, 10_000.0];

/// The loss goal per lifetime of [`LIFETIMES`]: the largest throughput loss at λ = 10
/// against no reset (percent); `None` where none is set (better than the paper's rule
/// is asked at every lifetime).
const LOSS_GOALS: [Option<f64>; 6] = [Some(15.0), Some(10.0), None, Some(3.0), None, Some(1.0)];

/// The no-reset run a rule's losses are measured against: the takeover delay changes
/// nothing without resets.
fn no_reset_of(rule: &Rule) -> &'static str {
    match rule.proto {
        NO_RECOVERY_DELAY => NO_RECOVERY,
        TAKEOVER_DELAY => "sigma",
        p => p,
    }
}

/// One curve family of Fig. 8: a retry and recovery rule, with or without the
/// takeover delay.
struct Rule {
    /// Protocol name in the reports.
    proto: &'static str,
    /// Column and chart label.
    label: &'static str,
    /// Figure file name.
    file: &'static str,
    slack: u32,
    recovery: Recovery,
    delay: bool,
}

/// Name of Sigma runs with no reset recovery (the rule the reset recovery replaced).
pub const NO_RECOVERY: &str = "sigma-no-recovery";

/// Name of Sigma runs with INQUIRE and re-ask (no relay).
pub const INQUIRE: &str = "sigma-inquire";

/// Name of Sigma runs with no recovery and the takeover delay.
pub const NO_RECOVERY_DELAY: &str = "sigma-no-recovery-takeover-delay";

/// The rules of Fig. 8, in column order. The default ([`Config::default`]) is "sigma".
const RULES: [Rule; 6] = [
    Rule {
        proto: NO_RECOVERY,
        label: "no recovery",
        file: "fig8-resets-no-recovery",
        slack: EARLIER_SLACK,
        recovery: Recovery::None,
        delay: false,
    },
    Rule {
        proto: PAPER_BACKOFF,
        label: "paper's rule (T_w)",
        file: "fig8-resets-paper-backoff",
        slack: 0,
        recovery: Recovery::None,
        delay: false,
    },
    Rule {
        proto: INQUIRE,
        label: "INQUIRE + re-ask",
        file: "fig8-resets-inquire",
        slack: EARLIER_SLACK,
        recovery: Recovery::Inquire,
        delay: false,
    },
    Rule {
        proto: "sigma",
        label: "relay (default)",
        file: "fig8-resets",
        slack: DEFAULT_SLACK,
        recovery: Recovery::Relay,
        delay: false,
    },
    Rule {
        proto: NO_RECOVERY_DELAY,
        label: "no recovery + delay",
        file: "fig8-resets-no-recovery-takeover-delay",
        slack: EARLIER_SLACK,
        recovery: Recovery::None,
        delay: true,
    },
    Rule {
        proto: TAKEOVER_DELAY,
        label: "relay + delay",
        file: "fig8-resets-takeover-delay",
        slack: DEFAULT_SLACK,
        recovery: Recovery::Relay,
        delay: true,
    },
];

fn latencies() -> [Latency; 3] {
    let ms = Duration::from_millis;
    [
        Latency::Uniform { lo: ms(100), hi: ms(100) },
        Latency::Uniform { lo: ms(50), hi: ms(150) },
        Latency::Uniform { lo: ms(0), hi: ms(200) },
    ]
}

#[derive(Clone, Debug)]
enum Job {
    Sigma {
        proto: &'static str,
        lambda: f64,
        latency: Latency,
        lifetime: Option<f64>,
        slack: u32,
        recovery: Recovery,
        delay: bool,
    },
    Strawman {
        lambda: f64,
        latency: Latency,
    },
}

/// A target of the issue, checked on the run's figures.
#[derive(Clone, Debug)]
pub struct Target {
    /// What is checked.
    pub name: String,
    /// The figures.
    pub detail: String,
    /// Met or not.
    pub pass: bool,
}

/// Everything a paper run produced.
#[derive(Debug)]
pub struct PaperResult {
    /// Targets with PASS/FAIL.
    pub targets: Vec<Target>,
    /// The printed summary.
    pub summary: String,
}

/// Runs all experiments and writes `opts.out`.
pub fn run(opts: &PaperOptions) -> Result<PaperResult> {
    let started = Instant::now();
    std::fs::create_dir_all(&opts.out)?;
    let (warmup, measure) = if opts.quick {
        (Duration::from_secs(30), Duration::from_secs(60))
    } else {
        (Duration::from_secs(300), Duration::from_secs(600))
    };
    let lambdas: Vec<f64> = if opts.quick {
        vec![0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 10.0]
    } else {
        vec![0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0]
    };
    let config = Config::default();
    let (n, m) = (config.n(), config.m());

    let mut jobs = Vec::new();
    let recovery = config.recovery();
    for latency in latencies() {
        for &lambda in &lambdas {
            jobs.push(Job::Sigma {
                proto: "sigma",
                lambda,
                latency,
                lifetime: None,
                slack: DEFAULT_SLACK,
                recovery,
                delay: false,
            });
            jobs.push(Job::Strawman { lambda, latency });
        }
    }
    let u0200 = latencies()[2];
    // Fig. 8: every rule under every lifetime, plus the no-reset baseline of each rule
    // that is not the default's (the takeover delay changes nothing without resets).
    // Seeds follow the job's index: the rules the figure had before the reset recovery
    // come first, in their old order, so their runs are those of before. The no-recovery
    // baseline reuses the seeds of the default's U(0,200) runs (the same runs as before).
    let mut seeds = vec![None; jobs.len()];
    let default_seed = |j: usize| Some((2 * lambdas.len() + j) * 2);
    let families = [
        (NO_RECOVERY, true, false),
        (PAPER_BACKOFF, true, true),
        (NO_RECOVERY_DELAY, true, false),
        (INQUIRE, true, true),
        ("sigma", true, false),
        (TAKEOVER_DELAY, true, false),
        (NO_RECOVERY, false, true),
    ];
    for (proto, resets, baseline) in families {
        let rule = RULES.iter().find(|r| r.proto == proto).expect("a rule of RULES");
        let baseline_only = !resets;
        let lifetimes: Vec<Option<f64>> =
            LIFETIMES.map(Some).into_iter().filter(|_| resets).chain(baseline.then_some(None)).collect();
        for life in lifetimes {
            for (j, &lambda) in lambdas.iter().enumerate() {
                seeds.push(if baseline_only { default_seed(j) } else { None });
                jobs.push(Job::Sigma {
                    proto: rule.proto,
                    lambda,
                    latency: u0200,
                    lifetime: life,
                    slack: rule.slack,
                    recovery: rule.recovery,
                    delay: rule.delay,
                });
            }
        }
    }
    let reports = run_jobs(&jobs, opts.threads, |k, job| {
        let seed = opts.seed + seeds[k].unwrap_or(k) as u64;
        let base = |lambda, latency| SimConfig { warmup, measure, ..SimConfig::paper(lambda, latency, seed) };
        match job {
            Job::Sigma { proto, lambda, latency, lifetime, slack, recovery, delay } => {
                let cfg = SimConfig {
                    mean_lifetime: lifetime.map(Duration::from_secs_f64),
                    takeover_delay: *delay,
                    ..base(*lambda, *latency)
                };
                let sigma = Sigma(config.clone().with_retry_slack_percent(*slack).with_recovery(*recovery));
                let mut report = engine::run(&sigma, cfg);
                report.protocol = (*proto).into();
                report
            }
            Job::Strawman { lambda, latency } => {
                let cfg = SimConfig { max_backlog: Some(STRAWMAN_MAX_BACKLOG), ..base(*lambda, *latency) };
                engine::run(&Strawman(config.clone(), STRAWMAN_BACKOFF), cfg)
            }
        }
    });

    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let theory: Vec<(Latency, f64)> =
        latencies().iter().map(|l| (*l, saturated_handoff(n, m, l, 200_000, &mut rng).throughput_per_s)).collect();

    let pick = |proto: &str, latency: &Latency, lifetime: Option<f64>| -> Vec<&Report> {
        reports
            .iter()
            .filter(|r| r.protocol == proto && r.latency == latency.to_string() && r.lifetime_s == lifetime)
            .collect()
    };
    let curve = |rs: &[&Report], f: fn(&Report) -> f64| rs.iter().map(|r| (r.lambda, f(r))).collect::<Vec<_>>();
    let x_max = lambdas.last().copied().unwrap_or(10.0);
    let dashed = |name: String, y: f64| Series { name, points: vec![(0.0, y), (x_max, y)], style: SeriesStyle::Dashed };

    // Raw figures of every run.
    write_runs_csv(&opts.out.join("runs.csv"), &reports)?;

    // Fig. 3: strawman throughput vs λ.
    let fig3: Vec<Series> = latencies()
        .iter()
        .map(|l| Series {
            name: format!("strawman {l}"),
            points: curve(&pick("strawman", l, None), |r| r.throughput),
            style: SeriesStyle::Line,
        })
        .collect();
    write_figure(
        &Chart {
            title: format!("Fig. 3: strawman throughput (n={n}, m={m}, backoff U(0,1s))"),
            x_label: "request rate λ (1/s)".into(),
            y_label: "throughput (CS/s)".into(),
            log_y: false,
            series: fig3,
        },
        &opts.out,
        "fig3-strawman",
    )?;

    // Fig. 7: Sigma and strawman with the theoretical saturated lines.
    let mut fig7 = Vec::new();
    for (l, t) in &theory {
        fig7.push(Series {
            name: format!("sigma {l}"),
            points: curve(&pick("sigma", l, None), |r| r.throughput),
            style: SeriesStyle::Line,
        });
        fig7.push(Series {
            name: format!("strawman {l}"),
            points: curve(&pick("strawman", l, None), |r| r.throughput),
            style: SeriesStyle::Points,
        });
        fig7.push(dashed(format!("theory {l}: {t:.2}"), *t));
    }
    write_figure(
        &Chart {
            title: format!("Fig. 7: throughput vs contention and latency variance (n={n}, m={m})"),
            x_label: "request rate λ (1/s)".into(),
            y_label: "throughput (CS/s)".into(),
            log_y: false,
            series: fig7,
        },
        &opts.out,
        "fig7-sigma-vs-strawman",
    )?;

    // Fig. 8: Sigma under replica resets, one figure per rule.
    let theory_u0200 = theory[2].1;
    for rule in &RULES {
        let mut series = vec![Series {
            name: "no reset".into(),
            points: curve(&pick(no_reset_of(rule), &u0200, None), |r| r.throughput),
            style: SeriesStyle::Line,
        }];
        for life in LIFETIMES {
            series.push(Series {
                name: format!("lifetime {life} s"),
                points: curve(&pick(rule.proto, &u0200, Some(life)), |r| r.throughput),
                style: SeriesStyle::Line,
            });
        }
        series.push(dashed(format!("theory: {theory_u0200:.2}"), theory_u0200));
        write_figure(
            &Chart {
                title: format!("Fig. 8: Sigma vs replica lifetime ({u0200}, n={n}, m={m}, {})", rule.label),
                x_label: "request rate λ (1/s)".into(),
                y_label: "throughput (CS/s)".into(),
                log_y: false,
                series,
            },
            &opts.out,
            rule.file,
        )?;
    }
    // Fig. 8 in one: the loss at the largest λ per lifetime, every rule and the goals.
    let at_max = |proto: &str, life: Option<f64>| {
        pick(proto, &u0200, life)
            .iter()
            .find(|r| r.lambda == x_max)
            .map_or((f64::NAN, f64::NAN), |r| (r.throughput, r.messages_per_entry))
    };
    let loss = |rule: &Rule, life: f64| {
        let base = at_max(no_reset_of(rule), None).0;
        100.0 * (1.0 - at_max(rule.proto, Some(life)).0 / base)
    };
    let mut losses: Vec<Series> = RULES
        .iter()
        .map(|rule| Series {
            name: rule.label.into(),
            points: LIFETIMES.iter().map(|&life| (life.log10(), loss(rule, life))).collect(),
            style: SeriesStyle::Line,
        })
        .collect();
    losses.push(Series {
        name: "largest loss allowed".into(),
        points: LIFETIMES.iter().zip(LOSS_GOALS).filter_map(|(l, g)| g.map(|g| (l.log10(), g))).collect(),
        style: SeriesStyle::Points,
    });
    write_figure(
        &Chart {
            title: format!("Fig. 8: throughput loss at λ = {x_max} against no reset ({u0200}, n={n}, m={m})"),
            x_label: "log10 mean replica lifetime (s)".into(),
            y_label: "throughput loss (%)".into(),
            log_y: false,
            series: losses,
        },
        &opts.out,
        "fig8-loss",
    )?;

    // Message cost.
    let mut cost: Vec<Series> = latencies()
        .iter()
        .map(|l| Series {
            name: format!("sigma {l}"),
            points: curve(&pick("sigma", l, None), |r| r.messages_per_entry),
            style: SeriesStyle::Line,
        })
        .collect();
    cost.push(Series {
        name: format!("sigma {u0200}, paper's rule (retry at T_w)"),
        points: curve(&pick(PAPER_BACKOFF, &u0200, None), |r| r.messages_per_entry),
        style: SeriesStyle::Points,
    });
    cost.push(dashed(format!("4n = {}", 4 * n), (4 * n) as f64));
    cost.push(dashed(format!("3n = {}", 3 * n), (3 * n) as f64));
    write_figure(
        &Chart {
            title: format!("Message cost per CS entry (n={n}, m={m})"),
            x_label: "request rate λ (1/s)".into(),
            y_label: "protocol messages per CS entry".into(),
            log_y: false,
            series: cost,
        },
        &opts.out,
        "messages",
    )?;

    // Fig. 2, analytic.
    let (t_life, t_cs) = (10_000.0, 10.0);
    let mut fig2 = Vec::new();
    let mut fig2_rows = Vec::new();
    for nn in [5u32, 8, 16, 32] {
        let points: Vec<(f64, f64)> = (nn / 2 + 1..=nn)
            .map(|mm| {
                let p = violation_probability(nn, mm, t_cs / t_life);
                fig2_rows.push(vec![
                    nn.to_string(),
                    mm.to_string(),
                    format!("{:.4}", f64::from(mm) / f64::from(nn)),
                    format!("{p:e}"),
                ]);
                (f64::from(mm) / f64::from(nn), p)
            })
            .collect();
        fig2.push(Series { name: format!("n = {nn}"), points, style: SeriesStyle::Line });
    }
    write_csv(&opts.out.join("fig2-analytic.csv"), &["n", "m", "m_over_n", "p_violation"], &fig2_rows)?;
    write_figure(
        &Chart {
            title: "Fig. 2: probability of breaking exclusivity (T = 10,000 s, t = 10 s)".into(),
            x_label: "m / n".into(),
            y_label: "P(violation) per CS".into(),
            log_y: true,
            series: fig2,
        },
        &opts.out,
        "fig2-analytic",
    )?;

    // Fig. 2, measured with compressed lifetimes.
    let measured = fig2_measured(opts, &config)?;

    // Summary and targets.
    let mut targets = Vec::new();
    let mut notes = Vec::new();
    let mut s = String::new();
    writeln!(
        s,
        "sigma-testnet sim paper{} (seed {}): n={n}, m={m}, warm-up {}s, measured {}s, CS time 0",
        if opts.quick { " --quick" } else { "" },
        opts.seed,
        warmup.as_secs(),
        measure.as_secs()
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "{:<16} {:>10} {:>12} {:>10} {:>14} {:>12} {:>14}",
        "latency", "theory", "sigma sat.", "ratio", "strawman peak", "at max λ", "sigma msg/CS"
    )?;
    for (l, t) in &theory {
        let sigma = pick("sigma", l, None);
        let straw = pick("strawman", l, None);
        let sat = sigma.iter().filter(|r| r.lambda >= 6.0).map(|r| r.throughput).fold(f64::NAN, f64::max);
        let peak = straw.iter().map(|r| r.throughput).fold(0.0, f64::max);
        let last = straw.iter().max_by(|a, b| a.lambda.total_cmp(&b.lambda)).map_or(0.0, |r| r.throughput);
        let max_msgs = sigma.iter().map(|r| r.messages_per_entry).fold(0.0, f64::max);
        writeln!(
            s,
            "{:<16} {:>10.3} {:>12.3} {:>9.1}% {:>14.3} {:>12.3} {:>14.1}",
            l.to_string(),
            t,
            sat,
            100.0 * sat / t,
            peak,
            last,
            max_msgs
        )?;
        targets.push(Target {
            name: format!("sigma saturated ≥ 95% of theory, {l}"),
            detail: format!("{sat:.3} / {t:.3} = {:.1}%", 100.0 * sat / t),
            pass: sat >= 0.95 * t,
        });
        if matches!(l, Latency::Uniform { lo, hi } if lo == hi) {
            // No variance: every replica sees competing requests in the same order, so
            // the strawman never splits the vote and nothing collapses (§4's diagnosis).
            notes.push(format!(
                "strawman {l}: no latency variance, no split vote: {last:.3} CS/s at max λ (peak {peak:.3})"
            ));
        } else {
            targets.push(Target {
                name: format!("strawman at max λ ≤ 25% of its peak, {l}"),
                detail: format!("{last:.3} vs peak {peak:.3}"),
                pass: last <= 0.25 * peak,
            });
        }
        targets.push(Target {
            name: format!("sigma messages per CS ≤ 4n at every λ, {l}"),
            detail: format!("max {max_msgs:.1} vs {}", 4 * n),
            pass: max_msgs <= (4 * n) as f64,
        });
    }
    for note in &notes {
        writeln!(s, "note: {note}")?;
    }
    writeln!(s)?;
    writeln!(
        s,
        "Fig. 8 ({u0200}): throughput at λ = {x_max} (loss against the rule's own no-reset run) [messages per CS]; violations over all λ"
    )?;
    let mut header = format!("  {:>16} {:>6}", "", "goal");
    for rule in &RULES {
        write!(header, "  {:>22}", rule.label)?;
    }
    writeln!(s, "{header}")?;
    let violations_at = |proto: &str, life: Option<f64>| -> usize {
        pick(proto, &u0200, life).iter().map(|r| r.violations.len()).sum()
    };
    let mut delay_violations = 0;
    for (k, life) in [None].into_iter().chain(LIFETIMES.map(Some)).enumerate() {
        let label = life.map_or("no reset".to_string(), |l| format!("lifetime {l} s"));
        let goal = match life.and(k.checked_sub(1).and_then(|k| LOSS_GOALS[k])) {
            Some(g) => format!("≤{g}%"),
            None => String::new(),
        };
        let mut row = format!("  {label:>16} {goal:>6}");
        for rule in &RULES {
            let proto = if life.is_none() { no_reset_of(rule) } else { rule.proto };
            let b = at_max(no_reset_of(rule), None).0;
            let (t, msgs) = at_max(proto, life);
            let v = violations_at(proto, life);
            if rule.delay && life.is_some() {
                delay_violations += v;
            }
            write!(row, "  {:>22}", format!("{t:.3} ({:+.1}%) [{msgs:.0}] {v}v", 100.0 * (t / b - 1.0)))?;
        }
        writeln!(s, "{row}")?;
    }
    // How much of the cost is structural: a replica is held with chance 1 − e^(−d/T)
    // at any instant; fewer than m can grant when more than n − m are held.
    let d = config.lease().as_secs_f64() * (1.0 + f64::from(config.max_drift_ppm()) / 1e6);
    let structural: Vec<String> = LIFETIMES
        .iter()
        .map(|life| {
            let q = 1.0 - (-d / life).exp();
            format!("{life} s: {:.1}%", 100.0 * tail(n as u32, (n - m + 1) as u32, q))
        })
        .collect();
    writeln!(
        s,
        "  takeover delay d = {d:.1} s per reset; share of time fewer than m replicas may grant: {}",
        structural.join(", ")
    )?;
    writeln!(
        s,
        "  (the rest of its cost is recovery: a held replica's queue is re-formed when it serves again; CS time 0, so violations need resets within one handoff)"
    )?;
    targets.push(Target {
        name: "Fig. 8 with the takeover delay: no exclusion violation".into(),
        detail: format!("{delay_violations} violations over {} lifetimes and 2 rules", LIFETIMES.len()),
        pass: delay_violations == 0,
    });
    let default_rule = RULES.iter().find(|r| r.proto == "sigma").expect("the default's rule");
    let paper_rule = RULES.iter().find(|r| r.proto == PAPER_BACKOFF).expect("the paper's rule");
    for (life, goal) in LIFETIMES.into_iter().zip(LOSS_GOALS) {
        let (ours, paper) = (loss(default_rule, life), loss(paper_rule, life));
        if let Some(goal) = goal {
            targets.push(Target {
                name: format!("Fig. 8, lifetime {life} s: loss at λ = {x_max} ≤ {goal}% ({})", default_rule.label),
                detail: format!("{ours:.1}%"),
                pass: ours <= goal,
            });
        }
        targets.push(Target {
            name: format!("Fig. 8, lifetime {life} s: loss below the paper's rule ({})", default_rule.label),
            detail: format!("{ours:.1}% vs {paper:.1}%"),
            pass: ours <= paper,
        });
    }
    let violations: usize = reports.iter().filter(|r| r.lifetime_s.is_none()).map(|r| r.violations.len()).sum();
    targets.push(Target {
        name: "no exclusion violation without resets".into(),
        detail: format!("{violations} violations"),
        pass: violations == 0,
    });
    writeln!(s)?;
    writeln!(
        s,
        "Fig. 2: P(violation) per CS, T = 10,000 s, t = 10 s: n=32,m=24: {:.2e}; n=8,m=6: {:.2e}; n=5,m=4: {:.2e}",
        violation_probability(32, 24, 0.001),
        violation_probability(8, 6, 0.001),
        violation_probability(5, 4, 0.001)
    )?;
    s.push_str(&measured.text);
    targets.extend(measured.targets);

    let events: u64 = reports.iter().map(|r| r.events).sum::<u64>() + measured.events;
    let wall = started.elapsed().as_secs_f64();
    writeln!(s)?;
    writeln!(
        s,
        "{} simulation runs, {events} events in {wall:.1} s wall ({:.2} M events/s over {} threads)",
        reports.len() + 1,
        events as f64 / wall / 1e6,
        opts.threads
    )?;
    writeln!(s)?;
    for t in &targets {
        writeln!(s, "[{}] {}: {}", if t.pass { "PASS" } else { "FAIL" }, t.name, t.detail)?;
    }
    writeln!(s)?;
    writeln!(s, "Files in {}: runs.csv, fig2-analytic.csv, fig2-measured.csv, summary.txt; fig2-analytic, fig3-strawman, fig7-sigma-vs-strawman, fig8-loss, fig8-resets (default: relay), fig8-resets-no-recovery, fig8-resets-paper-backoff, fig8-resets-inquire, fig8-resets-no-recovery-takeover-delay, fig8-resets-takeover-delay, messages as .svg and .png", opts.out.display())?;
    std::fs::write(opts.out.join("summary.txt"), &s)?;
    Ok(PaperResult { targets, summary: s })
}

struct Measured {
    text: String,
    targets: Vec<Target>,
    events: u64,
}

/// Fig. 2 measured where it is measurable: n = 5, m = 4, CS time t = 1 s and mean
/// replica lifetime T = 5 s (t/T = 0.2), saturated so that a waiter is always ready to
/// take a reset replica's vote.
fn fig2_measured(opts: &PaperOptions, config: &Config) -> Result<Measured> {
    let (n, m) = (5usize, 4usize);
    let (t, life) = (1.0, 5.0);
    let config = config.clone().with_quorum(n, m);
    let measure = if opts.quick { 2_000.0 } else { 20_000.0 };
    let cfg = SimConfig {
        cs: Duration::from_secs_f64(t),
        mean_lifetime: Some(Duration::from_secs_f64(life)),
        warmup: Duration::from_secs(10),
        measure: Duration::from_secs_f64(measure),
        ..SimConfig::paper(2.0, latencies()[2], opts.seed.wrapping_add(1_000_003))
    };
    let delayed = engine::run(&Sigma(config.clone()), SimConfig { takeover_delay: true, ..cfg.clone() });
    let r = engine::run(&Sigma(config), cfg);
    // The paper's formula takes p = t/T; with exponential lifetimes the exact chance
    // that a given replica resets during the CS is 1 − e^(−t/T).
    let p_paper = t / life;
    let p = 1.0 - (-t / life).exp();
    let trials = r.completed;
    // Expected exposures given each entry's vote count v: P(Binomial(v, p) ≥ m − n + v).
    let (mut expected, mut var) = (0.0, 0.0);
    for (v, count) in r.votes_histogram.iter().enumerate() {
        if *count == 0 || v < m {
            continue;
        }
        let q = tail(v as u32, (m + v - n) as u32, p);
        expected += *count as f64 * q;
        var += *count as f64 * q * (1.0 - q);
    }
    let half = 3.29 * var.sqrt(); // 99.9% two-sided, normal approximation of a Poisson binomial
    let (lo, hi) = ((expected - half).max(0.0), expected + half);
    let predicted = violation_probability(n as u32, m as u32, p);
    let (_, v_hi) = binomial_interval(trials, predicted, 0.999);
    let violations = r.violations.len() as u64;
    let min_shared = r.violations.iter().map(|v| v.shared_voters_reset).min();
    let rows: Vec<Vec<String>> = r
        .violations
        .iter()
        .map(|v| {
            vec![
                format!("{:.3}", v.at),
                v.holder.to_string(),
                v.newcomer.to_string(),
                v.holder_votes.to_string(),
                v.shared_voters.to_string(),
                v.shared_voters_reset.to_string(),
                v.holder_voters_reset.to_string(),
            ]
        })
        .collect();
    write_csv(
        &opts.out.join("fig2-measured.csv"),
        &[
            "at_s",
            "holder",
            "newcomer",
            "holder_votes",
            "shared_voters",
            "shared_voters_reset",
            "holder_voters_reset_in_cs",
        ],
        &rows,
    )?;
    let mut text = String::new();
    writeln!(text, "Fig. 2 measured: n={n}, m={m}, t={t}s, T={life}s (t/T = {p_paper}; exact per-replica reset chance 1−e^(−t/T) = {p:.4}), seed {}", r.seed)?;
    writeln!(
        text,
        "  paper formula with t/T: {:.3e}; with the exact chance: {predicted:.3e}",
        violation_probability(n as u32, m as u32, p_paper)
    )?;
    writeln!(text, "  {trials} CS entries, {} resets; exposures (≥ 2m−n of the holder's quorum reset during its CS): {} (expected {expected:.1}, 99.9% [{lo:.1}, {hi:.1}])", r.resets, r.exposures)?;
    writeln!(text, "  exclusion violations: {violations} (rate {:.3e}; bound from the prediction ≤ {v_hi}); fewest reset shared voters in a violation: {}", violations as f64 / trials.max(1) as f64, min_shared.map_or("-".into(), |x| x.to_string()))?;
    writeln!(
        text,
        "  budget violations (fewer than 2m−n = {} of the replicas both count reset between their grants): {} of {violations} (target 0)",
        2 * m - n,
        r.budget_violations
    )?;
    writeln!(
        text,
        "  with the takeover delay (a reset replica grants nothing for one lease): {} CS entries ({:.1}% of the throughput without), exclusion violations: {} (target 0), budget violations: {}",
        delayed.completed,
        100.0 * delayed.throughput / r.throughput.max(1e-12),
        delayed.violations.len(),
        delayed.budget_violations
    )?;
    let targets = vec![
        Target {
            name: "Fig. 2 measured with the takeover delay: no exclusion violation".into(),
            detail: format!(
                "{} violations in {} entries (without the delay: {violations}); availability cost {:.1}% of the throughput",
                delayed.violations.len(),
                delayed.completed,
                100.0 - 100.0 * delayed.throughput / r.throughput.max(1e-12)
            ),
            pass: delayed.violations.is_empty(),
        },
        Target {
            name: "Fig. 2 measured: exposures within the 99.9% band of the prediction".into(),
            detail: format!("{} in [{lo:.1}, {hi:.1}]", r.exposures),
            pass: (r.exposures as f64) >= lo && (r.exposures as f64) <= hi,
        },
        Target {
            name: "Fig. 2 measured: violations within the 99.9% binomial bound".into(),
            detail: format!("{violations} ≤ {v_hi}"),
            pass: violations <= v_hi,
        },
        Target {
            name: "Fig. 2 measured: every violation involves ≥ 2m−n reset voters".into(),
            detail: format!("min {} vs 2m−n = {}", min_shared.map_or("-".into(), |x| x.to_string()), 2 * m - n),
            pass: min_shared.is_none_or(|x| x >= 2 * m - n),
        },
        Target {
            name: "Fig. 2 measured: no budget violation (< 2m−n shared voters reset between the two grants)".into(),
            detail: format!("{} of {violations} violations", r.budget_violations),
            pass: r.budget_violations == 0,
        },
    ];
    Ok(Measured { text, targets, events: r.events + delayed.events })
}

/// P(Binomial(v, p) ≥ k).
fn tail(v: u32, k: u32, p: f64) -> f64 {
    (k..=v)
        .map(|j| {
            let c: f64 = (0..j).map(|i| f64::from(v - i) / f64::from(i + 1)).product();
            c * p.powi(j as i32) * (1.0 - p).powi((v - j) as i32)
        })
        .sum()
}

/// Runs jobs on `threads` workers, results in job order.
/// Writes one CSV line per run with every figure of its report.
pub(crate) fn write_runs_csv(path: &Path, reports: &[Report]) -> Result<()> {
    let header = [
        "protocol",
        "latency",
        "lifetime_s",
        "lambda",
        "throughput",
        "entries",
        "acquire_p50_s",
        "acquire_p99_s",
        "messages_per_entry",
        "window_messages_per_entry",
        "yields_per_entry",
        "retries_per_entry",
        "violations",
        "resets",
        "waiting_at_end",
        "out_of_order",
        "crashed",
        "truncated_at_s",
        "events",
        "wall_s",
        "seed",
    ];
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            vec![
                r.protocol.clone(),
                r.latency.clone(),
                r.lifetime_s.map_or(String::new(), |l| l.to_string()),
                r.lambda.to_string(),
                format!("{:.4}", r.throughput),
                r.entries.to_string(),
                format!("{:.4}", r.acquire_p50),
                format!("{:.4}", r.acquire_p99),
                format!("{:.2}", r.messages_per_entry),
                format!("{:.2}", r.window_messages_per_entry),
                format!("{:.3}", r.yields_per_entry),
                format!("{:.3}", r.retries_per_entry),
                r.violations.len().to_string(),
                r.resets.to_string(),
                r.waiting_at_end.to_string(),
                format!("{:.4}", r.out_of_order),
                r.crashed.to_string(),
                r.truncated_at.map_or(String::new(), |t| format!("{t:.1}")),
                r.events.to_string(),
                format!("{:.3}", r.wall_s),
                r.seed.to_string(),
            ]
        })
        .collect();
    write_csv(path, &header, &rows)
}

pub(crate) fn run_jobs<J: Sync, F: Fn(usize, &J) -> Report + Sync>(jobs: &[J], threads: usize, f: F) -> Vec<Report> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(k) else { break };
                let report = f(k, job);
                if let Ok(mut r) = results.lock() {
                    r[k] = Some(report);
                }
            });
        }
    });
    results.into_inner().unwrap_or_default().into_iter().flatten().collect()
}

/// Writes `name.svg` and `name.png` in `dir`.
pub(crate) fn write_figure(chart: &Chart, dir: &Path, name: &str) -> Result<()> {
    write_chart(chart, &dir.join(format!("{name}.svg")))?;
    write_chart(chart, &dir.join(format!("{name}.png")))
}

/// Where `sim paper` writes by default.
pub fn default_out() -> &'static Path {
    Path::new("results/paper")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_rule_runs_with_the_cores_slack() {
        assert_eq!(DEFAULT_SLACK, Config::default().retry_slack_percent());
        let sigma = RULES.iter().find(|r| r.proto == "sigma").expect("the default rule");
        assert_eq!(sigma.slack, Config::default().retry_slack_percent());
        assert_eq!(sigma.recovery, Config::default().recovery());
    }
}

//! One-way message latency distributions: the simulator's, and the node's test-only
//! message delay ([`crate::Config::with_message_delay`]), so that a run on real nodes
//! and a simulation draw their delays the same way.
//!
//! The paper's experiments (§5, Fig. 7) draw every one-way delay from a uniform
//! distribution such as U(0,200) ms; the constant and exponential cases are
//! useful as degenerate and heavy-tailed references.
//!
//! Command-line syntax (all values in milliseconds, fractions allowed):
//!
//! | text                            | distribution            |
//! |---------------------------------|-------------------------|
//! | `uniform:0,200`, `u:0,200`      | `Uniform { 0, 200 ms }` |
//! | `const:100`, `constant:100`     | `Constant(100 ms)`      |
//! | `exp:100`, `exponential:100`    | `Exponential { 100 ms }`|
//!
//! The [`Display`](fmt::Display) forms (`U(0,200)ms`, `const 100ms`,
//! `Exp(100ms)`) are accepted too, so printing and parsing round-trip.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;

/// A distribution of one-way message latencies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Latency {
    /// Every message takes exactly this long.
    Constant(Duration),
    /// Uniform on `[lo, hi]`. If `lo > hi` the bounds are used swapped.
    Uniform {
        /// Smallest latency.
        lo: Duration,
        /// Largest latency.
        hi: Duration,
    },
    /// Exponential with the given mean (memoryless, unbounded tail).
    Exponential {
        /// Mean latency.
        mean: Duration,
    },
}

impl Latency {
    /// Draws one latency.
    ///
    /// Uniform samples are exact to the nanosecond; exponential samples are
    /// computed in `f64` seconds and saturate at [`Duration::MAX`].
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            Latency::Constant(d) => d,
            Latency::Uniform { lo, hi } => {
                let (lo, hi) = (lo.min(hi), lo.max(hi));
                let lo_ns = duration_nanos_u64(lo);
                let hi_ns = duration_nanos_u64(hi);
                Duration::from_nanos(rng.gen_range(lo_ns..=hi_ns))
            }
            Latency::Exponential { mean } => {
                // Inverse transform: u in [0, 1) so 1 - u is in (0, 1] and the
                // logarithm is finite.
                let u: f64 = rng.gen();
                let secs = -mean.as_secs_f64() * (1.0 - u).ln();
                Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
            }
        }
    }

    /// The expected latency.
    pub fn mean(&self) -> Duration {
        match *self {
            Latency::Constant(d) => d,
            Latency::Uniform { lo, hi } => {
                let (lo, hi) = (lo.min(hi), lo.max(hi));
                lo + (hi - lo) / 2
            }
            Latency::Exponential { mean } => mean,
        }
    }
}

/// Saturating conversion; only durations above ~584 years are clamped.
fn duration_nanos_u64(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Formats a duration as milliseconds without a unit: `200`, `0.5`, `12.345678`.
fn fmt_ms(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos.is_multiple_of(1_000_000) {
        format!("{}", nanos / 1_000_000)
    } else {
        let s = format!("{}.{:06}", nanos / 1_000_000, nanos % 1_000_000);
        s.trim_end_matches('0').to_string()
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Latency::Constant(d) => write!(f, "const {}ms", fmt_ms(d)),
            Latency::Uniform { lo, hi } => write!(f, "U({},{})ms", fmt_ms(lo), fmt_ms(hi)),
            Latency::Exponential { mean } => write!(f, "Exp({}ms)", fmt_ms(mean)),
        }
    }
}

/// Why a latency specification could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid latency {input:?}: {reason} \
     (expected uniform:LO,HI, const:MS or exp:MEAN, in milliseconds)"
)]
pub struct ParseLatencyError {
    /// The text that was rejected.
    pub input: String,
    /// What was wrong with it.
    pub reason: String,
}

impl FromStr for Latency {
    type Err = ParseLatencyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s).map_err(|reason| ParseLatencyError { input: s.to_string(), reason })
    }
}

fn parse(s: &str) -> Result<Latency, String> {
    let text = s.trim().to_ascii_lowercase();
    let (kind, args) = if let Some((kind, args)) = text.split_once(':') {
        (kind.trim().to_string(), args.trim().to_string())
    } else if let Some(args) = strip_affixes(&text, "u(", ")ms") {
        ("uniform".to_string(), args.to_string())
    } else if let Some(args) = strip_affixes(&text, "exp(", "ms)") {
        ("exp".to_string(), args.to_string())
    } else if let Some(args) = strip_affixes(&text, "const ", "ms") {
        ("const".to_string(), args.to_string())
    } else {
        return Err("unknown format".to_string());
    };
    match kind.as_str() {
        "uniform" | "unif" | "u" => {
            let (lo, hi) = args.split_once(',').ok_or_else(|| "uniform needs two bounds LO,HI".to_string())?;
            let lo = parse_ms(lo)?;
            let hi = parse_ms(hi)?;
            if lo > hi {
                return Err(format!("lower bound {}ms exceeds upper bound {}ms", fmt_ms(lo), fmt_ms(hi)));
            }
            Ok(Latency::Uniform { lo, hi })
        }
        "const" | "constant" | "c" | "fixed" => Ok(Latency::Constant(parse_ms(&args)?)),
        "exp" | "exponential" | "e" => Ok(Latency::Exponential { mean: parse_ms(&args)? }),
        other => Err(format!("unknown distribution {other:?}")),
    }
}

fn strip_affixes<'a>(s: &'a str, prefix: &str, suffix: &str) -> Option<&'a str> {
    s.strip_prefix(prefix)?.strip_suffix(suffix)
}

/// Parses a non-negative number of milliseconds (an optional `ms` suffix is allowed).
fn parse_ms(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let t = t.strip_suffix("ms").unwrap_or(t).trim();
    if t.is_empty() {
        return Err("missing number of milliseconds".to_string());
    }
    let ms: f64 = t.parse().map_err(|_| format!("{t:?} is not a number of milliseconds"))?;
    if !ms.is_finite() || ms < 0.0 {
        return Err(format!("{t:?} is not a finite non-negative duration"));
    }
    let nanos = (ms * 1e6).round();
    if nanos > u64::MAX as f64 {
        return Err(format!("{t:?} ms is too large"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn sample_mean_ms(l: &Latency, n: usize) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        (0..n).map(|_| l.sample(&mut rng).as_secs_f64() * 1e3).sum::<f64>() / n as f64
    }

    #[test]
    fn uniform_samples_stay_in_bounds() {
        let l = Latency::Uniform { lo: ms(50), hi: ms(150) };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..10_000 {
            let d = l.sample(&mut rng);
            assert!(d >= ms(50) && d <= ms(150), "{d:?}");
        }
    }

    #[test]
    fn swapped_uniform_bounds_do_not_panic() {
        let l = Latency::Uniform { lo: ms(150), hi: ms(50) };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let d = l.sample(&mut rng);
        assert!(d >= ms(50) && d <= ms(150));
        assert_eq!(l.mean(), ms(100));
    }

    #[test]
    fn degenerate_distributions() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        assert_eq!(Latency::Constant(ms(100)).sample(&mut rng), ms(100));
        let point = Latency::Uniform { lo: ms(3), hi: ms(3) };
        assert_eq!(point.sample(&mut rng), ms(3));
        let zero = Latency::Exponential { mean: ms(0) };
        assert_eq!(zero.sample(&mut rng), Duration::ZERO);
    }

    #[test]
    fn sample_means_match_mean() {
        let cases = [
            Latency::Uniform { lo: ms(0), hi: ms(200) },
            Latency::Uniform { lo: ms(50), hi: ms(150) },
            Latency::Constant(ms(100)),
            Latency::Exponential { mean: ms(100) },
        ];
        for l in cases {
            let expect = l.mean().as_secs_f64() * 1e3;
            assert_eq!(expect, 100.0);
            let got = sample_mean_ms(&l, 200_000);
            // Standard error is at most 100/sqrt(2e5) ~ 0.22 ms (exponential).
            assert!((got - expect).abs() < 1.5, "{l}: mean {got}");
        }
    }

    #[test]
    fn exponential_is_non_negative_with_long_tail() {
        let l = Latency::Exponential { mean: ms(100) };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let over = (0..100_000).filter(|_| l.sample(&mut rng) > ms(300)).count();
        // P(X > 3 mean) = e^-3 ~ 0.0498.
        let frac = over as f64 / 100_000.0;
        assert!((frac - 0.0498).abs() < 0.004, "{frac}");
    }

    #[test]
    fn display() {
        assert_eq!(Latency::Uniform { lo: ms(0), hi: ms(200) }.to_string(), "U(0,200)ms");
        assert_eq!(Latency::Constant(ms(100)).to_string(), "const 100ms");
        assert_eq!(Latency::Exponential { mean: ms(100) }.to_string(), "Exp(100ms)");
        assert_eq!(Latency::Constant(Duration::from_micros(1500)).to_string(), "const 1.5ms");
    }

    #[test]
    fn parse_cli_forms() {
        let u = Latency::Uniform { lo: ms(0), hi: ms(200) };
        assert_eq!("uniform:0,200".parse::<Latency>(), Ok(u));
        assert_eq!("u:0,200".parse::<Latency>(), Ok(u));
        assert_eq!(" U: 0 , 200ms ".parse::<Latency>(), Ok(u));
        assert_eq!("const:100".parse::<Latency>(), Ok(Latency::Constant(ms(100))));
        assert_eq!("exp:100".parse::<Latency>(), Ok(Latency::Exponential { mean: ms(100) }));
        assert_eq!("const:0.25".parse::<Latency>(), Ok(Latency::Constant(Duration::from_micros(250))));
    }

    #[test]
    fn display_parse_round_trip() {
        let cases = [
            Latency::Uniform { lo: ms(0), hi: ms(200) },
            Latency::Uniform { lo: Duration::from_micros(500), hi: ms(7) },
            Latency::Constant(ms(100)),
            Latency::Exponential { mean: ms(100) },
            Latency::Exponential { mean: Duration::from_nanos(1_234_567) },
        ];
        for l in cases {
            assert_eq!(l.to_string().parse::<Latency>(), Ok(l), "{l}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "",
            "garbage",
            "uniform:200,0",
            "uniform:100",
            "uniform:a,b",
            "u:-1,5",
            "const:",
            "const:NaN",
            "const:inf",
            "exp:-3",
            "normal:100",
            "U(200,0)ms",
        ] {
            let err = bad.parse::<Latency>();
            assert!(err.is_err(), "{bad:?} parsed as {err:?}");
        }
        let err = "uniform:200,0".parse::<Latency>().unwrap_err().to_string();
        assert!(err.contains("exceeds upper bound"), "{err}");
        let err = "garbage".parse::<Latency>().unwrap_err().to_string();
        assert!(err.contains("expected uniform:LO,HI"), "{err}");
    }
}

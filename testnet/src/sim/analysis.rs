//! Closed-form and Monte Carlo models of Sigma, to check the simulator against.
//!
//! * [`violation_probability`]: the paper's §3 bound on breaking exclusivity
//!   through replica resets (Fig. 2).
//! * [`binomial_interval`]: the range a simulated count of violations (or any
//!   binomial count) should fall in, to turn "the simulator agrees with the
//!   formula" into a test.
//! * [`saturated_handoff`]: the expected time between two critical sections
//!   when many clients contend (the flat lines of Fig. 7).
//!
//! Everything here is pure `f64` arithmetic; randomness comes in as an
//! argument so results are reproducible with a seeded RNG.

use std::time::Duration;

use rand::Rng;

use super::latency::Latency;

/// `ln(n!)`, exact summation for small `n`, Stirling's series above.
///
/// The series with four correction terms has a relative error below 1e-16 for
/// `n >= 16`, so the result is as accurate as an `f64` can be.
fn ln_factorial(n: u64) -> f64 {
    if n < 16 {
        return (2..=n).map(|i| (i as f64).ln()).sum();
    }
    let x = n as f64;
    let inv = 1.0 / x;
    let inv2 = inv * inv;
    x * x.ln() - x
        + 0.5 * (2.0 * std::f64::consts::PI * x).ln()
        + inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0 - inv2 / 1680.0)))
}

/// `ln C(n, k)` for `k <= n`.
fn ln_choose(n: u64, k: u64) -> f64 {
    ln_factorial(n) - ln_factorial(k) - ln_factorial(n - k)
}

/// Probability that mutual exclusion breaks through replica resets (paper §3, Fig. 2).
///
/// A client in the critical section holds `m` votes out of `n` replicas. If a
/// voted replica resets it forgets its vote and may vote again, so a second
/// client can gather `m` votes once at least `2m − n` of the owner's voters
/// reset while it is inside. With `p = t/T` the probability that one replica
/// resets during a stay of length `t` (mean replica life `T`):
///
/// ```text
/// P = Σ_{k = 2m−n}^{m} C(m, k) · p^k · (1 − p)^(m − k)
/// ```
///
/// The terms are summed in log space (log-sum-exp), so values far below
/// `f64::MIN_POSITIVE`-scale cancellation are still right: `n = 32, m = 24,
/// p = 0.001` gives ≈ 7.3e-43.
///
/// Requires `1 <= n`, `n/2 < m <= n` and `0 <= p <= 1`; for any other input
/// (including a NaN `p`) it returns `f64::NAN` instead of panicking.
pub fn violation_probability(n: u32, m: u32, p: f64) -> f64 {
    if n == 0 || m > n || 2 * u64::from(m) <= u64::from(n) || !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    let (n, m) = (u64::from(n), u64::from(m));
    let k_min = 2 * m - n; // >= 1 because m > n/2
    if p == 0.0 {
        return 0.0;
    }
    if p == 1.0 {
        // Only the k = m term is non-zero: every voter resets for sure.
        return 1.0;
    }
    let ln_p = p.ln();
    let ln_q = (-p).ln_1p();
    let ln_terms: Vec<f64> = (k_min..=m).map(|k| ln_choose(m, k) + k as f64 * ln_p + (m - k) as f64 * ln_q).collect();
    let max = ln_terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = ln_terms.iter().map(|t| (t - max).exp()).sum();
    (max + sum.ln()).exp().min(1.0)
}

/// Central `confidence` interval `[lo, hi]` for a count `X ~ Binomial(trials, p)`.
///
/// Returns the narrowest `[lo, hi]` with `P(X < lo) <= (1 − c)/2` and
/// `P(X > hi) <= (1 − c)/2`, so an observed count outside it is evidence at
/// level `1 − c` that the true rate is not `p`.
///
/// The probabilities are exact, not a normal approximation: the pmf is
/// computed relative to the mode with the ratio recurrence
/// `pmf(k+1)/pmf(k) = (trials − k)/(k + 1) · p/(1 − p)`, walking outward until
/// a term falls below 1e-40 of the mode's, then normalised by the sum. That is
/// `O(σ)` work (about 27σ terms, σ = √(trials·p·(1−p))): trials = 1e7 at
/// p = 0.5 takes ~40k multiplications.
///
/// Edge cases: `trials == 0` or `p == 0` gives `(0, 0)`; `p == 1` gives
/// `(trials, trials)`; `confidence >= 1` gives the whole support; a NaN or
/// out-of-range `p`, or a NaN `confidence`, gives the uninformative
/// `(0, trials)`. A `confidence <= 0` is treated as 0 (a median point).
pub fn binomial_interval(trials: u64, p: f64, confidence: f64) -> (u64, u64) {
    if !(0.0..=1.0).contains(&p) || confidence.is_nan() {
        return (0, trials);
    }
    if trials == 0 || p == 0.0 {
        return (0, 0);
    }
    if p == 1.0 {
        return (trials, trials);
    }
    if confidence >= 1.0 {
        return (0, trials);
    }
    let tail = (1.0 - confidence.max(0.0)) / 2.0;

    const NEGLIGIBLE: f64 = 1e-40;
    let odds = p / (1.0 - p);
    let n = trials as f64;
    let mode = (((trials as f64 + 1.0) * p).floor() as u64).min(trials);

    // Weights relative to pmf(mode) = 1, below the mode (descending k) ...
    let mut below = Vec::new();
    let (mut k, mut w) = (mode, 1.0_f64);
    while k > 0 {
        // pmf(k-1)/pmf(k) = k / (trials - k + 1) / odds
        w *= k as f64 / ((n - k as f64 + 1.0) * odds);
        k -= 1;
        if w < NEGLIGIBLE {
            break;
        }
        below.push(w);
    }
    // ... and above it (ascending k).
    let mut above = Vec::new();
    let (mut k, mut w) = (mode, 1.0_f64);
    while k < trials {
        w *= (n - k as f64) / (k as f64 + 1.0) * odds;
        k += 1;
        if w < NEGLIGIBLE {
            break;
        }
        above.push(w);
    }
    let k_min = mode - below.len() as u64;
    // pmf for k = k_min ..= k_max, in order; small terms first keeps sums accurate.
    let pmf: Vec<f64> = below.iter().rev().copied().chain(std::iter::once(1.0)).chain(above.iter().copied()).collect();
    let total: f64 = pmf.iter().sum();

    // lo: the largest k with P(X < k) <= tail.
    let mut lo = k_min;
    let mut cum_below = 0.0;
    for (i, w) in pmf.iter().enumerate() {
        cum_below += w / total; // now P(X <= k_min + i)
        if cum_below > tail {
            break;
        }
        lo = k_min + i as u64 + 1;
    }
    // hi: the smallest k with P(X > k) <= tail.
    let k_max = k_min + pmf.len() as u64 - 1;
    let mut hi = k_max;
    let mut cum_above = 0.0;
    for (i, w) in pmf.iter().enumerate().rev() {
        cum_above += w / total; // now P(X >= k_min + i)
        if cum_above > tail {
            break;
        }
        hi = (k_min + i as u64).saturating_sub(1);
    }
    let hi = hi.min(trials);
    (lo.min(hi), hi)
}

/// Expected time between critical sections of a saturated lock, by Monte Carlo.
///
/// Model (CS time 0, every replica's queue non-empty): the owner sends RELEASE
/// to all `n` replicas at once; RELEASE to replica `i` takes one latency
/// sample `a_i`; replica `i` then votes for the next client in its queue, and
/// that RESPONSE takes another sample `b_i`. The next client enters when it
/// holds `m` votes, i.e. at the `m`-th smallest of the `n` sums `a_i + b_i`.
/// The handoff is that order statistic; it ignores yields and contention
/// between waiting clients, so it is the best case the protocol can reach
/// (the flat lines of the paper's Fig. 7).
///
/// Draws `samples` handoffs and returns their mean, the standard error of the
/// mean and `throughput_per_s = 1 / mean`. For `n = 32, m = 24` the means are
/// ≈ 253.8 ms for U(0,200) ms, ≈ 226.9 ms for U(50,150) ms and exactly 200 ms
/// for a constant 100 ms.
///
/// Invalid input (`m == 0`, `m > n` or `samples == 0`) yields a zero mean and
/// error and a NaN throughput rather than a panic.
pub fn saturated_handoff<R: Rng + ?Sized>(
    n: usize,
    m: usize,
    latency: &Latency,
    samples: usize,
    rng: &mut R,
) -> HandoffEstimate {
    if m == 0 || m > n || samples == 0 {
        return HandoffEstimate { mean: Duration::ZERO, stderr: Duration::ZERO, throughput_per_s: f64::NAN };
    }
    let mut sums = vec![Duration::ZERO; n];
    // Welford's running mean and variance, in seconds.
    let (mut mean, mut m2) = (0.0_f64, 0.0_f64);
    for count in 1..=samples {
        for s in sums.iter_mut() {
            *s = latency.sample(rng).saturating_add(latency.sample(rng));
        }
        let (_, mth, _) = sums.select_nth_unstable(m - 1);
        let x = mth.as_secs_f64();
        let delta = x - mean;
        mean += delta / count as f64;
        m2 += delta * (x - mean);
    }
    let var = if samples > 1 { m2 / (samples - 1) as f64 } else { 0.0 };
    let stderr = (var / samples as f64).sqrt();
    HandoffEstimate { mean: secs_to_duration(mean), stderr: secs_to_duration(stderr), throughput_per_s: 1.0 / mean }
}

/// Saturated throughput in critical sections per second when each owner stays
/// `cs` inside: `1 / (E[handoff] + cs)`, with `E[handoff]` estimated as in
/// [`saturated_handoff`]. Returns NaN for the same invalid inputs.
pub fn saturated_throughput_with_cs<R: Rng + ?Sized>(
    n: usize,
    m: usize,
    latency: &Latency,
    cs: Duration,
    samples: usize,
    rng: &mut R,
) -> f64 {
    saturated_handoff(n, m, latency, samples, rng).throughput_with_cs(cs)
}

fn secs_to_duration(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

/// Result of [`saturated_handoff`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HandoffEstimate {
    /// Mean time from the owner's RELEASE to the next client entering.
    pub mean: Duration,
    /// Standard error of `mean` (sample standard deviation / √samples).
    pub stderr: Duration,
    /// Critical sections per second with zero CS time: `1 / mean`.
    pub throughput_per_s: f64,
}

impl HandoffEstimate {
    /// Critical sections per second when each owner stays `cs` inside:
    /// `1 / (mean + cs)`. NaN if the estimate itself is invalid.
    pub fn throughput_with_cs(&self, cs: Duration) -> f64 {
        if self.throughput_per_s.is_nan() {
            return f64::NAN;
        }
        1.0 / (self.mean.as_secs_f64() + cs.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn assert_rel(got: f64, want: f64, tol: f64) {
        assert!(((got - want) / want).abs() < tol, "got {got:e}, want {want:e} (rel tol {tol})");
    }

    #[test]
    fn ln_factorial_matches_direct_sum() {
        let mut direct = 0.0_f64;
        for n in 1..=200u64 {
            direct += (n as f64).ln();
            let got = ln_factorial(n);
            assert!((got - direct).abs() <= 1e-12 * direct.max(1.0), "n={n}");
        }
        assert_eq!(ln_factorial(0), 0.0);
    }

    // Reference: paper §3 and Fig. 2 (T = 10000 s, t = 10 s, so p = 0.001).
    #[test]
    fn violation_probability_known_values() {
        assert_rel(violation_probability(32, 24, 0.001), 7.3e-43, 0.01);
        assert_rel(violation_probability(8, 6, 0.001), 1.5e-11, 0.01);
        assert_rel(violation_probability(5, 4, 0.001), 4.0e-9, 0.01);
        assert_rel(violation_probability(5, 4, 0.2), 2.72e-2, 0.001);
    }

    #[test]
    fn violation_probability_matches_direct_sum() {
        // Small cases where plain f64 arithmetic is exact enough.
        for (n, m) in [(3u32, 2u32), (5, 3), (7, 6), (10, 10), (9, 5)] {
            for p in [0.01_f64, 0.1, 0.5, 0.9] {
                let mut direct = 0.0;
                for k in (2 * m - n)..=m {
                    let c = (0..k).fold(1.0, |c, i| c * f64::from(m - i) / f64::from(i + 1));
                    direct += c * p.powi(k as i32) * (1.0 - p).powi((m - k) as i32);
                }
                assert_rel(violation_probability(n, m, p), direct, 1e-10);
            }
        }
    }

    #[test]
    fn violation_probability_edges_and_invalid() {
        assert_eq!(violation_probability(32, 24, 0.0), 0.0);
        assert_eq!(violation_probability(32, 24, 1.0), 1.0);
        assert!(violation_probability(32, 16, 0.1).is_nan()); // m = n/2
        assert!(violation_probability(32, 33, 0.1).is_nan());
        assert!(violation_probability(0, 0, 0.1).is_nan());
        assert!(violation_probability(5, 4, -0.1).is_nan());
        assert!(violation_probability(5, 4, 1.1).is_nan());
        assert!(violation_probability(5, 4, f64::NAN).is_nan());
        // More replicas required to vote means a safer lock.
        assert!(violation_probability(32, 28, 0.001) < violation_probability(32, 24, 0.001));
    }

    /// Reference implementation: plain cdf with exact small binomials.
    fn brute_interval(trials: u64, p: f64, c: f64) -> (u64, u64) {
        let pmf: Vec<f64> = (0..=trials)
            .map(|k| (ln_choose(trials, k) + k as f64 * p.ln() + (trials - k) as f64 * (1.0 - p).ln()).exp())
            .collect();
        let tail = (1.0 - c) / 2.0;
        let below = |k: u64| pmf[..k as usize].iter().sum::<f64>();
        let above = |k: u64| pmf[k as usize + 1..].iter().sum::<f64>();
        let lo = (0..=trials).rev().find(|&k| below(k) <= tail).unwrap_or(0);
        let hi = (0..=trials).find(|&k| above(k) <= tail).unwrap_or(trials);
        (lo, hi)
    }

    #[test]
    fn binomial_interval_known_cases() {
        // P(X <= 1) = 11/1024, P(X <= 2) = 56/1024 for Binomial(10, 1/2).
        assert_eq!(binomial_interval(10, 0.5, 0.95), (2, 8));
        // P(X <= 39) = 0.0176, P(X <= 40) = 0.0284 for Binomial(100, 1/2).
        assert_eq!(binomial_interval(100, 0.5, 0.95), (40, 60));
        // Close to Poisson(10): P(X <= 3) = 0.0103, P(X <= 4) = 0.0293,
        // P(X > 16) = 0.0270, P(X > 17) = 0.0143.
        assert_eq!(binomial_interval(10_000_000, 1e-6, 0.95), (4, 17));
    }

    #[test]
    fn binomial_interval_matches_brute_force() {
        for trials in [1u64, 2, 5, 17, 50, 200] {
            for p in [0.001, 0.03, 0.2, 0.5, 0.77, 0.999] {
                for c in [0.5, 0.9, 0.95, 0.99] {
                    assert_eq!(
                        binomial_interval(trials, p, c),
                        brute_interval(trials, p, c),
                        "trials={trials} p={p} c={c}"
                    );
                }
            }
        }
    }

    #[test]
    fn binomial_interval_symmetric() {
        for trials in [10u64, 101, 1000, 12345] {
            let (lo, hi) = binomial_interval(trials, 0.5, 0.99);
            assert_eq!(lo, trials - hi, "trials={trials}");
        }
    }

    #[test]
    fn binomial_interval_edges() {
        assert_eq!(binomial_interval(1000, 0.0, 0.95), (0, 0));
        assert_eq!(binomial_interval(1000, 1.0, 0.95), (1000, 1000));
        assert_eq!(binomial_interval(0, 0.3, 0.95), (0, 0));
        assert_eq!(binomial_interval(1000, 0.3, 1.0), (0, 1000));
        assert_eq!(binomial_interval(1000, f64::NAN, 0.95), (0, 1000));
        assert_eq!(binomial_interval(1000, 1.5, 0.95), (0, 1000));
        assert_eq!(binomial_interval(1000, 0.3, f64::NAN), (0, 1000));
        let (lo, hi) = binomial_interval(1000, 0.3, 0.0);
        assert!(lo <= hi && (299..=301).contains(&lo), "({lo}, {hi})");
    }

    #[test]
    fn binomial_interval_large_trials() {
        // Normal approximation: 5e6 ± 1.96 · 1581.1 = ± 3099.
        let (lo, hi) = binomial_interval(10_000_000, 0.5, 0.95);
        assert!((4_996_899..=4_996_903).contains(&lo), "{lo}");
        assert_eq!(lo, 10_000_000 - hi);
    }

    fn handoff(latency: Latency) -> HandoffEstimate {
        let mut rng = ChaCha8Rng::seed_from_u64(2004);
        saturated_handoff(32, 24, &latency, 40_000, &mut rng)
    }

    // Reference: paper Fig. 7, the flat lines for n = 32, m = 24.
    #[test]
    fn saturated_handoff_matches_design_numbers() {
        let ms = Duration::from_millis;
        let u0 = handoff(Latency::Uniform { lo: ms(0), hi: ms(200) });
        let u50 = handoff(Latency::Uniform { lo: ms(50), hi: ms(150) });
        let c100 = handoff(Latency::Constant(ms(100)));
        let mean_ms = |e: &HandoffEstimate| e.mean.as_secs_f64() * 1e3;
        assert!((mean_ms(&u0) - 253.8).abs() < 2.0, "{u0:?}");
        assert!((mean_ms(&u50) - 226.9).abs() < 2.0, "{u50:?}");
        assert_eq!(c100.mean, ms(200));
        assert_eq!(c100.stderr, Duration::ZERO);
        assert!((u0.throughput_per_s - 3.94).abs() < 0.03, "{u0:?}");
        assert!((u50.throughput_per_s - 4.41).abs() < 0.03, "{u50:?}");
        assert!((c100.throughput_per_s - 5.00).abs() < 1e-9, "{c100:?}");
        assert!(u0.stderr > Duration::ZERO && u0.stderr < ms(1));
    }

    #[test]
    fn throughput_with_cs_time() {
        let c100 = handoff(Latency::Constant(Duration::from_millis(100)));
        let t = c100.throughput_with_cs(Duration::from_millis(50));
        assert!((t - 4.0).abs() < 1e-9, "{t}");
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let t = saturated_throughput_with_cs(
            5,
            4,
            &Latency::Constant(Duration::from_millis(10)),
            Duration::from_millis(30),
            10,
            &mut rng,
        );
        assert!((t - 20.0).abs() < 1e-9, "{t}");
    }

    #[test]
    fn saturated_handoff_invalid_input_does_not_panic() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let l = Latency::Constant(Duration::from_millis(1));
        for (n, m, s) in [(3, 0, 10), (3, 4, 10), (3, 2, 0), (0, 0, 1)] {
            let e = saturated_handoff(n, m, &l, s, &mut rng);
            assert!(e.throughput_per_s.is_nan());
            assert!(e.throughput_with_cs(Duration::ZERO).is_nan());
        }
    }
}

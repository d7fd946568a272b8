//! Protocol parameters shared by clients and replicas.

use std::time::Duration;

use super::error::ConfigError;
use super::MAX_REPLICAS;

/// Parameters of the Sigma protocol. Private fields, `Default`, consuming `with_*`
/// setters; [`Config::validate`] checks the combination.
///
/// The defaults follow the paper where it gives a value (n = 32, m = 24) and are chosen
/// for a wide-area swarm elsewhere.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub(crate) n: usize,
    pub(crate) m: usize,
    pub(crate) lease: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) initial_rtt: Duration,
    pub(crate) initial_tcs: Duration,
    pub(crate) max_advice: Duration,
    pub(crate) min_advice: Duration,
    pub(crate) queue_grace: Duration,
    pub(crate) tombstone_ttl: Duration,
    pub(crate) idle_ttl: Duration,
    pub(crate) max_queue: usize,
    pub(crate) max_tombstones: usize,
    pub(crate) retry_slack_percent: u32,
    pub(crate) recovery: Recovery,
    pub(crate) max_clock_offset: Duration,
    pub(crate) max_drift_ppm: u32,
    pub(crate) min_voters: usize,
    /// A planted fault ([`Mutant`]); `None` outside the tests that check a checker.
    pub(crate) mutant: Option<Mutant>,
}

/// A fault planted in the core on purpose, to show that a checker catches it (the model
/// checker, the property tests). Test-only: no setting outside those tests plants one,
/// and without one the core runs exactly as specified (every mutant is a branch taken
/// only when its mutant is set).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mutant {
    /// A replica grants a REQUEST from another acquisition while its owner's vote is
    /// live: the owner is queued under its timestamp as if its lease had run out, and
    /// learns of it only at its next contact. Two holders with no reset.
    GrantOverLiveVote,
    /// A client counts a lapsed vote toward m: once m views name it, it stays valid
    /// until the *latest* of their leases ([`Client::valid_until`](super::Client::valid_until)),
    /// while a single vote may be live. Two holders with no reset.
    CountLapsedVote,
    /// An idle replica is disposable as soon as its tombstones allow, whatever its floor
    /// ([`Replica::is_disposable`](super::Replica::is_disposable)): dropped while the
    /// stamps it issued or the tokens it saw are ahead of its clock, its next incarnation
    /// grants below them. Fencing tokens go back with no reset.
    DisposalForgetsFloor,
}

/// How a reset replica (all memory lost) gets back into agreement with the others
/// while the line is long (ARCHITECTURE.md, "Reset recovery"). Without a rule, its vote
/// goes to the first REQUEST it sees after the reset (a newcomer at the back of the
/// line), and the heads of the line re-register there only when their own informed
/// backoff runs out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing beyond informed backoff and the renewal of waiters' votes by YIELD.
    None,
    /// Re-ask: a waiter promoted by some replica that has not won two smoothed round
    /// trips later re-sends its REQUEST to every replica whose vote it lacks. The reset
    /// replica queues it by timestamp; the waiter that owns the vote there yields it at
    /// its next renewal (renewal by YIELD while an earlier acquisition is in sight).
    Reask,
    /// Re-ask, and INQUIRE (Maekawa): a replica that receives a REQUEST older than its
    /// owner tells the owner once per grant (a RESPONSE with `inquire` set); an owner
    /// still waiting yields that vote at once, so it goes to the older request within
    /// a round trip. A holder ignores it.
    Inquire,
    /// INQUIRE, and the line relayed two handoffs ahead (no re-ask): every RESPONSE to
    /// an owner names the first waiters of the replica's queue, and every RELEASE the
    /// first waiters after the releaser at the replicas it owned (those that have
    /// waited longer than the request timeout, so no REQUEST of theirs can still be in
    /// flight). A replica that does not know one solicits its REQUEST; an owner that
    /// sees a replica lacking them sends it a RELAY naming them. The next heads are
    /// then queued at a reset replica before their turn comes, whether or not the line
    /// needed its vote since the reset. Re-ask is left out: the RELEASE reaches a
    /// reset replica sooner, and re-ask cost about two messages per CS entry below
    /// saturation without resets.
    Relay,
}

impl Recovery {
    /// Whether a replica sends INQUIRE.
    pub fn inquires(self) -> bool {
        matches!(self, Recovery::Inquire | Recovery::Relay)
    }
    /// Whether a promoted waiter re-asks.
    pub fn reasks(self) -> bool {
        matches!(self, Recovery::Reask | Recovery::Inquire)
    }
    /// Whether the line is relayed.
    pub fn relays(self) -> bool {
        matches!(self, Recovery::Relay)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            n: 32,
            m: 24,
            lease: Duration::from_secs(10),
            renew_interval: Duration::from_secs(3),
            request_timeout: Duration::from_secs(2),
            initial_rtt: Duration::from_millis(200),
            initial_tcs: Duration::from_millis(250),
            max_advice: Duration::from_secs(600),
            min_advice: Duration::from_millis(50),
            queue_grace: Duration::from_secs(10),
            tombstone_ttl: Duration::from_secs(60),
            idle_ttl: Duration::from_secs(5),
            max_queue: 100_000,
            max_tombstones: 100_000,
            retry_slack_percent: 50,
            recovery: Recovery::Relay,
            max_clock_offset: Duration::from_secs(5),
            max_drift_ppm: 1_000,
            min_voters: 1,
            mutant: None,
        }
    }
}

impl Config {
    /// Number of logical replicas per resource (paper: n).
    pub fn n(&self) -> usize {
        self.n
    }
    /// Votes needed to win (paper: m, a strict majority of n).
    pub fn m(&self) -> usize {
        self.m
    }
    /// Lease a replica grants its owner; renewed while held (§4, failure 3).
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// How often an owner renews each vote it holds.
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
    }
    /// Re-send a REQUEST to a replica that has not answered within this time (§4,
    /// failure 4: a lost message looks like a crash).
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }
    /// Round-trip estimate before the first measurement; gates YIELD (see `client`).
    pub fn initial_rtt(&self) -> Duration {
        self.initial_rtt
    }
    /// T_cs estimate of a replica that has seen no release yet.
    pub fn initial_tcs(&self) -> Duration {
        self.initial_tcs
    }
    /// Bounds on informed-backoff advice, whatever the replica says.
    pub fn advice_bounds(&self) -> (Duration, Duration) {
        (self.min_advice, self.max_advice)
    }
    /// A queued entry whose client has not been heard of for its advised wait plus this
    /// grace is dropped: a dead waiter costs nothing once it is gone.
    pub fn queue_grace(&self) -> Duration {
        self.queue_grace
    }
    /// How long a replica remembers released acquisitions (late duplicates are ignored).
    pub fn tombstone_ttl(&self) -> Duration {
        self.tombstone_ttl
    }
    /// How long an idle replica (no owner, no waiter) is kept after its last RELEASE
    /// before its host may drop it, tombstones and all (at most the tombstone TTL).
    pub fn idle_ttl(&self) -> Duration {
        self.idle_ttl
    }
    /// Bound on waiters per replica.
    pub fn max_queue(&self) -> usize {
        self.max_queue
    }
    /// Most tombstones a replica keeps.
    pub fn max_tombstones(&self) -> usize {
        self.max_tombstones
    }
    /// A waiter re-sends its REQUEST after `T_w · (1 + slack) + 2·srtt` (slack in percent).
    pub fn retry_slack_percent(&self) -> u32 {
        self.retry_slack_percent
    }

    /// How far ahead of a peer's own clock a remote timestamp, floor, token or grant
    /// stamp may be (hybrid logical clocks bound accepted values the same way). Beyond
    /// it the message is refused: one value near `u64::MAX` would otherwise saturate a
    /// replica's grant stamps or a client's Lamport clock for good.
    pub fn max_clock_offset(&self) -> Duration {
        self.max_clock_offset
    }
    /// Bound on the rate difference between two peers' clocks, in parts per million
    /// (NTP slews a clock by up to 500 ppm; two clocks slewed apart differ by 1,000).
    /// A client shortens every lease it counts by this fraction.
    pub fn max_drift_ppm(&self) -> u32 {
        self.max_drift_ppm
    }
    /// Quorum diversity D: a win needs live votes from at least D distinct voters (the
    /// peers hosting the replicas, as the driver names them; a replica whose voter is
    /// not named counts as its own). Default 1: the core alone has no notion of peers.
    pub fn min_voters(&self) -> usize {
        self.min_voters
    }
    /// Sets the quorum diversity D (see [`Config::min_voters`]).
    pub fn with_min_voters(mut self, d: usize) -> Self {
        self.min_voters = d;
        self
    }

    /// Replica count and quorum.
    pub fn with_quorum(mut self, n: usize, m: usize) -> Self {
        self.n = n;
        self.m = m;
        self
    }
    /// Lease length; the renewal interval becomes a third of it and the request
    /// timeout at most a quarter (a promotion notice is assumed to spend at most the
    /// request timeout in flight, so it must be well below the lease).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.renew_interval = lease / 3;
        self.request_timeout = self.request_timeout.min(lease / 4);
        self
    }
    /// Renewal interval (must be below the lease).
    pub fn with_renew_interval(mut self, d: Duration) -> Self {
        self.renew_interval = d;
        self
    }
    /// Retransmission timeout for unanswered requests.
    pub fn with_request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }
    /// Initial round-trip estimate.
    pub fn with_initial_rtt(mut self, d: Duration) -> Self {
        self.initial_rtt = d;
        self
    }
    /// Initial T_cs estimate.
    pub fn with_initial_tcs(mut self, d: Duration) -> Self {
        self.initial_tcs = d;
        self
    }
    /// Bounds on informed-backoff advice.
    pub fn with_advice_bounds(mut self, min: Duration, max: Duration) -> Self {
        self.min_advice = min;
        self.max_advice = max;
        self
    }
    /// Grace after the advised wait before an unheard waiter is dropped.
    pub fn with_queue_grace(mut self, d: Duration) -> Self {
        self.queue_grace = d;
        self
    }
    /// Tombstone lifetime.
    pub fn with_tombstone_ttl(mut self, d: Duration) -> Self {
        self.tombstone_ttl = d;
        self
    }
    /// How long an idle replica is kept after its last RELEASE (see [`Config::idle_ttl`]).
    pub fn with_idle_ttl(mut self, d: Duration) -> Self {
        self.idle_ttl = d;
        self
    }
    /// Informed-backoff slack: a waiter retries at `T_w · (1 + percent/100)` plus two
    /// round trips. 0 is the paper's rule; see ARCHITECTURE.md for the trade-off.
    pub fn with_retry_slack_percent(mut self, percent: u32) -> Self {
        self.retry_slack_percent = percent;
        self
    }
    /// How a replica that lost its memory is brought back into the line (see
    /// [`Recovery`]).
    pub fn with_recovery(mut self, recovery: Recovery) -> Self {
        self.recovery = recovery;
        self
    }
    /// The reset-recovery rule.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }
    /// Bound on remote timestamps ahead of the local clock (see [`Config::max_clock_offset`]).
    pub fn with_max_clock_offset(mut self, d: Duration) -> Self {
        self.max_clock_offset = d;
        self
    }
    /// Bound on the clock-rate difference between peers, in ppm (see
    /// [`Config::max_drift_ppm`]).
    pub fn with_max_drift_ppm(mut self, ppm: u32) -> Self {
        self.max_drift_ppm = ppm;
        self
    }
    /// Bounds on per-replica state.
    pub fn with_state_bounds(mut self, max_queue: usize, max_tombstones: usize) -> Self {
        self.max_queue = max_queue;
        self.max_tombstones = max_tombstones;
        self
    }

    /// Plants a fault in the replicas built from this configuration (see [`Mutant`];
    /// test-only).
    #[doc(hidden)]
    pub fn with_mutant(mut self, mutant: Mutant) -> Self {
        self.mutant = Some(mutant);
        self
    }

    /// Checks `n/2 < m <= n <= MAX_REPLICAS` and that durations are usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.n > MAX_REPLICAS {
            return Err(ConfigError::TooManyReplicas(self.n));
        }
        if self.m > self.n || 2 * self.m <= self.n {
            return Err(ConfigError::Quorum { n: self.n, m: self.m });
        }
        for (name, d) in [
            ("lease", self.lease),
            ("renew_interval", self.renew_interval),
            ("request_timeout", self.request_timeout),
            ("initial_rtt", self.initial_rtt),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration(name));
            }
        }
        if self.renew_interval >= self.lease {
            return Err(ConfigError::RenewNotBelowLease);
        }
        if self.request_timeout * 2 > self.lease {
            return Err(ConfigError::RequestTimeoutNotBelowLease);
        }
        if self.min_voters == 0 || self.min_voters > self.m {
            return Err(ConfigError::Diversity { d: self.min_voters, m: self.m });
        }
        if self.max_drift_ppm >= 100_000 {
            return Err(ConfigError::Drift(self.max_drift_ppm));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_papers_32_24() {
        let c = Config::default();
        assert_eq!((c.n(), c.m()), (32, 24));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn quorum_must_be_a_strict_majority() {
        assert!(Config::default().with_quorum(4, 2).validate().is_err());
        assert!(Config::default().with_quorum(4, 3).validate().is_ok());
        assert!(Config::default().with_quorum(4, 5).validate().is_err());
        assert!(Config::default().with_quorum(1, 1).validate().is_ok());
        assert!(Config::default().with_quorum(0, 0).validate().is_err());
        assert!(Config::default().with_quorum(MAX_REPLICAS + 1, MAX_REPLICAS).validate().is_err());
    }

    #[test]
    fn renewals_must_come_before_the_lease_ends() {
        let c = Config::default().with_lease(Duration::from_secs(3)).with_renew_interval(Duration::from_secs(3));
        assert_eq!(c.validate(), Err(ConfigError::RenewNotBelowLease));
    }

    #[test]
    fn request_timeout_must_be_well_below_the_lease() {
        // A promoted vote is counted valid until `now + lease - request_timeout`: with a
        // request timeout as long as the lease it would never count (a livelock).
        let c = Config::default().with_lease(Duration::from_secs(2)).with_request_timeout(Duration::from_secs(2));
        assert_eq!(c.validate(), Err(ConfigError::RequestTimeoutNotBelowLease));
        assert!(Config::default().with_lease(Duration::from_secs(2)).validate().is_ok());
    }

    #[test]
    fn zero_lease_is_rejected() {
        let e = Config::default().with_lease(Duration::ZERO).validate();
        assert_eq!(e, Err(ConfigError::ZeroDuration("lease")));
    }
}

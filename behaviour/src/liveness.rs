//! Liveness records only their owner can refresh (docs/design/membership.md, "Signed
//! heartbeats").
//!
//! A member's heartbeat `(incarnation, counter)` is relayed by every peer's gossip, so a
//! relay must not be able to invent one: a forged beat could keep a dead peer alive,
//! silence a live one (a beat `(u64::MAX, u64::MAX)` ranks above all its own), or make
//! alive an id that has no key at all. Signing every beat would make every relayed beat
//! cost a signature check (about 50 µs: two million a second in a swarm of a thousand
//! peers gossiping twice a second), so a beat is authenticated by a **hash chain**
//! whose anchor is signed:
//!
//! - Counters run in epochs of [`CHAIN_LEN`] beats. For each epoch the owner draws a
//!   secret seed `s`, and token `j` of the epoch is `t_j = H^(L−j)(s)`; the anchor
//!   `t_0 = H^L(s)` is signed with the owner's libp2p key together with the peer id,
//!   the incarnation, the epoch and the owner's takeover delay.
//! - Beat `(incarnation, e·L + j)` carries `t_j`, the anchor and the anchor's signature
//!   (a [`Proof`]). Only the owner knows `t_j` before it publishes it, and anyone can
//!   check it: `H^(j − j')(t_j)` must equal the last token `t_{j'}` known of that epoch
//!   (the anchor for `j' = 0`).
//!
//! A receiver checks the signature once per member and epoch and then one hash per beat
//! (at most [`CHAIN_LEN`] for a beat far ahead, so a forged one costs a bounded amount).
//! The public key comes from the peer id itself: sigma peers have Ed25519 identities,
//! whose id embeds the key; an id that does not (an RSA key's hash, or any SHA-256
//! multihash an attacker makes up) cannot be checked and is refused.
//!
//! A record is also refused when its incarnation (the owner's start time, in ms since
//! the Unix epoch) is more than [`MAX_INCARNATION_AHEAD`] ahead of the receiver's own
//! clock, or its counter is more than a beat a millisecond past that incarnation: a peer
//! whose clock was far ahead when it started would otherwise outrank its own later
//! restarts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libp2p::identity::{Keypair, PublicKey};
use libp2p::PeerId;
use sha2::{Digest, Sha256};

/// Beats per epoch: one signature a member per this many of its gossip rounds (8.5
/// minutes at the default 500 ms), and the most hashes one beat can cost to check.
pub const CHAIN_LEN: u64 = 1024;

/// Bytes of a chain token (and of the anchor): 128 bits, against which finding a
/// preimage is out of reach.
pub const TOKEN_LEN: usize = 16;

/// How far ahead of this peer's clock a member's incarnation (its start time) may be:
/// the clock offset between two peers this membership tolerates.
pub const MAX_INCARNATION_AHEAD: Duration = Duration::from_secs(600);

/// Longest signature accepted (Ed25519's is 64 bytes).
pub const MAX_SIGNATURE_LEN: usize = 128;

/// A chain token.
pub type Token = [u8; TOKEN_LEN];

/// What proves a beat was made by its owner: the token of its counter, and the signed
/// anchor of its epoch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Proof {
    /// The anchor of the beat's epoch, `t_0`.
    pub anchor: serde_bytes::ByteArray<TOKEN_LEN>,
    /// The owner's signature of the anchor ([`anchor_message`]).
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
    /// The beat's token, `t_j`.
    pub token: serde_bytes::ByteArray<TOKEN_LEN>,
}

/// A member's own statement that it leaves the swarm (a graceful stop): signed like an
/// anchor, it removes the member from every count at once (docs/design/membership.md,
/// "Leaving and forgetting"). A later incarnation of the same peer is a newcomer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leave {
    /// The member leaving.
    pub peer: PeerId,
    /// The incarnation that ends.
    pub incarnation: u64,
    /// The member's signature of [`leave_message`].
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
}

/// The bytes a leave's signature covers.
pub fn leave_message(peer: &PeerId, incarnation: u64) -> Vec<u8> {
    let mut m = b"sigma/leave/1".to_vec();
    m.extend_from_slice(&peer.to_bytes());
    m.extend_from_slice(&incarnation.to_be_bytes());
    m
}

/// Checks a leave's signature and its incarnation's bound (as [`in_range`]).
pub fn verify_leave(leave: &Leave, now_ms: u64) -> Result<(), Refused> {
    if !in_range((leave.incarnation, 1), now_ms) {
        return Err(Refused::OutOfRange);
    }
    if leave.signature.len() > MAX_SIGNATURE_LEN {
        return Err(Refused::BadSignature);
    }
    let key = public_key(&leave.peer).ok_or(Refused::NoKey)?;
    if key.verify(&leave_message(&leave.peer, leave.incarnation), &leave.signature) {
        Ok(())
    } else {
        Err(Refused::BadSignature)
    }
}

/// Why a record was refused (each is counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Relayed without a proof (from a peer from before signed records, or forged).
    Unproven,
    /// The peer id does not embed a public key to check the signature with.
    NoKey,
    /// The anchor's signature does not verify.
    BadSignature,
    /// The token does not hash to the anchor or to the last token known.
    BadToken,
    /// Counter 0 (no beat has it), or an epoch or incarnation beyond the bounds above.
    OutOfRange,
    /// Of a peer not on the fixed member list (an allow-list).
    NotListed,
    /// One table introduced more new members than a table may
    /// ([`crate::membership::MAX_NEW_PER_TABLE`]).
    TooManyNew,
    /// Of a peer of another prefix group: not a member here (not bad input: a table
    /// from across a split just done).
    OtherGroup,
}

impl Refused {
    /// Short name for counters.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refused::Unproven => "beat_unproven",
            Refused::NoKey => "beat_no_key",
            Refused::BadSignature => "beat_bad_signature",
            Refused::BadToken => "beat_bad_token",
            Refused::OutOfRange => "beat_out_of_range",
            Refused::NotListed => "beat_not_listed",
            Refused::TooManyNew => "beat_too_many_new",
            Refused::OtherGroup => "beat_other_group",
        }
    }
}

fn hash(token: &Token) -> Token {
    let digest = Sha256::new().chain_update(b"sigma/beat-chain/1").chain_update(token).finalize();
    let mut out = [0; TOKEN_LEN];
    out.copy_from_slice(&digest[..TOKEN_LEN]);
    out
}

/// The epoch of counter `counter` and the token's place in it, `1..=CHAIN_LEN`; none
/// for counter 0.
pub fn position(counter: u64) -> Option<(u64, u64)> {
    let c = counter.checked_sub(1)?;
    Some((c / CHAIN_LEN, c % CHAIN_LEN + 1))
}

/// The bytes an anchor's signature covers.
pub fn anchor_message(peer: &PeerId, incarnation: u64, epoch: u64, anchor: &Token, delay_ms: Option<u64>) -> Vec<u8> {
    let mut m = b"sigma/beat-anchor/1".to_vec();
    m.extend_from_slice(&peer.to_bytes());
    m.extend_from_slice(&incarnation.to_be_bytes());
    m.extend_from_slice(&epoch.to_be_bytes());
    m.extend_from_slice(anchor);
    m.extend_from_slice(&delay_ms.map_or([0xff; 9], |d| {
        let mut b = [0; 9];
        b[1..].copy_from_slice(&d.to_be_bytes());
        b
    }));
    m
}

/// The public key embedded in `peer`'s id, if it has one (an identity multihash).
pub fn public_key(peer: &PeerId) -> Option<PublicKey> {
    let mh = peer.as_ref();
    (mh.code() == 0).then(|| PublicKey::try_decode_protobuf(mh.digest()).ok()).flatten()
}

/// This peer's own chain: makes the proof of each of its beats.
pub struct Chain {
    key: Keypair,
    peer: PeerId,
    incarnation: u64,
    delay_ms: Option<u64>,
    /// The current epoch, its tokens (`tokens[j]` = `t_j`) and the anchor's signature.
    epoch: Option<(u64, Vec<Token>, Vec<u8>)>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("peer", &self.peer).field("incarnation", &self.incarnation).finish()
    }
}

impl Chain {
    /// The chain of the peer with key `key` in incarnation `incarnation`, whose beats
    /// announce takeover delay `delay_ms`.
    pub fn new(key: Keypair, incarnation: u64, delay_ms: Option<u64>) -> Self {
        let peer = key.public().to_peer_id();
        Chain { key, peer, incarnation, delay_ms, epoch: None }
    }

    /// The incarnation this chain proves beats of.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// This incarnation's leave, signed.
    pub fn leave(&self) -> Option<Leave> {
        let signature = self.key.sign(&leave_message(&self.peer, self.incarnation)).ok()?;
        Some(Leave { peer: self.peer, incarnation: self.incarnation, signature })
    }

    /// The proof of beat `counter` (≥ 1) of this incarnation. A new epoch draws a seed,
    /// hashes its chain and signs its anchor.
    pub fn proof(&mut self, counter: u64) -> Option<Proof> {
        let (epoch, j) = position(counter)?;
        if self.epoch.as_ref().is_none_or(|(e, _, _)| *e != epoch) {
            let mut t: Token = [0; TOKEN_LEN];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut t);
            let mut tokens = vec![[0; TOKEN_LEN]; CHAIN_LEN as usize + 1];
            for slot in tokens.iter_mut().rev() {
                *slot = t;
                t = hash(&t);
            }
            let message = anchor_message(&self.peer, self.incarnation, epoch, &tokens[0], self.delay_ms);
            let signature = self.key.sign(&message).ok()?;
            self.epoch = Some((epoch, tokens, signature));
        }
        let (_, tokens, signature) = self.epoch.as_ref()?;
        Some(Proof {
            anchor: serde_bytes::ByteArray::new(tokens[0]),
            signature: signature.clone(),
            token: serde_bytes::ByteArray::new(tokens[j as usize]),
        })
    }
}

/// Milliseconds since the Unix epoch on this peer's clock.
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether beat `(incarnation, counter)` is within the bounds at wall-clock time
/// `now_ms`: counter at least 1, incarnation at most [`MAX_INCARNATION_AHEAD`] ahead,
/// and no more than one beat a millisecond since the incarnation began.
pub fn in_range((incarnation, counter): (u64, u64), now_ms: u64) -> bool {
    let ahead = u64::try_from(MAX_INCARNATION_AHEAD.as_millis()).unwrap_or(u64::MAX);
    let horizon = now_ms.saturating_add(ahead);
    counter >= 1 && incarnation <= horizon && counter - 1 <= horizon.saturating_sub(incarnation)
}

/// Checks that `proof` proves beat `(incarnation, counter)` of `peer` with takeover
/// delay `delay_ms`, given the last proven beat known of it (`known`: its counter and
/// proof, same incarnation), at wall-clock time `now_ms` ([`wall_ms`]).
pub fn verify(
    peer: &PeerId,
    (incarnation, counter): (u64, u64),
    delay_ms: Option<u64>,
    proof: &Proof,
    known: Option<(u64, &Proof)>,
    now_ms: u64,
) -> Result<(), Refused> {
    if !in_range((incarnation, counter), now_ms) {
        return Err(Refused::OutOfRange);
    }
    let (epoch, j) = position(counter).ok_or(Refused::OutOfRange)?;
    // The last token known of this epoch, under an anchor already checked.
    let from = known.and_then(|(c, p)| {
        let (e, i) = position(c)?;
        (e == epoch && i <= j && p.anchor == proof.anchor).then_some((i, *p.token))
    });
    let (steps, target) = match from {
        Some((i, t)) => (j - i, t),
        None => {
            if proof.signature.len() > MAX_SIGNATURE_LEN {
                return Err(Refused::BadSignature);
            }
            let key = public_key(peer).ok_or(Refused::NoKey)?;
            let message = anchor_message(peer, incarnation, epoch, &proof.anchor, delay_ms);
            if !key.verify(&message, &proof.signature) {
                return Err(Refused::BadSignature);
            }
            (j, *proof.anchor)
        }
    };
    let mut t = *proof.token;
    for _ in 0..steps {
        t = hash(&t);
    }
    if t == target {
        Ok(())
    } else {
        Err(Refused::BadToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain() -> (Chain, PeerId, u64) {
        let key = Keypair::generate_ed25519();
        let peer = key.public().to_peer_id();
        let inc = wall_ms();
        (Chain::new(key, inc, Some(17_000)), peer, inc)
    }

    #[test]
    fn each_beat_verifies_from_the_anchor_and_from_the_last_one_known() {
        let (mut c, peer, inc) = chain();
        let now = wall_ms();
        let p1 = c.proof(1).unwrap();
        assert_eq!(verify(&peer, (inc, 1), Some(17_000), &p1, None, now), Ok(()));
        let p5 = c.proof(5).unwrap();
        assert_eq!(verify(&peer, (inc, 5), Some(17_000), &p5, None, now), Ok(()));
        assert_eq!(verify(&peer, (inc, 5), Some(17_000), &p5, Some((1, &p1)), now), Ok(()));
        // The token of beat 5 is not that of beat 6.
        assert_eq!(verify(&peer, (inc, 6), Some(17_000), &p5, Some((1, &p1)), now), Err(Refused::BadToken));
        assert_eq!(verify(&peer, (inc, 6), Some(17_000), &p5, None, now), Err(Refused::BadToken));
        // A new epoch has a new anchor, signed again.
        let next = c.proof(CHAIN_LEN + 1).unwrap();
        assert_ne!(next.anchor, p1.anchor);
        assert_eq!(verify(&peer, (inc, CHAIN_LEN + 1), Some(17_000), &next, Some((5, &p5)), now), Ok(()));
    }

    #[test]
    fn a_relay_cannot_change_what_the_owner_signed() {
        let (mut c, peer, inc) = chain();
        let now = wall_ms();
        let p = c.proof(3).unwrap();
        assert_eq!(verify(&peer, (inc, 3), Some(1), &p, None, now), Err(Refused::BadSignature), "another delay");
        assert_eq!(verify(&peer, (inc + 1, 3), Some(17_000), &p, None, now), Err(Refused::BadSignature));
        let other = PeerId::from(Keypair::generate_ed25519().public());
        assert_eq!(verify(&other, (inc, 3), Some(17_000), &p, None, now), Err(Refused::BadSignature));
        // A made-up id with no key in it (a SHA-256 multihash) cannot be checked.
        let ghost = PeerId::from_multihash(libp2p::multihash::Multihash::wrap(0x12, &[7; 32]).unwrap()).unwrap();
        assert_eq!(verify(&ghost, (inc, 3), Some(17_000), &p, None, now), Err(Refused::NoKey));
        // A forged token a whole epoch ahead costs at most CHAIN_LEN hashes, and fails.
        let mut forged = p.clone();
        forged.token = serde_bytes::ByteArray::new([9; TOKEN_LEN]);
        assert_eq!(verify(&peer, (inc, CHAIN_LEN), Some(17_000), &forged, Some((3, &p)), now), Err(Refused::BadToken));
    }

    #[test]
    fn a_leave_verifies_only_for_its_own_peer_and_incarnation() {
        let (c, peer, inc) = chain();
        let now = wall_ms();
        let leave = c.leave().unwrap();
        assert_eq!(verify_leave(&leave, now), Ok(()));
        let other = PeerId::from(Keypair::generate_ed25519().public());
        assert_eq!(verify_leave(&Leave { peer: other, ..leave.clone() }, now), Err(Refused::BadSignature));
        assert_eq!(verify_leave(&Leave { incarnation: inc + 1, ..leave.clone() }, now), Err(Refused::BadSignature));
        assert_eq!(leave.peer, peer);
    }

    #[test]
    fn incarnations_and_epochs_are_bounded_by_the_receivers_clock() {
        let key = Keypair::generate_ed25519();
        let peer = key.public().to_peer_id();
        let now = wall_ms();
        let ahead = now + MAX_INCARNATION_AHEAD.as_millis() as u64 + 1;
        let mut c = Chain::new(key.clone(), ahead, None);
        let p = c.proof(1).unwrap();
        assert_eq!(verify(&peer, (ahead, 1), None, &p, None, now), Err(Refused::OutOfRange));
        assert_eq!(
            verify(&peer, (ahead, 1), None, &p, None, now + 1),
            Ok(()),
            "within the offset once the clock moves"
        );
        let mut c = Chain::new(key, now, None);
        let far = u64::MAX;
        let p = c.proof(far).unwrap();
        assert_eq!(verify(&peer, (now, far), None, &p, None, now), Err(Refused::OutOfRange));
        assert_eq!(verify(&peer, (now, 0), None, &p, None, now), Err(Refused::OutOfRange));
    }
}

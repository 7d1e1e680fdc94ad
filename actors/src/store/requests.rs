//! Records of answered mutations, so that a call made again (its answer was
//! lost when the shard's leader died, or it timed out) gets the answer of
//! the first attempt instead of being applied twice.
//!
//! A record is written in the transaction of the mutation it answers, so
//! it is in the shard's log (and on a majority of its members) exactly when
//! the mutation is; the new leader of a group applies every entry of earlier
//! terms before it takes a mutation, so it finds the record.
//!
//! How long a record is kept depends on no wall clock: not the calling
//! node's (a call's id carries the time it began on the caller, which may
//! be minutes off), and not a member's (which may be stepped). Each shard
//! has a *generation* of answers, a number in its replicated state: a
//! record goes into the shard's current generation, and a lookup reads the
//! current generation and the one before. The shard's leader moves the
//! generation on (a logged write, [`ShardStore::rotate_answers`]) once it
//! has seen the current one for [`REQUEST_RECORD_TTL`] by its own monotonic
//! clock ([`AnswerAge`]); a new leader, or a restarted one, starts counting
//! when it first sees the generation. So a record lives at least the TTL
//! after its mutation was applied, whatever the clocks say. Each member
//! deletes the generations older than the one before the oldest current
//! generation of its environment's shards ([`expire_answers`]), without
//! logging the deletion: an expired record is never asked for again, so
//! when it goes (or comes back from the log after a crash, to go again)
//! changes no answer. For the same reason the shard's digest leaves the
//! records out.
//!
//! Records live in their own table, `answers`, shared by the shards of an
//! environment and keyed by generation, then the call's time:
//! `generation ++ at_ns ++ shard ++ nonce`. The records of concurrent calls
//! therefore land on the same last page whichever shard they are for, so a
//! group commit writes one more page, not one per shard (keyed by shard
//! first, with the other tables, they cost a third more page writes per
//! create). A shard's generation is the table's key `ff ff ff ff ++ shard`.
//! Records of the release before generations (`at_ns ++ shard ++ nonce`)
//! are looked up until the shard's generation reaches 2 and deleted then.

use std::ops::Bound;
use std::time::{Duration, Instant};

use heed::{Env, RoTxn, WithoutTls};
use serde::de::DeserializeOwned;
use serde::Serialize;

use curvine_messages::codec::{from_bytes, to_bytes};
use curvine_messages::{FsError, FsResult, ReqId, ShardId};

use super::{lmdb_err, ShardStore};
use crate::txn::{Db, WriteTxn};

/// How long a mutation's answer is kept at least, after the mutation was
/// applied. A call is retried only within its request timeout
/// (`client.request_timeout`, 1 minute by default), so an answer older than
/// this is never asked for again.
pub const REQUEST_RECORD_TTL: Duration = Duration::from_secs(600);

/// How often a member deletes expired answers.
pub const ANSWER_EXPIRY_EVERY: Duration = Duration::from_secs(1);

/// How often a shard's actor looks at its generation of answers (and, on
/// the leader, moves it on when it is due).
pub const ANSWER_AGE_EVERY: Duration = Duration::from_secs(10);

/// Length of a request record's key.
pub(super) const REQUEST_KEY_LEN: usize = 21;

/// Where the shard byte sits in a request record's key.
const REQUEST_KEY_SHARD_AT: usize = 12;

/// Length, and shard byte, of a record's key from before generations.
const LEGACY_KEY_LEN: usize = 17;
const LEGACY_KEY_SHARD_AT: usize = 8;

/// The first bytes of a shard's generation key (then the shard byte).
const GENERATION_PREFIX: [u8; 4] = [0xff; 4];

/// Records from before generations begin with their call's time, which is
/// past 2^60 ns (2006): the key's first byte is at least this. No
/// generation gets there (one per TTL).
const LEGACY_FIRST_BYTE: u8 = 0x10;

/// Most records one expiry pass deletes (the rest go at the next).
const EXPIRE_BATCH: usize = 200_000;

/// The version byte of a stored answer.
const ANSWER_VERSION: u8 = 1;

fn request_key(generation: u32, shard: u8, req: ReqId) -> [u8; REQUEST_KEY_LEN] {
    let mut k = [0u8; REQUEST_KEY_LEN];
    k[..4].copy_from_slice(&generation.to_be_bytes());
    k[4..12].copy_from_slice(&req.at_ns.max(0).to_be_bytes());
    k[REQUEST_KEY_SHARD_AT] = shard;
    k[13..].copy_from_slice(&req.nonce.to_be_bytes());
    k
}

fn legacy_key(shard: u8, req: ReqId) -> [u8; LEGACY_KEY_LEN] {
    let mut k = [0u8; LEGACY_KEY_LEN];
    k[..8].copy_from_slice(&req.at_ns.max(0).to_be_bytes());
    k[LEGACY_KEY_SHARD_AT] = shard;
    k[9..].copy_from_slice(&req.nonce.to_be_bytes());
    k
}

fn generation_key(shard: u8) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[..4].copy_from_slice(&GENERATION_PREFIX);
    k[4] = shard;
    k
}

/// The shard a key of the `answers` table belongs to: a record's, an old
/// record's or a generation's.
pub(super) fn answer_shard(key: &[u8]) -> Option<u8> {
    match key.len() {
        REQUEST_KEY_LEN => Some(key[REQUEST_KEY_SHARD_AT]),
        LEGACY_KEY_LEN => Some(key[LEGACY_KEY_SHARD_AT]),
        5 if key[..4] == GENERATION_PREFIX => Some(key[4]),
        _ => None,
    }
}

fn read_generation(answers: Db, txn: &RoTxn, shard: u8) -> FsResult<Option<u32>> {
    match answers.get(txn, &generation_key(shard)).map_err(lmdb_err)? {
        None => Ok(None),
        Some(v) => match <[u8; 4]>::try_from(v) {
            Ok(b) => Ok(Some(u32::from_be_bytes(b))),
            Err(_) => Err(FsError::Corrupt(format!(
                "shard {shard}: its generation of answers is {} bytes, not 4",
                v.len()
            ))),
        },
    }
}

/// Deletes the answers no shard of `env` may still be asked for: the
/// generations before the one before the oldest current generation of the
/// environment's shards (and, once every shard is at generation 2 or more,
/// the records from before generations). Unlogged: see the module's
/// comment. Returns how many went (at most a batch per call).
pub fn expire_answers(env: &Env<WithoutTls>, answers: Db) -> FsResult<usize> {
    let oldest = {
        let txn = env.read_txn().map_err(lmdb_err)?;
        let mut oldest: Option<u32> = None;
        for item in answers
            .prefix_iter(&txn, &GENERATION_PREFIX)
            .map_err(lmdb_err)?
        {
            let (k, v) = item.map_err(lmdb_err)?;
            if k.len() != 5 {
                continue;
            }
            let g = <[u8; 4]>::try_from(v).map_or(0, u32::from_be_bytes);
            oldest = Some(oldest.map_or(g, |o| o.min(g)));
        }
        oldest
    };
    let Some(oldest) = oldest else {
        return Ok(0);
    };
    let mut doomed: Vec<Vec<u8>> = Vec::new();
    let mut txn = env.write_txn().map_err(lmdb_err)?;
    if oldest >= 2 {
        let end = (oldest - 1).to_be_bytes();
        collect_range(
            answers,
            &txn,
            (Bound::Unbounded, Bound::Excluded(&end[..])),
            &mut doomed,
        )?;
        let (from, to) = ([LEGACY_FIRST_BYTE], GENERATION_PREFIX);
        collect_range(
            answers,
            &txn,
            (Bound::Included(&from[..]), Bound::Excluded(&to[..])),
            &mut doomed,
        )?;
    }
    for k in &doomed {
        answers.delete(&mut txn, k).map_err(lmdb_err)?;
    }
    if doomed.is_empty() {
        txn.abort();
    } else {
        txn.commit().map_err(lmdb_err)?;
    }
    Ok(doomed.len())
}

fn collect_range(
    answers: Db,
    txn: &RoTxn,
    range: (Bound<&[u8]>, Bound<&[u8]>),
    out: &mut Vec<Vec<u8>>,
) -> FsResult<()> {
    for item in answers.range(txn, &range).map_err(lmdb_err)? {
        if out.len() >= EXPIRE_BATCH {
            break;
        }
        let (k, _) = item.map_err(lmdb_err)?;
        out.push(k.to_vec());
    }
    Ok(())
}

/// A member's view of how long its shard's generation of answers has
/// been current, on its monotonic clock: the generation is due to move on
/// once this member has seen it for the TTL. Starts afresh with the actor
/// (after a restart, or on a member that becomes leader, a generation
/// counts from when it was first seen here).
#[derive(Debug, Default)]
pub struct AnswerAge {
    seen: Option<(u32, Instant)>,
}

impl AnswerAge {
    /// Notes that the shard's generation is `generation` at `now`; returns
    /// whether it has been current here for at least `ttl`.
    pub fn due(&mut self, generation: u32, now: Instant, ttl: Duration) -> bool {
        match self.seen {
            Some((g, since)) if g == generation => now.duration_since(since) >= ttl,
            _ => {
                self.seen = Some((generation, now));
                false
            }
        }
    }
}

impl ShardStore {
    /// The shard's current generation of answers (0 before its first).
    pub fn answers_generation(&self, txn: &RoTxn) -> FsResult<u32> {
        Ok(read_generation(*self.answers, txn, self.shard as u8)?.unwrap_or(0))
    }

    /// Moves the shard's generation of answers on from `expect` (its
    /// leader's write once [`AnswerAge::due`]); a generation that moved on
    /// already is left alone, so a message sent twice moves it once.
    /// Returns the generation now.
    pub fn rotate_answers(&self, wtxn: &mut WriteTxn, expect: u32) -> FsResult<u32> {
        let now = self.answers_generation(wtxn)?;
        if now != expect {
            return Ok(now);
        }
        let next = now + 1;
        self.answers
            .put(wtxn, &generation_key(self.shard as u8), &next.to_be_bytes())
            .map_err(lmdb_err)?;
        Ok(next)
    }

    /// The answer recorded for call `req`, if this shard applied it.
    pub fn answered<T: DeserializeOwned>(&self, txn: &RoTxn, req: ReqId) -> FsResult<Option<T>> {
        let shard = self.shard as u8;
        let generation = self.answers_generation(txn)?;
        let mut found = self
            .answers
            .get(txn, &request_key(generation, shard, req))
            .map_err(lmdb_err)?;
        if found.is_none() && generation > 0 {
            found = self
                .answers
                .get(txn, &request_key(generation - 1, shard, req))
                .map_err(lmdb_err)?;
        }
        if found.is_none() && generation < 2 {
            found = self
                .answers
                .get(txn, &legacy_key(shard, req))
                .map_err(lmdb_err)?;
        }
        let Some(bytes) = found else {
            return Ok(None);
        };
        match bytes.split_first() {
            Some((&ANSWER_VERSION, payload)) => from_bytes("recorded answer", payload)
                .map(Some)
                .map_err(FsError::from),
            _ => Err(FsError::Corrupt(format!(
                "shard {}: the recorded answer of call {req:?} has an unknown version",
                self.shard
            ))),
        }
    }

    /// Records `answer` as the answer of call `req`, in the shard's current
    /// generation.
    pub fn record_answer<T: Serialize>(
        &self,
        wtxn: &mut WriteTxn,
        req: ReqId,
        answer: &T,
    ) -> FsResult<()> {
        let shard = self.shard as u8;
        let generation = match read_generation(*self.answers, wtxn, shard)? {
            Some(g) => g,
            None => {
                // The shard's first answer: its generation is written too,
                // so the expiry counts the shard (see `expire_answers`).
                self.answers
                    .put(wtxn, &generation_key(shard), &0u32.to_be_bytes())
                    .map_err(lmdb_err)?;
                0
            }
        };
        let mut value = vec![ANSWER_VERSION];
        value.extend(to_bytes("recorded answer", answer).map_err(FsError::from)?);
        self.answers
            .put(wtxn, &request_key(generation, shard, req), &value)
            .map_err(lmdb_err)
    }

    /// Deletes the expired answers of every shard of this store's
    /// environment (what each member's writer does every
    /// [`ANSWER_EXPIRY_EVERY`]).
    pub fn expire_answers(&self) -> FsResult<usize> {
        expire_answers(self.env(), self.answers_db())
    }

    /// The environment's table of answers (expired by its writer).
    pub fn answers_db(&self) -> Db {
        *self.answers
    }

    /// How many answers this shard keeps now.
    pub fn answers_kept(&self, txn: &RoTxn) -> FsResult<u64> {
        let mut n = 0;
        for item in self.answers.iter(txn).map_err(lmdb_err)? {
            let (k, _) = item.map_err(lmdb_err)?;
            if k.len() != 5 && answer_shard(k) == Some(self.shard as u8) {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// Whether `shard` is the shard of answers key `key` (see [`answer_shard`]).
pub(super) fn owns_answer(shard: ShardId, key: &[u8]) -> bool {
    answer_shard(key) == Some(shard as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_is_due_after_the_ttl_from_when_this_member_first_saw_it() {
        let ttl = Duration::from_secs(600);
        let t0 = Instant::now();
        let mut age = AnswerAge::default();
        assert!(!age.due(3, t0, ttl), "a generation first seen is not due");
        assert!(!age.due(3, t0 + ttl - Duration::from_secs(1), ttl));
        assert!(age.due(3, t0 + ttl, ttl));
        // Another member moved it on: counting starts again.
        assert!(!age.due(4, t0 + ttl, ttl));
        assert!(!age.due(4, t0 + ttl + Duration::from_secs(599), ttl));
        assert!(age.due(4, t0 + 2 * ttl, ttl));
    }

    #[test]
    fn keys_name_their_shard_in_every_layout() {
        let req = ReqId {
            at_ns: 1_800_000_000_000_000_000,
            nonce: 42,
        };
        assert_eq!(answer_shard(&request_key(7, 3, req)), Some(3));
        assert_eq!(answer_shard(&legacy_key(5, req)), Some(5));
        assert_eq!(answer_shard(&generation_key(9)), Some(9));
        assert_eq!(answer_shard(&[1, 2, 3]), None);
        // Old records sort between every generation's records and the
        // generations' keys.
        assert!(legacy_key(0, req)[0] >= LEGACY_FIRST_BYTE);
        assert!(request_key(u32::from(u16::MAX), 0, req)[..] < legacy_key(0, req)[..]);
        assert!(
            legacy_key(
                255,
                ReqId {
                    at_ns: i64::MAX,
                    nonce: u64::MAX
                }
            )[..]
                < generation_key(0)[..]
        );
    }
}

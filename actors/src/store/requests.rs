//! Records of answered mutations, so that a call made again (its answer was
//! lost when the shard's leader died, or it timed out) gets the answer of
//! the first attempt instead of being applied twice.
//!
//! A record is written in the transaction of the mutation it answers, so
//! it is in the shard's log (and on a majority of its members) exactly when
//! the mutation is; the new leader of a group applies every entry of earlier
//! terms before it takes a mutation, so it finds the record.
//!
//! Records live in their own table, `answers`, shared by the shards of an
//! environment and keyed by the call's time first: `at_ns ++ shard ++
//! nonce`. The records of concurrent calls therefore land on the same
//! last page whichever shard they are for, so a group commit writes one
//! more page, not one per shard (keyed by shard first, with the other
//! tables, they cost a third more page writes per create). Each member
//! deletes the records older than [`REQUEST_RECORD_TTL`] itself, every
//! [`ANSWER_EXPIRY_EVERY`], without logging the deletion: an expired record
//! is never asked for again, so when it goes (or comes back from the log
//! after a crash, to go again) changes no answer. For the same reason the
//! shard's digest leaves the records out.

use std::ops::Bound;
use std::time::Duration;

use heed::{Env, RoTxn, WithoutTls};
use serde::de::DeserializeOwned;
use serde::Serialize;

use curvine_messages::codec::{from_bytes, to_bytes};
use curvine_messages::{FsError, FsResult, ReqId};

use super::{lmdb_err, ShardStore};
use crate::txn::{Db, WriteTxn};

/// How long a mutation's answer is kept. A call is retried only within its
/// request timeout (`client.request_timeout`, 1 minute by default), so an
/// answer older than this is never asked for again.
pub const REQUEST_RECORD_TTL: Duration = Duration::from_secs(600);

/// How often a member deletes expired answers.
pub const ANSWER_EXPIRY_EVERY: Duration = Duration::from_secs(1);

/// Length of a request record's key.
pub(super) const REQUEST_KEY_LEN: usize = 17;

/// Where the shard byte sits in a request record's key.
pub(super) const REQUEST_KEY_SHARD_AT: usize = 8;

/// The version byte of a stored answer.
const ANSWER_VERSION: u8 = 1;

fn request_key(shard: u8, at_ns: i64, nonce: u64) -> [u8; REQUEST_KEY_LEN] {
    let mut k = [0u8; REQUEST_KEY_LEN];
    k[..8].copy_from_slice(&at_ns.max(0).to_be_bytes());
    k[REQUEST_KEY_SHARD_AT] = shard;
    k[9..].copy_from_slice(&nonce.to_be_bytes());
    k
}

/// Deletes the answers of every shard of `env` recorded for calls made
/// before `before_ns` (unlogged: see the module's comment). Returns how
/// many went.
pub fn expire_answers(env: &Env<WithoutTls>, answers: Db, before_ns: i64) -> FsResult<usize> {
    if before_ns <= 0 {
        return Ok(0);
    }
    let end = before_ns.to_be_bytes();
    let mut txn = env.write_txn().map_err(lmdb_err)?;
    let gone = answers
        .delete_range(&mut txn, &(Bound::Unbounded, Bound::Excluded(&end[..])))
        .map_err(lmdb_err)?;
    if gone > 0 {
        txn.commit().map_err(lmdb_err)?;
    } else {
        txn.abort();
    }
    Ok(gone)
}

impl ShardStore {
    fn request_key(&self, req: ReqId) -> [u8; REQUEST_KEY_LEN] {
        request_key(self.shard as u8, req.at_ns, req.nonce)
    }

    /// The answer recorded for call `req`, if this shard applied it.
    pub fn answered<T: DeserializeOwned>(&self, txn: &RoTxn, req: ReqId) -> FsResult<Option<T>> {
        let Some(bytes) = self
            .answers
            .get(txn, &self.request_key(req))
            .map_err(lmdb_err)?
        else {
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

    /// Records `answer` as the answer of call `req`.
    pub fn record_answer<T: Serialize>(
        &self,
        wtxn: &mut WriteTxn,
        req: ReqId,
        answer: &T,
    ) -> FsResult<()> {
        let mut value = vec![ANSWER_VERSION];
        value.extend(to_bytes("recorded answer", answer).map_err(FsError::from)?);
        self.answers
            .put(wtxn, &self.request_key(req), &value)
            .map_err(lmdb_err)
    }

    /// Deletes the answers of every shard of this store's environment
    /// recorded for calls made before `before_ns` (what each member's
    /// writer does every [`ANSWER_EXPIRY_EVERY`]).
    pub fn expire_answers(&self, before_ns: i64) -> FsResult<usize> {
        expire_answers(self.env, self.answers_db(), before_ns)
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
            if k.get(REQUEST_KEY_SHARD_AT) == Some(&(self.shard as u8)) {
                n += 1;
            }
        }
        Ok(n)
    }
}

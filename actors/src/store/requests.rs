//! Records of answered mutations, so that a call made again (its answer was
//! lost when the shard's leader died, or it timed out) gets the answer of
//! the first attempt instead of being applied twice.
//!
//! A record is written in the transaction of the mutation it answers, so
//! it is in the shard's log (and on a majority of its members) exactly when
//! the mutation is; the new leader of a group applies every entry of earlier
//! terms before it takes a mutation, so it finds the record. Records live in
//! the `ops` table under keys of their own length (step records are 9
//! bytes): `shard ++ 0xff ++ at_ns ++ nonce`, in time order, and each new
//! record deletes those older than [`REQUEST_RECORD_TTL`], so the table
//! holds about that long's worth of mutations.

use std::ops::Bound;
use std::time::Duration;

use heed::RoTxn;
use serde::de::DeserializeOwned;
use serde::Serialize;

use curvine_messages::codec::{from_bytes, to_bytes};
use curvine_messages::{FsError, FsResult, ReqId};

use super::{lmdb_err, ShardStore};
use crate::txn::WriteTxn;

/// How long a mutation's answer is kept. A call is retried only within its
/// request timeout (`client.request_timeout`, 1 minute by default), so an
/// answer older than this is never asked for again.
pub const REQUEST_RECORD_TTL: Duration = Duration::from_secs(600);

/// Length of a request record's key.
pub(super) const REQUEST_KEY_LEN: usize = 18;

/// The version byte of a stored answer.
const ANSWER_VERSION: u8 = 1;

fn request_key(shard: u8, at_ns: i64, nonce: u64) -> [u8; REQUEST_KEY_LEN] {
    let mut k = [0u8; REQUEST_KEY_LEN];
    k[0] = shard;
    k[1] = 0xff;
    k[2..10].copy_from_slice(&at_ns.max(0).to_be_bytes());
    k[10..].copy_from_slice(&nonce.to_be_bytes());
    k
}

impl ShardStore {
    fn request_key(&self, req: ReqId) -> [u8; REQUEST_KEY_LEN] {
        request_key(self.shard as u8, req.at_ns, req.nonce)
    }

    /// The answer recorded for call `req`, if this shard applied it.
    pub fn answered<T: DeserializeOwned>(&self, txn: &RoTxn, req: ReqId) -> FsResult<Option<T>> {
        let Some(bytes) = self
            .ops
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

    /// Records `answer` as the answer of call `req`, and deletes records
    /// older than [`REQUEST_RECORD_TTL`] (as of `now_ns`).
    pub fn record_answer<T: Serialize>(
        &self,
        wtxn: &mut WriteTxn,
        req: ReqId,
        answer: &T,
        now_ns: i64,
    ) -> FsResult<()> {
        let mut value = vec![ANSWER_VERSION];
        value.extend(to_bytes("recorded answer", answer).map_err(FsError::from)?);
        self.ops
            .put(wtxn, &self.request_key(req), &value)
            .map_err(lmdb_err)?;
        let shard = self.shard as u8;
        let before = now_ns - REQUEST_RECORD_TTL.as_nanos() as i64;
        let start = request_key(shard, 0, 0);
        let end = request_key(shard, before, 0);
        if before > 0 {
            self.ops
                .delete_range(
                    wtxn,
                    &(Bound::Included(&start[..]), Bound::Excluded(&end[..])),
                )
                .map_err(lmdb_err)?;
        }
        Ok(())
    }

    /// How many answers this shard keeps now.
    pub fn answers_kept(&self, txn: &RoTxn) -> FsResult<u64> {
        let shard = self.shard as u8;
        let start = request_key(shard, 0, 0);
        let end = request_key(shard, i64::MAX, u64::MAX);
        let mut n = 0;
        for item in self
            .ops
            .range(
                txn,
                &(Bound::Included(&start[..]), Bound::Included(&end[..])),
            )
            .map_err(lmdb_err)?
        {
            let (k, _) = item.map_err(lmdb_err)?;
            if k.len() == REQUEST_KEY_LEN {
                n += 1;
            }
        }
        Ok(n)
    }
}

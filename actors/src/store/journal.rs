//! Shard 0's UFS journal (changes to fs_mode mounts, replayed to the UFS)
//! and the records node services keep there (load jobs), both in its
//! `meta` table.

use std::ops::Bound;

use heed::RoTxn;

use crate::txn::WriteTxn;

use curvine_messages::codec::encode_versioned;
use curvine_messages::mount::{JournalEntry, UfsOp};
use curvine_messages::{now_ns, FsResult};

use super::{decode, lmdb_err, ShardStore};

/// Journal entries of fs_mode mounts: this prefix ++ sequence (big-endian).
pub(super) const JOURNAL_PREFIX: &[u8] = b"ufsj/";
pub(super) const JOURNAL_SEQ_KEY: &[u8] = b"ufsj_seq";
/// Records of node services (load jobs) kept in shard 0.
pub(super) const RECORD_PREFIX: &[u8] = b"rec/";

impl ShardStore {
    fn journal_check(&self) -> FsResult<()> {
        self.shard0_only("the UFS journal")
    }

    /// Appends `ops` to the journal; their replays join `trace`.
    pub fn journal_append(
        &self,
        wtxn: &mut WriteTxn,
        mount: u32,
        ops: &[UfsOp],
        trace: Option<curvine_messages::trace::TraceCtx>,
    ) -> FsResult<u64> {
        self.journal_check()?;
        let mut seq = match self.meta.get(wtxn, JOURNAL_SEQ_KEY).map_err(lmdb_err)? {
            Some(b) if b.len() == 8 => u64::from_be_bytes(b.try_into().expect("8 bytes")),
            _ => 0,
        };
        let now = now_ns();
        for op in ops {
            seq += 1;
            let entry = JournalEntry {
                seq,
                mount,
                op: op.clone(),
                at_ns: now,
                trace,
            };
            let mut key = JOURNAL_PREFIX.to_vec();
            key.extend_from_slice(&seq.to_be_bytes());
            self.meta
                .put(wtxn, &key, &encode_versioned(&entry))
                .map_err(lmdb_err)?;
        }
        self.meta
            .put(wtxn, JOURNAL_SEQ_KEY, &seq.to_be_bytes())
            .map_err(lmdb_err)?;
        Ok(seq)
    }

    pub fn record_put(&self, wtxn: &mut WriteTxn, entries: &[(Vec<u8>, Vec<u8>)]) -> FsResult<()> {
        self.journal_check()?;
        for (k, v) in entries {
            let mut key = RECORD_PREFIX.to_vec();
            key.extend_from_slice(k);
            if v.is_empty() {
                self.meta.delete(wtxn, &key).map_err(lmdb_err)?;
            } else {
                self.meta.put(wtxn, &key, v).map_err(lmdb_err)?;
            }
        }
        Ok(())
    }

    pub fn record_scan(
        &self,
        txn: &RoTxn,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> FsResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.journal_check()?;
        let mut full = RECORD_PREFIX.to_vec();
        full.extend_from_slice(prefix);
        let mut out = Vec::new();
        let start: Vec<u8> = match after {
            Some(a) => [RECORD_PREFIX, a].concat(),
            None => full.clone(),
        };
        let range = if after.is_some() {
            (Bound::Excluded(&start[..]), Bound::Unbounded)
        } else {
            (Bound::Included(&start[..]), Bound::Unbounded)
        };
        for item in self.meta.range(txn, &range).map_err(lmdb_err)? {
            let (k, v) = item.map_err(lmdb_err)?;
            if !k.starts_with(&full) {
                break;
            }
            let k = &k[RECORD_PREFIX.len()..];
            out.push((k.to_vec(), v.to_vec()));
            if out.len() >= limit as usize {
                break;
            }
        }
        Ok(out)
    }

    pub fn journal_read(&self, txn: &RoTxn, limit: u32) -> FsResult<Vec<JournalEntry>> {
        self.journal_check()?;
        let mut out = Vec::new();
        for item in self
            .meta
            .prefix_iter(txn, JOURNAL_PREFIX)
            .map_err(lmdb_err)?
        {
            let (_, v) = item.map_err(lmdb_err)?;
            out.push(decode(v)?);
            if out.len() >= limit as usize {
                break;
            }
        }
        Ok(out)
    }

    pub fn journal_trim(&self, wtxn: &mut WriteTxn, upto: u64) -> FsResult<()> {
        self.journal_check()?;
        let keys: Vec<Vec<u8>> = self
            .meta
            .prefix_iter(wtxn, JOURNAL_PREFIX)
            .map_err(lmdb_err)?
            .map(|item| item.map(|(k, _)| k.to_vec()).map_err(lmdb_err))
            .collect::<FsResult<_>>()?;
        for k in keys {
            let seq = u64::from_be_bytes(k[JOURNAL_PREFIX.len()..].try_into().unwrap_or([0xff; 8]));
            if seq <= upto {
                self.meta.delete(wtxn, &k).map_err(lmdb_err)?;
            } else {
                break;
            }
        }
        Ok(())
    }
}

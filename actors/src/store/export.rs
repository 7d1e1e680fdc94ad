//! Moving a shard: its records exported in chunks, imported into another
//! environment, and dropped from the one it leaves.

use std::ops::Bound;

use heed::RoTxn;

use crate::txn::{Table, WriteTxn};

use curvine_messages::shard::{ExportChunk, ShardRecord};
use curvine_messages::{FsError, FsResult};

use super::cluster::{MAP_KEY, MOUNTS_KEY};
use super::journal::{JOURNAL_PREFIX, JOURNAL_SEQ_KEY, RECORD_PREFIX};
use super::requests::owns_answer;
use super::{lmdb_err, ShardStore};

/// Tables in export order; their number is the table byte of a [`ShardRecord`].
const TABLE_COUNT: u8 = 13;

const OPS_TABLE: u8 = 5;

const ANSWERS_TABLE: u8 = 11;

impl ShardStore {
    fn table(&self, n: u8) -> Option<Table> {
        Some(match n {
            0 => self.meta,
            1 => self.inodes,
            2 => self.dentries,
            3 => self.xattrs,
            4 => self.intents,
            5 => self.ops,
            6 => self.locks,
            7 => self.blocks,
            8 => self.owners,
            9 => self.pending,
            10 => self.freed,
            11 => self.answers,
            12 => self.delegations,
            _ => return None,
        })
    }

    /// Whether a record of table `n` belongs to this shard. Keys of the
    /// data tables begin with an id whose top byte is the shard; `meta`
    /// holds the shard's record (and the cluster map on shard 0). Step
    /// records are keyed by operation, not shard, and all go along: a record
    /// is only ever read by the shard that applied its step, so extra ones
    /// are inert; recorded answers of calls carry their shard.
    fn owns_record(&self, n: u8, key: &[u8]) -> bool {
        match n {
            0 => {
                key == self.meta_key.as_slice()
                    || (self.shard == 0
                        && (key == MAP_KEY
                            || key == MOUNTS_KEY
                            || key == JOURNAL_SEQ_KEY
                            || key.starts_with(JOURNAL_PREFIX)
                            || key.starts_with(RECORD_PREFIX)))
            }
            OPS_TABLE => true,
            // Recorded answers of calls, and the shard's generation of
            // them, name their shard inside the key.
            ANSWERS_TABLE => owns_answer(self.shard, key),
            _ => key.first() == Some(&(self.shard as u8)),
        }
    }

    /// This shard's records from `from` on, up to about `max_bytes`.
    pub fn export(
        &self,
        txn: &RoTxn,
        from: Option<(u8, Vec<u8>)>,
        max_bytes: usize,
    ) -> FsResult<ExportChunk> {
        let (first_table, first_key) = from.unwrap_or((0, Vec::new()));
        let mut chunk = ExportChunk::default();
        let mut bytes = 0usize;
        for n in first_table..TABLE_COUNT {
            let db = self.table(n).expect("table number in range");
            let start: Vec<u8> = if n == first_table && !first_key.is_empty() {
                first_key.clone()
            } else if n == 0 || n == OPS_TABLE || n == ANSWERS_TABLE {
                Vec::new()
            } else {
                vec![self.shard as u8]
            };
            // LMDB refuses an empty key as a range start.
            let lower = if start.is_empty() {
                Bound::Unbounded
            } else {
                Bound::Included(start.as_slice())
            };
            for item in db
                .range(txn, &(lower, Bound::Unbounded))
                .map_err(lmdb_err)?
            {
                let (k, v) = item.map_err(lmdb_err)?;
                if n != 0
                    && n != OPS_TABLE
                    && n != ANSWERS_TABLE
                    && k.first() != Some(&(self.shard as u8))
                {
                    break;
                }
                if !self.owns_record(n, k) {
                    continue;
                }
                if bytes > 0 && bytes + k.len() + v.len() > max_bytes {
                    chunk.next = Some((n, k.to_vec()));
                    return Ok(chunk);
                }
                bytes += k.len() + v.len() + 8;
                chunk.records.push(ShardRecord {
                    table: n,
                    key: k.to_vec(),
                    value: v.to_vec(),
                });
            }
        }
        Ok(chunk)
    }

    /// What this copy of the shard holds, as of `txn`: the number of its
    /// records and a hash of them (FNV-1a over table, key and value, in
    /// key order), which two members of the shard's group agree on when
    /// they applied the same entries. Step records are left out (the `ops`
    /// table is shared by every shard of the environment), and so are
    /// recorded answers, which each member expires on its own clock.
    pub fn digest(&self, txn: &RoTxn) -> FsResult<(u64, u64)> {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
                hash = (hash ^ u64::from(*b)).wrapping_mul(PRIME);
            }
        };
        let mut records = 0u64;
        let mut from = None;
        loop {
            let chunk = self.export(txn, from, 4 << 20)?;
            for r in &chunk.records {
                if r.table == OPS_TABLE || r.table == ANSWERS_TABLE {
                    continue;
                }
                eat(&[r.table]);
                eat(&r.key);
                eat(&r.value);
                records += 1;
            }
            match chunk.next {
                Some(next) => from = Some(next),
                None => return Ok((records, hash)),
            }
        }
    }

    /// Every record of this shard, as of `txn` (a Raft snapshot's data).
    pub fn export_all(&self, txn: &RoTxn) -> FsResult<Vec<ShardRecord>> {
        Ok(self.export(txn, None, usize::MAX)?.records)
    }

    /// Writes exported records into this shard's tables.
    pub fn import(&self, wtxn: &mut WriteTxn, records: &[ShardRecord]) -> FsResult<()> {
        for r in records {
            let db = self.table(r.table).ok_or_else(|| {
                FsError::Protocol(format!("shard import names table {}", r.table))
            })?;
            if !self.owns_record(r.table, &r.key) {
                return Err(FsError::Protocol(format!(
                    "shard import for shard {} carries a record of another shard",
                    self.shard
                )));
            }
            db.put(wtxn, &r.key, &r.value).map_err(lmdb_err)?;
        }
        Ok(())
    }

    /// Deletes every record of this shard (step records stay: see `owns_record`).
    pub fn drop_all(&self, wtxn: &mut WriteTxn) -> FsResult<()> {
        self.meta.delete(wtxn, &self.meta_key).map_err(lmdb_err)?;
        if self.shard == 0 {
            self.meta.delete(wtxn, MAP_KEY).map_err(lmdb_err)?;
            self.meta.delete(wtxn, MOUNTS_KEY).map_err(lmdb_err)?;
            self.meta.delete(wtxn, JOURNAL_SEQ_KEY).map_err(lmdb_err)?;
            for prefix in [JOURNAL_PREFIX, RECORD_PREFIX] {
                let keys: Vec<Vec<u8>> = self
                    .meta
                    .prefix_iter(wtxn, prefix)
                    .map_err(lmdb_err)?
                    .map(|item| item.map(|(k, _)| k.to_vec()).map_err(lmdb_err))
                    .collect::<FsResult<_>>()?;
                for k in keys {
                    self.meta.delete(wtxn, &k).map_err(lmdb_err)?;
                }
            }
        }
        let start = [self.shard as u8];
        let end = (self.shard as u8).checked_add(1).map(|e| [e]);
        let range = (
            Bound::Included(&start[..]),
            match &end {
                Some(e) => Bound::Excluded(&e[..]),
                None => Bound::Unbounded,
            },
        );
        let answers: Vec<Vec<u8>> = self
            .answers
            .iter(wtxn)
            .map_err(lmdb_err)?
            .filter_map(|item| match item {
                Ok((k, _)) if self.owns_record(ANSWERS_TABLE, k) => Some(Ok(k.to_vec())),
                Ok(_) => None,
                Err(e) => Some(Err(lmdb_err(e))),
            })
            .collect::<FsResult<_>>()?;
        for k in answers {
            self.answers.delete(wtxn, &k).map_err(lmdb_err)?;
        }
        for n in 1..TABLE_COUNT {
            if n != OPS_TABLE && n != ANSWERS_TABLE {
                let db = self.table(n).expect("table number in range");
                db.delete_range(wtxn, &range).map_err(lmdb_err)?;
            }
        }
        Ok(())
    }
}

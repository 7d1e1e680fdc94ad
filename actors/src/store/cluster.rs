//! Shard 0's cluster-wide records in its `meta` table: the cluster map and
//! the mount table, each replaced whole by compare-and-set on its version
//! (`compare_and_set`).

use heed::RoTxn;

use crate::txn::WriteTxn;

use curvine_messages::cluster::ClusterMap;
use curvine_messages::codec::{encode_versioned, Versioned};
use curvine_messages::mount::MountTable;
use curvine_messages::{FsError, FsResult};

use super::{decode, lmdb_err, ShardStore};

/// The key of the cluster map in shard 0's `meta` table.
pub(super) const MAP_KEY: &[u8] = b"cluster_map";
pub(super) const MOUNTS_KEY: &[u8] = b"mount_table";

impl ShardStore {
    /// Fails unless this is shard 0, which holds `what`.
    pub(super) fn shard0_only(&self, what: &str) -> FsResult<()> {
        if self.shard != 0 {
            return Err(FsError::InvalidArgument(format!(
                "{what} lives in shard 0, not shard {}",
                self.shard
            )));
        }
        Ok(())
    }

    /// The record at `key` of the `meta` table, if any.
    fn shard0_record<T: Versioned>(&self, txn: &RoTxn, key: &[u8]) -> FsResult<Option<T>> {
        match self.meta.get(txn, key).map_err(lmdb_err)? {
            Some(bytes) => Ok(Some(decode(bytes)?)),
            None => Ok(None),
        }
    }

    /// Stores `new` at `key` of the `meta` table when the stored record's
    /// `version` (0 before the first) is `expect` and `new`'s is higher, and
    /// returns it; otherwise returns what `conflict` makes of the stored
    /// record and its version.
    fn compare_and_set<T: Versioned + Clone>(
        &self,
        wtxn: &mut WriteTxn,
        key: &[u8],
        expect: u64,
        new: &T,
        version: impl Fn(&T) -> u64,
        conflict: impl FnOnce(Option<T>, u64) -> FsResult<T>,
    ) -> FsResult<T> {
        let current: Option<T> = self.shard0_record(wtxn, key)?;
        let stored = current.as_ref().map(&version).unwrap_or(0);
        if stored != expect || version(new) <= stored {
            return conflict(current, stored);
        }
        self.meta
            .put(wtxn, key, &encode_versioned(new))
            .map_err(lmdb_err)?;
        Ok(new.clone())
    }

    /// The cluster map stored here (shard 0).
    pub fn cluster_map(&self, txn: &RoTxn) -> FsResult<Option<ClusterMap>> {
        self.shard0_record(txn, MAP_KEY)
    }

    /// At node start, before any writer runs: the stored cluster map, or
    /// `first` written as the first one when there is none.
    pub fn init_cluster_map(&self, first: Option<&ClusterMap>) -> FsResult<Option<ClusterMap>> {
        let txn = self.read_txn()?;
        if let Some(map) = self.cluster_map(&txn)? {
            return Ok(Some(map));
        }
        drop(txn);
        let Some(first) = first else {
            return Ok(None);
        };
        let stored = self.write_now(|s, wtxn| s.set_cluster_map(wtxn, 0, first))?;
        Ok(Some(stored))
    }

    /// Stores `map` when the stored version is `expect`; returns what is stored after.
    pub fn set_cluster_map(
        &self,
        wtxn: &mut WriteTxn,
        expect: u64,
        map: &ClusterMap,
    ) -> FsResult<ClusterMap> {
        self.shard0_only("the cluster map")?;
        if map.shards.len() != self.shard_count as usize {
            return Err(FsError::InvalidArgument(format!(
                "a cluster map names {} shards; the cluster has {}",
                map.shards.len(),
                self.shard_count
            )));
        }
        let version = |m: &ClusterMap| m.version;
        self.compare_and_set(wtxn, MAP_KEY, expect, map, version, |current, version| {
            current.ok_or_else(|| {
                FsError::Busy(format!(
                    "the cluster map changed (version {version}, expected {expect})"
                ))
            })
        })
    }

    /// The mount table stored here (shard 0); empty before the first mount.
    pub fn mounts(&self, txn: &RoTxn) -> FsResult<MountTable> {
        Ok(self.shard0_record(txn, MOUNTS_KEY)?.unwrap_or_default())
    }

    /// Stores `table` when the stored version is `expect`; returns what is
    /// stored after (the winner, for a caller that lost a race).
    pub fn set_mounts(
        &self,
        wtxn: &mut WriteTxn,
        expect: u64,
        table: &MountTable,
    ) -> FsResult<MountTable> {
        self.shard0_only("the mount table")?;
        let version = |t: &MountTable| t.version;
        self.compare_and_set(wtxn, MOUNTS_KEY, expect, table, version, |_, version| {
            Err(FsError::Busy(format!(
                "the mount table changed (version {version}, expected {expect}); try again"
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ShardIdentity, StoreOptions};

    fn open(dir: &std::path::Path, shard: u16) -> ShardStore {
        let identity = ShardIdentity {
            cluster_id: "c1".into(),
            shard,
            shard_count: 2,
        };
        let options = StoreOptions {
            map_size: 16 << 20,
            max_readers: 8,
            sync_commit: false,
            wal: false,
            wal_size: 0,
            checkpoint_interval: std::time::Duration::ZERO,
            replica_id: 1,
        };
        let engine = crate::engine::Engine::open(&dir.join(format!("s{shard}")), &options).unwrap();
        ShardStore::open(&engine, &identity).unwrap()
    }

    fn is_busy<T: std::fmt::Debug>(r: FsResult<T>, message: &str) -> bool {
        matches!(r, Err(FsError::Busy(m)) if m == message)
    }

    fn is_invalid<T: std::fmt::Debug>(r: FsResult<T>, message: &str) -> bool {
        matches!(r, Err(FsError::InvalidArgument(m)) if m == message)
    }

    /// The cluster map: a stale writer gets the stored map back (an error
    /// only while there is none), and only shard 0 with the cluster's shard
    /// count takes one.
    #[test]
    fn the_cluster_map_is_compare_and_set() {
        let dir = tempfile::tempdir().unwrap();
        let (s0, s1) = (open(dir.path(), 0), open(dir.path(), 1));
        let map = ClusterMap::single("n1", 2);
        assert!(is_busy(
            s0.write_now(|s, t| s.set_cluster_map(t, 5, &map)),
            "the cluster map changed (version 0, expected 5)"
        ));
        assert_eq!(
            s0.write_now(|s, t| s.set_cluster_map(t, 0, &map)),
            Ok(map.clone())
        );
        let next = map.with_owner(1, "n2");
        assert_eq!(
            s0.write_now(|s, t| s.set_cluster_map(t, 0, &next)),
            Ok(map.clone())
        );
        assert_eq!(
            s0.write_now(|s, t| s.set_cluster_map(t, 1, &map)),
            Ok(map.clone())
        );
        assert_eq!(
            s0.write_now(|s, t| s.set_cluster_map(t, 1, &next)),
            Ok(next.clone())
        );
        assert_eq!(
            s0.read_txn().and_then(|t| s0.cluster_map(&t)),
            Ok(Some(next.clone()))
        );
        assert!(is_invalid(
            s0.write_now(|s, t| s.set_cluster_map(t, 2, &ClusterMap::single("n1", 3))),
            "a cluster map names 3 shards; the cluster has 2"
        ));
        assert!(is_invalid(
            s1.write_now(|s, t| s.set_cluster_map(t, 0, &ClusterMap::single("n1", 3))),
            "the cluster map lives in shard 0, not shard 1"
        ));
        assert_eq!(s1.read_txn().and_then(|t| s1.cluster_map(&t)), Ok(None));
    }

    /// The mount table: a stale writer is refused, and only shard 0 takes one.
    #[test]
    fn the_mount_table_is_compare_and_set() {
        let dir = tempfile::tempdir().unwrap();
        let (s0, s1) = (open(dir.path(), 0), open(dir.path(), 1));
        assert_eq!(
            s0.read_txn().and_then(|t| s0.mounts(&t)),
            Ok(MountTable::default())
        );
        let first = MountTable {
            version: 1,
            next_id: 7,
            ..Default::default()
        };
        assert_eq!(
            s0.write_now(|s, t| s.set_mounts(t, 0, &first)),
            Ok(first.clone())
        );
        assert!(is_busy(
            s0.write_now(|s, t| s.set_mounts(t, 0, &first)),
            "the mount table changed (version 1, expected 0); try again"
        ));
        assert!(is_busy(
            s0.write_now(|s, t| s.set_mounts(t, 1, &first)),
            "the mount table changed (version 1, expected 1); try again"
        ));
        assert_eq!(s0.read_txn().and_then(|t| s0.mounts(&t)), Ok(first));
        assert!(is_invalid(
            s1.write_now(|s, t| s.set_mounts(t, 0, &MountTable::default())),
            "the mount table lives in shard 0, not shard 1"
        ));
        assert!(is_invalid(
            s1.read_txn().and_then(|t| s1.journal_read(&t, 1)),
            "the UFS journal lives in shard 0, not shard 1"
        ));
    }
}

//! Shard 0's cluster-wide records in its `meta` table: the cluster map and
//! the mount table, each replaced whole by compare-and-set on its version.

use heed::RoTxn;

use crate::txn::WriteTxn;

use curvine_messages::cluster::ClusterMap;
use curvine_messages::codec::encode_versioned;
use curvine_messages::mount::MountTable;
use curvine_messages::{FsError, FsResult};

use super::{decode, lmdb_err, ShardStore};

/// The key of the cluster map in shard 0's `meta` table.
pub(super) const MAP_KEY: &[u8] = b"cluster_map";
pub(super) const MOUNTS_KEY: &[u8] = b"mount_table";

impl ShardStore {
    /// The cluster map stored here (shard 0).
    pub fn cluster_map(&self, txn: &RoTxn) -> FsResult<Option<ClusterMap>> {
        match self.meta.get(txn, MAP_KEY).map_err(lmdb_err)? {
            Some(bytes) => Ok(Some(decode(bytes)?)),
            None => Ok(None),
        }
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
        if self.shard != 0 {
            return Err(FsError::InvalidArgument(format!(
                "the cluster map lives in shard 0, not shard {}",
                self.shard
            )));
        }
        if map.shards.len() != self.shard_count as usize {
            return Err(FsError::InvalidArgument(format!(
                "a cluster map names {} shards; the cluster has {}",
                map.shards.len(),
                self.shard_count
            )));
        }
        let current = self.cluster_map(wtxn)?;
        let version = current.as_ref().map(|m| m.version).unwrap_or(0);
        if version != expect || map.version <= version {
            return current.ok_or_else(|| {
                FsError::Busy(format!(
                    "the cluster map changed (version {version}, expected {expect})"
                ))
            });
        }
        self.meta
            .put(wtxn, MAP_KEY, &encode_versioned(map))
            .map_err(lmdb_err)?;
        Ok(map.clone())
    }

    /// The mount table stored here (shard 0); empty before the first mount.
    pub fn mounts(&self, txn: &RoTxn) -> FsResult<MountTable> {
        match self.meta.get(txn, MOUNTS_KEY).map_err(lmdb_err)? {
            Some(bytes) => decode(bytes),
            None => Ok(MountTable::default()),
        }
    }

    /// Stores `table` when the stored version is `expect`; returns what is
    /// stored after (the winner, for a caller that lost a race).
    pub fn set_mounts(
        &self,
        wtxn: &mut WriteTxn,
        expect: u64,
        table: &MountTable,
    ) -> FsResult<MountTable> {
        if self.shard != 0 {
            return Err(FsError::InvalidArgument(format!(
                "the mount table lives in shard 0, not shard {}",
                self.shard
            )));
        }
        let current = self.mounts(wtxn)?;
        if current.version != expect || table.version <= current.version {
            return Err(FsError::Busy(format!(
                "the mount table changed (version {}, expected {expect}); try again",
                current.version
            )));
        }
        self.meta
            .put(wtxn, MOUNTS_KEY, &encode_versioned(table))
            .map_err(lmdb_err)?;
        Ok(table.clone())
    }
}

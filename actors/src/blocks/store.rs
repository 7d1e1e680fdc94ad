//! The node's block files in their tiers and the LMDB index of them: paths,
//! index records, reconciliation at open, and tier accounting.

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use heed::types::Bytes;
use heed::{Database, Env, WithoutTls};
use parking_lot::Mutex;

use curvine_messages::block::{BlockId, BlockRecord, TierKind, TierStats};
use curvine_messages::codec::{decode_versioned, encode_versioned};
use curvine_messages::{now_ns, FsError, FsResult};

use super::{human, io_err};

/// A configured tier.
#[derive(Debug, Clone)]
pub struct TierInfo {
    pub kind: TierKind,
    pub root: PathBuf,
    pub capacity: u64,
}

pub(super) struct Tier {
    pub(super) info: TierInfo,
    pub(super) used: AtomicU64,
    pub(super) reserved: AtomicU64,
    pub(super) blocks: AtomicU64,
}

impl Tier {
    pub(super) fn free(&self) -> u64 {
        self.info.capacity.saturating_sub(
            self.used.load(Ordering::Relaxed) + self.reserved.load(Ordering::Relaxed),
        )
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "tier {} ({}): {} of {} in use",
            self.info.kind,
            self.info.root.display(),
            human(self.used.load(Ordering::Relaxed) + self.reserved.load(Ordering::Relaxed)),
            human(self.info.capacity)
        )
    }
}

/// The node's block files and their index. Reads (the data port) use it
/// directly; every change goes through the [`BlockManager`](super::BlockManager).
pub struct BlockStore {
    env: &'static Env<WithoutTls>,
    db: Database<'static, Bytes, Bytes>,
    pub(super) tiers: Vec<Tier>,
    sync_blocks: bool,
    /// Last reads not yet written to the index.
    accessed: Mutex<HashMap<BlockId, i64>>,
    /// Checksum mismatches found by this node (bytes received from writers,
    /// blocks read for a move).
    pub checksum_errors: AtomicU64,
}

/// What [`BlockStore::open`] found on disk.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reconciled {
    pub blocks: u64,
    /// Index records whose file was gone (dropped).
    pub missing: u64,
    /// Renames finished for blocks committed just before a crash.
    pub finished: u64,
    /// Temporary files of interrupted writes and moves (deleted).
    pub temporary: u64,
    /// Block files the index did not know (deleted).
    pub unindexed: u64,
}

impl BlockStore {
    /// Opens the index in `index_dir` and the tiers, and reconciles them.
    pub fn open(
        index_dir: &Path,
        tiers: Vec<TierInfo>,
        sync_blocks: bool,
    ) -> FsResult<(BlockStore, Reconciled)> {
        if tiers.is_empty() {
            return Err(FsError::InvalidArgument(
                "a node needs at least one tier".into(),
            ));
        }
        fs::create_dir_all(index_dir).map_err(|e| io_err(index_dir.display(), e))?;
        for t in &tiers {
            for sub in ["blocks", "tmp"] {
                let dir = t.root.join(sub);
                fs::create_dir_all(&dir).map_err(|e| {
                    io_err(format!("tier {} directory {}", t.kind, dir.display()), e)
                })?;
            }
        }
        let options = crate::store::StoreOptions {
            wal: false,
            wal_size: 0,
            checkpoint_interval: std::time::Duration::ZERO,
            replica_id: 1,
            map_size: 4 << 30,
            max_readers: 254,
            sync_commit: true,
        };
        let env = crate::store::open_env(index_dir, &options)?;
        let wtxn = env.write_txn().map_err(crate::store::lmdb_err)?;
        let db = match env
            .create_databases_and_commit(wtxn, |opener, wtxn| -> Result<_, heed::Error> {
                let db = opener.create_database::<Bytes, Bytes>(wtxn, Some("blocks"))?;
                Ok(heed::CommitOrAbort::<_, ()>::Commit([db]))
            })
            .map_err(crate::store::lmdb_err)?
        {
            heed::CommitOrAbort::Commit([db]) => db,
            heed::CommitOrAbort::Abort(()) => {
                return Err(FsError::Io("cannot create the block index".into()))
            }
        };
        let store = BlockStore {
            env,
            db,
            tiers: tiers
                .into_iter()
                .map(|info| Tier {
                    info,
                    used: AtomicU64::new(0),
                    reserved: AtomicU64::new(0),
                    blocks: AtomicU64::new(0),
                })
                .collect(),
            sync_blocks,
            accessed: Mutex::new(HashMap::new()),
            checksum_errors: AtomicU64::new(0),
        };
        let report = store.reconcile()?;
        Ok((store, report))
    }

    pub fn tier_count(&self) -> usize {
        self.tiers.len()
    }

    pub fn tier_kind(&self, tier: usize) -> TierKind {
        self.tiers[tier].info.kind
    }

    pub fn block_path(&self, tier: usize, id: BlockId) -> PathBuf {
        self.tiers[tier]
            .info
            .root
            .join("blocks")
            .join(format!("{:02x}", id & 0xff))
            .join(format!("{id:016x}"))
    }

    pub fn tmp_path(&self, tier: usize, id: BlockId) -> PathBuf {
        self.tiers[tier]
            .info
            .root
            .join("tmp")
            .join(format!("{id:016x}"))
    }

    /// Makes a block written in place (short-circuit) durable before its
    /// commit: fsyncs its temporary file when its tier syncs blocks.
    pub fn sync_written(&self, id: BlockId) -> FsResult<()> {
        for tier in 0..self.tiers.len() {
            let tmp = self.tmp_path(tier, id);
            if self.syncs(tier) && tmp.exists() {
                File::open(&tmp)
                    .and_then(|f| f.sync_data())
                    .map_err(|e| io_err(tmp.display(), e))?;
            }
        }
        Ok(())
    }

    /// Whether block files of the first tier of `kind` are fsynced before commit.
    pub fn syncs_kind(&self, kind: TierKind) -> bool {
        self.sync_blocks && kind != TierKind::Mem
    }

    /// Whether block files of a tier are fsynced before commit.
    pub fn syncs(&self, tier: usize) -> bool {
        self.sync_blocks && self.tiers[tier].info.kind != TierKind::Mem
    }

    fn index_key(id: BlockId) -> [u8; 8] {
        id.to_be_bytes()
    }

    /// The index record of a block.
    pub fn get(&self, id: BlockId) -> FsResult<Option<BlockRecord>> {
        let txn = self.env.read_txn().map_err(crate::store::lmdb_err)?;
        match self
            .db
            .get(&txn, &Self::index_key(id))
            .map_err(crate::store::lmdb_err)?
        {
            Some(v) => Ok(Some(decode_versioned(v)?)),
            None => Ok(None),
        }
    }

    /// A block's record and file path, or ENOENT naming the block.
    pub fn locate(&self, id: BlockId) -> FsResult<(BlockRecord, PathBuf)> {
        let record = self
            .get(id)?
            .ok_or_else(|| FsError::NotFound(format!("block {id:#x} is not on this node")))?;
        let path = self.block_path(record.tier as usize, id);
        Ok((record, path))
    }

    /// Notes a read of a block (written to the index by the next tick).
    pub fn touch(&self, id: BlockId) {
        self.accessed.lock().insert(id, now_ns());
    }

    pub(super) fn put(&self, id: BlockId, record: &BlockRecord) -> FsResult<()> {
        let mut wtxn = self.env.write_txn().map_err(crate::store::lmdb_err)?;
        self.db
            .put(&mut wtxn, &Self::index_key(id), &encode_versioned(record))
            .map_err(crate::store::lmdb_err)?;
        wtxn.commit().map_err(crate::store::lmdb_err)
    }

    pub(super) fn delete(&self, id: BlockId) -> FsResult<()> {
        let mut wtxn = self.env.write_txn().map_err(crate::store::lmdb_err)?;
        self.db
            .delete(&mut wtxn, &Self::index_key(id))
            .map_err(crate::store::lmdb_err)?;
        wtxn.commit().map_err(crate::store::lmdb_err)
    }

    /// Every block with its record.
    pub fn all(&self) -> FsResult<Vec<(BlockId, BlockRecord)>> {
        let txn = self.env.read_txn().map_err(crate::store::lmdb_err)?;
        let mut out = Vec::new();
        for item in self.db.iter(&txn).map_err(crate::store::lmdb_err)? {
            let (k, v) = item.map_err(crate::store::lmdb_err)?;
            let id = u64::from_be_bytes(
                k.try_into()
                    .map_err(|_| FsError::Corrupt("short key in block index".into()))?,
            );
            out.push((id, decode_versioned(v)?));
        }
        Ok(out)
    }

    pub(super) fn flush_access(&self) -> FsResult<()> {
        let accessed: Vec<(BlockId, i64)> = self.accessed.lock().drain().collect();
        if accessed.is_empty() {
            return Ok(());
        }
        let mut wtxn = self.env.write_txn().map_err(crate::store::lmdb_err)?;
        for (id, at) in accessed {
            let key = Self::index_key(id);
            let current = self.db.get(&wtxn, &key).map_err(crate::store::lmdb_err)?;
            if let Some(v) = current {
                let mut record: BlockRecord = decode_versioned(v)?;
                record.last_access_ns = record.last_access_ns.max(at);
                self.db
                    .put(&mut wtxn, &key, &encode_versioned(&record))
                    .map_err(crate::store::lmdb_err)?;
            }
        }
        wtxn.commit().map_err(crate::store::lmdb_err)
    }

    /// Brings the index and the tier directories into agreement (see the
    /// module documentation) and counts each tier's usage.
    fn reconcile(&self) -> FsResult<Reconciled> {
        let mut report = Reconciled::default();
        let mut known: HashMap<PathBuf, ()> = HashMap::new();
        for (id, record) in self.all()? {
            let tier = record.tier as usize;
            if tier >= self.tiers.len() || self.tiers[tier].info.kind != record.kind {
                tracing::warn!(
                    block = id,
                    "block index names a tier this node no longer has; dropping the record"
                );
                self.delete(id)?;
                report.missing += 1;
                continue;
            }
            let path = self.block_path(tier, id);
            let tmp = self.tmp_path(tier, id);
            let have = fs::metadata(&path).map(|m| m.len()).ok();
            let ok = match have {
                Some(len) if len >= record.len => true,
                _ => match fs::metadata(&tmp).map(|m| m.len()) {
                    Ok(len) if len >= record.len => {
                        if let Some(dir) = path.parent() {
                            fs::create_dir_all(dir).map_err(|e| io_err(dir.display(), e))?;
                        }
                        fs::rename(&tmp, &path).map_err(|e| io_err(path.display(), e))?;
                        report.finished += 1;
                        true
                    }
                    _ => false,
                },
            };
            if !ok {
                tracing::warn!(block = id, path = %path.display(), "block file missing or short; dropping it from the index");
                self.delete(id)?;
                report.missing += 1;
                continue;
            }
            known.insert(path, ());
            let t = &self.tiers[tier];
            t.used.fetch_add(record.len, Ordering::Relaxed);
            t.blocks.fetch_add(1, Ordering::Relaxed);
            report.blocks += 1;
        }
        for tier in &self.tiers {
            for entry in read_dir_all(&tier.info.root.join("tmp"))? {
                let _ = fs::remove_file(&entry);
                report.temporary += 1;
            }
            for sub in read_dir_all(&tier.info.root.join("blocks"))? {
                if !sub.is_dir() {
                    continue;
                }
                for file in read_dir_all(&sub)? {
                    if !known.contains_key(&file) {
                        tracing::warn!(path = %file.display(), "block file not in the index; removing it");
                        let _ = fs::remove_file(&file);
                        report.unindexed += 1;
                    }
                }
            }
        }
        Ok(report)
    }

    /// Deletes every temporary block file (writes and moves in progress).
    /// Called when a BlockManager starts: a new one has no reservations, so
    /// no temporary file can be committed any more.
    pub fn clear_tmp(&self) -> u64 {
        let mut n = 0;
        for tier in &self.tiers {
            for entry in read_dir_all(&tier.info.root.join("tmp")).unwrap_or_default() {
                if fs::remove_file(&entry).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }

    pub fn stats(&self) -> Vec<TierStats> {
        self.tiers
            .iter()
            .map(|t| TierStats {
                kind: t.info.kind,
                path: t.info.root.display().to_string(),
                capacity: t.info.capacity,
                used: t.used.load(Ordering::Relaxed),
                reserved: t.reserved.load(Ordering::Relaxed),
                blocks: t.blocks.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Fraction of a tier in use or reserved.
    pub fn usage(&self, tier: usize) -> f64 {
        let t = &self.tiers[tier];
        (t.used.load(Ordering::Relaxed) + t.reserved.load(Ordering::Relaxed)) as f64
            / t.info.capacity.max(1) as f64
    }

    pub fn capacity(&self, tier: usize) -> u64 {
        self.tiers[tier].info.capacity
    }
}

fn read_dir_all(dir: &Path) -> FsResult<Vec<PathBuf>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries.filter_map(|e| e.ok().map(|e| e.path())).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_err(dir.display(), e)),
    }
}

pub(super) fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

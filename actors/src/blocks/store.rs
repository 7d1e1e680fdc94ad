//! The node's block files in their tiers and the LMDB indexes of them:
//! paths, index records, reconciliation at open, and tier accounting.
//!
//! The records of blocks in disk tiers are committed with sync into the
//! node's data directory; each MEM tier keeps its records in an index of
//! its own beside its blocks (`ROOT/index`), on the tier's file system, so
//! that they live exactly as long as the blocks (a tmpfs empties at a
//! machine restart and keeps both across a restart of the node) and a
//! block's commit there writes nothing to disk. A block is recorded in the
//! index of its tier alone; opening the store moves records written where
//! an earlier version kept them, and keeps the first record of a block
//! found in two indexes (a move between tiers cut off by a crash).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use heed::types::Bytes;
use heed::{Database, Env, WithoutTls};
use parking_lot::Mutex;

use curvine_messages::block::{BlockId, BlockRecord, TierKind, TierStats};
use curvine_messages::codec::{decode_versioned, encode_versioned};
use curvine_messages::{now_ns, FsError, FsResult};

use super::holds::{HeldFiles, ReadHolds};
use super::io_err;
use crate::store::lmdb_err;

pub(super) use super::tier::Tier;
pub use super::tier::TierInfo;

/// The node's block files and their index. Reads (the data port) use it
/// directly; every change goes through the [`BlockManager`](super::BlockManager).
pub struct BlockStore {
    /// The environments holding block records: the node's own first (in
    /// its data directory, for disk tiers), then one per MEM tier.
    indexes: Vec<Index>,
    /// Which of `indexes` holds the records of each tier.
    index_of: Vec<usize>,
    pub(super) tiers: Vec<Tier>,
    sync_blocks: bool,
    /// Last reads not yet written to the index.
    accessed: Mutex<HashMap<BlockId, i64>>,
    /// Checksum mismatches found by this node (bytes received from writers,
    /// blocks read for a move).
    pub checksum_errors: AtomicU64,
    /// Extent files and how many indexed blocks each still holds.
    pub(super) extents: Mutex<HashMap<u64, ExtentUse>>,
    next_extent: AtomicU64,
    /// Blocks being written into an extent file (a run): tier and extent.
    pub(super) in_runs: Mutex<HashMap<BlockId, (usize, u64)>>,
    /// The blocks open readers of this node's clients hold.
    pub holds: Arc<ReadHolds>,
    /// Removed files still open somewhere (see `holds`).
    held_files: HeldFiles,
}

/// An extent file's size and live blocks. Its bytes count as used
/// until its last block goes, when the file goes: a block removed from it
/// keeps its bytes, so a reader that opened the file (a mount passing the
/// file through) keeps reading what it opened, as with a block file of its
/// own that was unlinked.
/// An extent that blocks are still being written into (a run) lives
/// while they do, whatever leaves it meanwhile.
#[derive(Debug, Clone, Copy)]
pub(super) struct ExtentUse {
    pub(super) size: u64,
    pub(super) live: u32,
    /// Blocks being written into it (not committed yet).
    pub(super) writing: u32,
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
            for sub in ["blocks", "tmp", "extents"] {
                let dir = t.root.join(sub);
                fs::create_dir_all(&dir).map_err(|e| {
                    io_err(format!("tier {} directory {}", t.kind, dir.display()), e)
                })?;
            }
        }
        // A MEM tier's records live beside its blocks, on its own file
        // system: they go when the blocks go (a machine restart empties a
        // tmpfs), and a synced commit there costs no disk write. Records
        // of disk tiers are synced into the node's data directory.
        let own = Index::open(index_dir)?;
        let store_id = own.own_store_id()?;
        let mut indexes = vec![own];
        let mut index_of = Vec::with_capacity(tiers.len());
        for t in &tiers {
            if t.kind != TierKind::Mem {
                index_of.push(0);
                continue;
            }
            let dir = t.root.join("index");
            let at = match indexes.iter().position(|i| i.dir == dir) {
                Some(at) => at,
                None => {
                    let index = Index::open(&dir)?;
                    index.adopt(&store_id)?;
                    indexes.push(index);
                    indexes.len() - 1
                }
            };
            index_of.push(at);
        }
        let store = BlockStore {
            indexes,
            index_of,
            tiers: tiers
                .into_iter()
                .map(|info| Tier {
                    info,
                    used: AtomicU64::new(0),
                    reserved: AtomicU64::new(0),
                    blocks: AtomicU64::new(0),
                    held: AtomicU64::new(0),
                })
                .collect(),
            sync_blocks,
            accessed: Mutex::new(HashMap::new()),
            checksum_errors: AtomicU64::new(0),
            extents: Mutex::new(HashMap::new()),
            next_extent: AtomicU64::new(now_ns() as u64),
            in_runs: Mutex::new(HashMap::new()),
            holds: Arc::new(ReadHolds::new(Duration::from_secs(3600))),
            held_files: HeldFiles::default(),
        };
        let report = store.reconcile()?;
        Ok((store, report))
    }

    /// The tiers of kind `want` (every tier without one), fastest first.
    pub(super) fn tiers_of(&self, want: Option<TierKind>) -> Vec<usize> {
        (0..self.tiers.len())
            .filter(|&t| want.is_none_or(|k| self.tiers[t].info.kind == k))
            .collect()
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

    pub fn extent_path(&self, tier: usize, extent: u64) -> PathBuf {
        self.tiers[tier]
            .info
            .root
            .join("extents")
            .join(format!("{extent:016x}"))
    }

    /// The file holding a block's bytes: its own, or its extent file (at
    /// [`BlockRecord::offset`]).
    pub fn file_of(&self, id: BlockId, record: &BlockRecord) -> PathBuf {
        match record.extent {
            Some(e) => self.extent_path(record.tier as usize, e.id),
            None => self.block_path(record.tier as usize, id),
        }
    }

    /// A new extent id, and its temporary file in `tier`.
    pub(super) fn new_extent(&self, tier: usize) -> (u64, PathBuf) {
        loop {
            let id = self.next_extent.fetch_add(1, Ordering::Relaxed);
            if !self.extent_path(tier, id).exists() && !self.extents.lock().contains_key(&id) {
                return (id, self.extent_tmp(tier, id));
            }
        }
    }

    /// The temporary file of extent `id` being filled in `tier`.
    pub(super) fn extent_tmp(&self, tier: usize, id: u64) -> PathBuf {
        self.tiers[tier]
            .info
            .root
            .join("tmp")
            .join(format!("extent-{id:016x}"))
    }

    /// Counts a new extent file of `live` blocks in `tier`.
    pub(super) fn add_extent(&self, tier: usize, extent: u64, size: u64, live: u32) {
        self.extents.lock().insert(
            extent,
            ExtentUse {
                size,
                live,
                writing: 0,
            },
        );
        let t = &self.tiers[tier];
        t.used.fetch_add(size, Ordering::Relaxed);
        t.blocks.fetch_add(live as u64, Ordering::Relaxed);
    }

    /// A block's bytes are no longer indexed where `record` says: its own
    /// file goes, or its extent counts one block less (and goes with its
    /// last). Tier usage follows.
    pub(super) fn release_file(&self, id: BlockId, record: &BlockRecord) {
        let tier = record.tier as usize;
        let t = &self.tiers[tier];
        t.blocks.fetch_sub(1, Ordering::Relaxed);
        let Some(e) = record.extent else {
            self.drop_file(tier, &self.block_path(tier, id), record.len);
            return;
        };
        let mut extents = self.extents.lock();
        let Some(u) = extents.get_mut(&e.id) else {
            return;
        };
        u.live = u.live.saturating_sub(1);
        if u.live == 0 && u.writing == 0 {
            let size = u.size;
            extents.remove(&e.id);
            drop(extents);
            self.drop_file(tier, &self.extent_path(tier, e.id), size);
        }
    }

    /// Unlinks a block or extent file whose `size` bytes count in `tier`:
    /// they are free at once, or, while a process still holds the file
    /// open, once it closes it (held meanwhile; see [`Self::reclaim_held`]).
    fn drop_file(&self, tier: usize, path: &Path, size: u64) {
        let t = &self.tiers[tier];
        let ours = File::open(path);
        let _ = fs::remove_file(path);
        if let Ok(file) = ours {
            if self.held_files.keep_if_open(file, tier, size) {
                t.held.fetch_add(size, Ordering::Relaxed);
                return;
            }
        }
        t.used.fetch_sub(size, Ordering::Relaxed);
    }

    /// Frees the bytes of removed files their last holder closed since;
    /// returns how many.
    pub fn reclaim_held(&self) -> u64 {
        if self.held_files.is_empty() {
            return 0;
        }
        let mut total = 0;
        for (tier, size) in self.held_files.released() {
            let t = &self.tiers[tier];
            t.held.fetch_sub(size, Ordering::Relaxed);
            t.used.fetch_sub(size, Ordering::Relaxed);
            total += size;
        }
        total
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
        if let Some((tier, extent)) = self.in_runs.lock().get(&id).copied() {
            if !self.syncs(tier) {
                return Ok(());
            }
            let path = self.extent_path(tier, extent);
            return File::open(&path)
                .and_then(|f| f.sync_data())
                .map_err(|e| io_err(path.display(), e));
        }
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

    /// The index record of a block.
    pub fn get(&self, id: BlockId) -> FsResult<Option<BlockRecord>> {
        // MEM tiers' indexes first: they hold the blocks read most.
        for index in self.indexes.iter().rev() {
            if let Some(record) = index.get(id)? {
                return Ok(Some(record));
            }
        }
        Ok(None)
    }

    /// A block's record and the path of the file holding it (its bytes
    /// start at [`BlockRecord::offset`]), or ENOENT naming the block.
    pub fn locate(&self, id: BlockId) -> FsResult<(BlockRecord, PathBuf)> {
        let record = self
            .get(id)?
            .ok_or_else(|| FsError::NotFound(format!("block {id:#x} is not on this node")))?;
        let path = self.file_of(id, &record);
        Ok((record, path))
    }

    /// Notes a read of a block (written to the index by the next tick).
    pub fn touch(&self, id: BlockId) {
        self.accessed.lock().insert(id, now_ns());
    }

    /// Records a block in the index of its tier, and only there (a block
    /// moved between tiers leaves the index of its old one).
    pub(super) fn put(&self, id: BlockId, record: &BlockRecord) -> FsResult<()> {
        let home = self.index_of[record.tier as usize];
        self.indexes[home].put(id, record)?;
        for (at, index) in self.indexes.iter().enumerate() {
            if at != home && index.get(id)?.is_some() {
                index.delete(id)?;
            }
        }
        Ok(())
    }

    pub(super) fn delete(&self, id: BlockId) -> FsResult<()> {
        for index in &self.indexes {
            if index.get(id)?.is_some() {
                index.delete(id)?;
            }
        }
        Ok(())
    }

    /// Every block with its record.
    pub fn all(&self) -> FsResult<Vec<(BlockId, BlockRecord)>> {
        let mut out = Vec::new();
        for index in &self.indexes {
            out.extend(index.all()?);
        }
        Ok(out)
    }

    pub(super) fn flush_access(&self) -> FsResult<()> {
        let accessed: Vec<(BlockId, i64)> = self.accessed.lock().drain().collect();
        if accessed.is_empty() {
            return Ok(());
        }
        for index in &self.indexes {
            index.record_access(&accessed)?;
        }
        Ok(())
    }

    /// Brings the index and the tier directories into agreement (see the
    /// module documentation) and counts each tier's usage.
    fn reconcile(&self) -> FsResult<Reconciled> {
        let mut report = Reconciled::default();
        let mut known: HashMap<PathBuf, ()> = HashMap::new();
        let mut seen: HashSet<BlockId> = HashSet::new();
        let mut moving = Vec::new();
        let mut records = Vec::new();
        for (at, index) in self.indexes.iter().enumerate() {
            records.extend(index.all()?.into_iter().map(|(id, r)| (at, id, r)));
        }
        for (at, id, record) in records {
            let index = &self.indexes[at];
            let tier = record.tier as usize;
            if tier >= self.tiers.len() || self.tiers[tier].info.kind != record.kind {
                tracing::warn!(
                    block = id,
                    "block index names a tier this node no longer has; dropping the record"
                );
                index.delete(id)?;
                report.missing += 1;
                continue;
            }
            if !seen.insert(id) {
                // A move between tiers cut off by a crash: the block's
                // first record stands, this copy's file goes as unindexed.
                index.delete(id)?;
                continue;
            }
            let home = self.index_of[tier];
            if home != at {
                // Written where its tier's records were kept before: it
                // moves to the index of its tier (below, all at once).
                moving.push((at, home, id, record.clone()));
            }
            if let Some(e) = record.extent {
                let path = self.extent_path(tier, e.id);
                match fs::metadata(&path) {
                    Ok(m) if m.len() >= e.offset + record.len => {
                        let mut extents = self.extents.lock();
                        let u = extents.entry(e.id).or_insert_with(|| {
                            self.tiers[tier].used.fetch_add(m.len(), Ordering::Relaxed);
                            ExtentUse {
                                size: m.len(),
                                live: 0,
                                writing: 0,
                            }
                        });
                        u.live += 1;
                        known.insert(path, ());
                        self.tiers[tier].blocks.fetch_add(1, Ordering::Relaxed);
                        report.blocks += 1;
                    }
                    _ => {
                        tracing::warn!(block = id, path = %path.display(), "extent file missing or short; dropping the block from the index");
                        moving.retain(|m| m.2 != id);
                        index.delete(id)?;
                        report.missing += 1;
                    }
                }
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
                moving.retain(|m| m.2 != id);
                index.delete(id)?;
                report.missing += 1;
                continue;
            }
            known.insert(path, ());
            let t = &self.tiers[tier];
            t.used.fetch_add(record.len, Ordering::Relaxed);
            t.blocks.fetch_add(1, Ordering::Relaxed);
            report.blocks += 1;
        }
        // Each index's arrivals in one commit, then its departures.
        for (at, index) in self.indexes.iter().enumerate() {
            if moving.iter().any(|m| m.1 == at) {
                index.put_all(moving.iter().filter(|m| m.1 == at).map(|m| (m.2, &m.3)))?;
            }
        }
        for (at, index) in self.indexes.iter().enumerate() {
            if moving.iter().any(|m| m.0 == at) {
                index.delete_all(moving.iter().filter(|m| m.0 == at).map(|m| m.2))?;
            }
        }
        for tier in &self.tiers {
            for entry in read_dir_all(&tier.info.root.join("tmp"))? {
                let _ = fs::remove_file(&entry);
                report.temporary += 1;
            }
            for file in read_dir_all(&tier.info.root.join("extents"))? {
                if !known.contains_key(&file) {
                    tracing::warn!(path = %file.display(), "extent file holding no indexed block; removing it");
                    let _ = fs::remove_file(&file);
                    report.unindexed += 1;
                }
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
                held: t.held.load(Ordering::Relaxed),
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

/// One LMDB environment of block records, committed with sync.
struct Index {
    dir: PathBuf,
    env: Env<WithoutTls>,
    db: Database<'static, Bytes, Bytes>,
    /// Which store the index belongs to (`STORE_KEY`).
    meta: Database<'static, Bytes, Bytes>,
}

/// The key, in an index's `meta` database, of the random id of the node's
/// store: set once in the node's own index, copied into each MEM tier's.
const STORE_KEY: &[u8] = b"store";

fn key(id: BlockId) -> [u8; 8] {
    id.to_be_bytes()
}

impl Index {
    fn open(dir: &Path) -> FsResult<Index> {
        let options = crate::store::StoreOptions {
            wal: false,
            wal_size: 0,
            checkpoint_interval: std::time::Duration::ZERO,
            replica_id: 1,
            map_size: 4 << 30,
            max_readers: 254,
            sync_commit: true,
        };
        let (env, _) = crate::engine::open_env(dir, &options, Default::default())?;
        let wtxn = env.write_txn().map_err(lmdb_err)?;
        let (db, meta) = match env
            .create_databases_and_commit(wtxn, |opener, wtxn| -> Result<_, heed::Error> {
                let db = opener.create_database::<Bytes, Bytes>(wtxn, Some("blocks"))?;
                let meta = opener.create_database::<Bytes, Bytes>(wtxn, Some("meta"))?;
                Ok(heed::CommitOrAbort::<_, ()>::Commit([db, meta]))
            })
            .map_err(lmdb_err)?
        {
            heed::CommitOrAbort::Commit([db, meta]) => (db, meta),
            heed::CommitOrAbort::Abort(()) => {
                return Err(FsError::Io(format!(
                    "cannot create the block index in {}",
                    dir.display()
                )))
            }
        };
        Ok(Index {
            dir: dir.to_path_buf(),
            env,
            db,
            meta,
        })
    }

    /// The id of the store this index belongs to, if it has one.
    fn store_id(&self) -> FsResult<Option<Vec<u8>>> {
        let txn = self.env.read_txn().map_err(lmdb_err)?;
        Ok(self
            .meta
            .get(&txn, STORE_KEY)
            .map_err(lmdb_err)?
            .map(<[u8]>::to_vec))
    }

    /// The node's own index: its store id, made at its first open.
    fn own_store_id(&self) -> FsResult<Vec<u8>> {
        if let Some(id) = self.store_id()? {
            return Ok(id);
        }
        let id: [u8; 16] = rand::random();
        let mut wtxn = self.env.write_txn().map_err(lmdb_err)?;
        self.meta.put(&mut wtxn, STORE_KEY, &id).map_err(lmdb_err)?;
        wtxn.commit().map_err(lmdb_err)?;
        Ok(id.to_vec())
    }

    /// Makes a MEM tier's index one of the store `id`: records it holds for
    /// another store (a node whose data directory was lost, on a tier that
    /// kept its files) are dropped, and their files go as unindexed.
    fn adopt(&self, id: &[u8]) -> FsResult<()> {
        if self.store_id()?.as_deref() == Some(id) {
            return Ok(());
        }
        let mut wtxn = self.env.write_txn().map_err(lmdb_err)?;
        let dropped = self.db.len(&wtxn).map_err(lmdb_err)?;
        if dropped > 0 {
            tracing::warn!(index = %self.dir.display(), blocks = dropped, "the tier's block index belongs to another store (the node's data directory was replaced); dropping its records");
        }
        self.db.clear(&mut wtxn).map_err(lmdb_err)?;
        self.meta.put(&mut wtxn, STORE_KEY, id).map_err(lmdb_err)?;
        wtxn.commit().map_err(lmdb_err)
    }

    fn get(&self, id: BlockId) -> FsResult<Option<BlockRecord>> {
        let txn = self.env.read_txn().map_err(lmdb_err)?;
        match self.db.get(&txn, &key(id)).map_err(lmdb_err)? {
            Some(v) => Ok(Some(decode_versioned(v)?)),
            None => Ok(None),
        }
    }

    fn put(&self, id: BlockId, record: &BlockRecord) -> FsResult<()> {
        self.put_all([(id, record)])
    }

    fn delete(&self, id: BlockId) -> FsResult<()> {
        self.delete_all([id])
    }

    /// Records blocks in one commit.
    fn put_all<'a>(
        &self,
        records: impl IntoIterator<Item = (BlockId, &'a BlockRecord)>,
    ) -> FsResult<()> {
        let mut wtxn = self.env.write_txn().map_err(lmdb_err)?;
        for (id, record) in records {
            self.db
                .put(&mut wtxn, &key(id), &encode_versioned(record))
                .map_err(lmdb_err)?;
        }
        wtxn.commit().map_err(lmdb_err)
    }

    /// Forgets blocks in one commit.
    fn delete_all(&self, ids: impl IntoIterator<Item = BlockId>) -> FsResult<()> {
        let mut wtxn = self.env.write_txn().map_err(lmdb_err)?;
        for id in ids {
            self.db.delete(&mut wtxn, &key(id)).map_err(lmdb_err)?;
        }
        wtxn.commit().map_err(lmdb_err)
    }

    fn all(&self) -> FsResult<Vec<(BlockId, BlockRecord)>> {
        let txn = self.env.read_txn().map_err(lmdb_err)?;
        let mut out = Vec::new();
        for item in self.db.iter(&txn).map_err(lmdb_err)? {
            let (k, v) = item.map_err(lmdb_err)?;
            let id = u64::from_be_bytes(k.try_into().map_err(|_| {
                FsError::Corrupt(format!(
                    "short key in the block index in {}",
                    self.dir.display()
                ))
            })?);
            out.push((id, decode_versioned(v)?));
        }
        Ok(out)
    }

    /// Moves the last-access times of the blocks this index holds forward.
    fn record_access(&self, accessed: &[(BlockId, i64)]) -> FsResult<()> {
        let mut wtxn = None;
        for &(id, at) in accessed {
            let txn = match &mut wtxn {
                Some(txn) => txn,
                None => {
                    // No write (and no synced commit) for an index that
                    // holds none of them.
                    if self.get(id)?.is_none() {
                        continue;
                    }
                    wtxn.insert(self.env.write_txn().map_err(lmdb_err)?)
                }
            };
            let current = self.db.get(txn, &key(id)).map_err(lmdb_err)?;
            if let Some(v) = current {
                let mut record: BlockRecord = decode_versioned(v)?;
                record.last_access_ns = record.last_access_ns.max(at);
                self.db
                    .put(txn, &key(id), &encode_versioned(&record))
                    .map_err(lmdb_err)?;
            }
        }
        match wtxn {
            Some(txn) => txn.commit().map_err(lmdb_err),
            None => Ok(()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use curvine_messages::block::ExtentRef;

    fn tiers(dir: &Path) -> Vec<TierInfo> {
        vec![
            TierInfo {
                kind: TierKind::Mem,
                root: dir.join("mem"),
                capacity: 64 << 20,
            },
            TierInfo {
                kind: TierKind::Hdd,
                root: dir.join("hdd"),
                capacity: 64 << 20,
            },
        ]
    }

    fn open(dir: &Path) -> (BlockStore, Reconciled) {
        BlockStore::open(&dir.join("index"), tiers(dir), true).unwrap()
    }

    /// A committed block of `len` bytes in `tier`: its file and its record.
    fn block(store: &BlockStore, tier: usize, id: BlockId, len: usize) -> BlockRecord {
        let path = store.block_path(tier, id);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, vec![7u8; len]).unwrap();
        BlockRecord {
            tier: tier as u8,
            kind: store.tier_kind(tier),
            len: len as u64,
            crcs: vec![0],
            created_ns: 1,
            last_access_ns: 1,
            extent: None,
        }
    }

    #[test]
    fn an_extent_file_lives_until_its_last_block_goes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = open(dir.path());
        let one = block(&store, 0, 1, 100);
        let two = block(&store, 0, 2, 50);
        store.put(1, &one).unwrap();
        store.put(2, &two).unwrap();
        drop(store);
        let (store, _) = open(dir.path());
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (150, 2));
        // Blocks 1 and 2 laid out at 0 and 100 in an extent file.
        let (id, tmp) = store.new_extent(0);
        fs::write(&tmp, [vec![7u8; 100], vec![7u8; 50]].concat()).unwrap();
        let path = store.extent_path(0, id);
        fs::rename(&tmp, &path).unwrap();
        for (bid, rec, offset) in [(1, &one, 0), (2, &two, 100)] {
            let moved = BlockRecord {
                extent: Some(ExtentRef { id, offset }),
                ..rec.clone()
            };
            store.put(bid, &moved).unwrap();
        }
        store.add_extent(0, id, 150, 2);
        store.release_file(1, &one);
        store.release_file(2, &two);
        assert!(!store.block_path(0, 1).exists() && path.exists());
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (150, 2));
        let (rec, at) = store.locate(2).unwrap();
        assert_eq!((at, rec.offset()), (path.clone(), 100));
        // Opening again counts the extent once, with its two blocks, and
        // removes an extent file no record names.
        let stray = store.extent_path(0, id + 1000);
        fs::write(&stray, b"x").unwrap();
        drop(store);
        let (store, report) = open(dir.path());
        assert_eq!((report.blocks, report.unindexed), (2, 1), "{report:?}");
        assert!(!stray.exists());
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (150, 2));
        // A block leaving the extent keeps its bytes there (a reader that
        // opened the file keeps reading them); the last one takes the file.
        let first = store.get(1).unwrap().unwrap();
        store.delete(1).unwrap();
        store.release_file(1, &first);
        assert!(path.exists());
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (150, 1));
        let second = store.get(2).unwrap().unwrap();
        store.delete(2).unwrap();
        store.release_file(2, &second);
        assert!(!path.exists());
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (0, 0));
    }

    #[test]
    fn an_extent_file_cut_short_drops_its_blocks_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = open(dir.path());
        let (id, _) = store.new_extent(0);
        fs::write(store.extent_path(0, id), vec![7u8; 60]).unwrap();
        let rec = BlockRecord {
            extent: Some(ExtentRef { id, offset: 50 }),
            ..block(&store, 0, 4, 20)
        };
        fs::remove_file(store.block_path(0, 4)).unwrap();
        store.put(4, &rec).unwrap();
        drop(store);
        let (store, report) = open(dir.path());
        assert_eq!(
            (report.blocks, report.missing, report.unindexed),
            (0, 1, 1),
            "{report:?}"
        );
        assert_eq!(store.get(4).unwrap(), None);
        assert_eq!(store.stats()[0].used, 0);
    }

    #[test]
    fn a_mem_tier_keeps_its_records_beside_its_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = open(dir.path());
        let mem = block(&store, 0, 1, 10);
        store.put(1, &mem).unwrap();
        let hdd = block(&store, 1, 2, 20);
        store.put(2, &hdd).unwrap();
        assert_eq!(store.indexes.len(), 2);
        assert_eq!(store.indexes[1].dir, dir.path().join("mem/index"));
        assert_eq!(store.indexes[1].all().unwrap(), vec![(1, mem.clone())]);
        assert_eq!(store.indexes[0].all().unwrap(), vec![(2, hdd.clone())]);
        assert_eq!(store.get(1).unwrap(), Some(mem.clone()));
        assert_eq!(store.get(2).unwrap(), Some(hdd));
        // A block moved to the disk tier leaves the MEM tier's index.
        let moved = BlockRecord {
            tier: 1,
            kind: TierKind::Hdd,
            ..mem
        };
        store.put(1, &moved).unwrap();
        assert!(store.indexes[1].all().unwrap().is_empty());
        assert_eq!(store.get(1).unwrap(), Some(moved));
        store.delete(1).unwrap();
        assert_eq!(store.get(1).unwrap(), None);
        // Reads are recorded in whichever index holds the block.
        store.touch(2);
        store.flush_access().unwrap();
        assert!(store.get(2).unwrap().unwrap().last_access_ns > 1);
    }

    #[test]
    fn opening_moves_records_into_their_tiers_index_and_drops_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = open(dir.path());
        // Where an earlier version kept a MEM block's record: the node's index.
        let old = block(&store, 0, 5, 10);
        store.indexes[0].put(5, &old).unwrap();
        // A move from MEM to disk cut off between its two records.
        let from = block(&store, 0, 6, 30);
        store.indexes[1].put(6, &from).unwrap();
        let to = block(&store, 1, 6, 30);
        store.indexes[0].put(6, &to).unwrap();
        // Opened again as a restarted node opens it (the old one closed).
        drop(store);
        let (store, report) = open(dir.path());
        assert_eq!((report.blocks, report.unindexed), (2, 1), "{report:?}");
        assert_eq!(store.indexes[1].all().unwrap(), vec![(5, old.clone())]);
        assert_eq!(store.indexes[0].all().unwrap(), vec![(6, to.clone())]);
        assert!(store.block_path(0, 5).exists());
        assert!(store.block_path(1, 6).exists() && !store.block_path(0, 6).exists());
        let stats = store.stats();
        assert_eq!((stats[0].used, stats[1].used), (10, 30));
    }

    #[test]
    fn a_mem_tier_outliving_its_nodes_data_directory_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = BlockStore::open(&dir.path().join("a"), tiers(dir.path()), true).unwrap();
        let mem = block(&store, 0, 3, 10);
        store.put(3, &mem).unwrap();
        drop(store);
        // The same tiers under a new data directory (the old one was lost):
        // the MEM tier's blocks belong to no file of the new store.
        let (store, report) =
            BlockStore::open(&dir.path().join("b"), tiers(dir.path()), true).unwrap();
        assert_eq!((report.blocks, report.unindexed), (0, 1), "{report:?}");
        assert_eq!(store.get(3).unwrap(), None);
        assert!(!store.block_path(0, 3).exists());
    }
}

//! Block storage of a node: tiers of block files, their LMDB index, the
//! `BlockManager` actor that changes both, and a `TierEvictor` per tier.
//!
//! Layout of a tier directory:
//!
//! ```text
//! <tier>/blocks/<xx>/<id as 16 hex digits>   committed blocks (xx: low byte of the id)
//! <tier>/tmp/<id as 16 hex digits>           blocks being written or moved
//! ```
//!
//! A block is written to `tmp`, then committed: its record goes into the
//! index (LMDB, synced), then the file takes its final name. A restart
//! finishes renames the index already records and deletes every other
//! temporary file, so a block is either in the index with its file, or gone.
//! Committed block files never change; a move writes a copy in the other
//! tier, switches the index, then unlinks the old file. A reader that opened
//! the old file keeps reading the same bytes (the unlinked inode lives while
//! open); a new open finds the new path through the index.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use heed::types::Bytes;
use heed::{Database, Env, WithoutTls};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use curvine_messages::block::{
    block_crc, units, verify_units, BlockId, BlockMsg, BlockRecord, BlockUse, FreeSummary,
    MovePlan, Reservation, TierKind, TierStats, CHECKSUM_UNIT,
};
use curvine_messages::codec::{decode_versioned, encode_versioned};
use curvine_messages::{now_ns, shard_of, FsError, FsResult, ShardId};

use crate::namespace::Namespace;
use crate::stats::{ActorStats, Metrics};

/// A configured tier.
#[derive(Debug, Clone)]
pub struct TierInfo {
    pub kind: TierKind,
    pub root: PathBuf,
    pub capacity: u64,
}

struct Tier {
    info: TierInfo,
    used: AtomicU64,
    reserved: AtomicU64,
    blocks: AtomicU64,
}

impl Tier {
    fn free(&self) -> u64 {
        self.info.capacity.saturating_sub(
            self.used.load(Ordering::Relaxed) + self.reserved.load(Ordering::Relaxed),
        )
    }

    fn describe(&self) -> String {
        format!(
            "tier {} ({}): {} of {} in use",
            self.info.kind,
            self.info.root.display(),
            human(self.used.load(Ordering::Relaxed) + self.reserved.load(Ordering::Relaxed)),
            human(self.info.capacity)
        )
    }
}

pub use curvine_messages::human_bytes as human;

fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> FsError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        FsError::NoSpace(format!("{what}: {e}"))
    } else {
        FsError::Io(format!("{what}: {e}"))
    }
}

/// The node's block files and their index. Reads (the data port) use it
/// directly; every change goes through the [`BlockManager`].
pub struct BlockStore {
    env: &'static Env<WithoutTls>,
    db: Database<'static, Bytes, Bytes>,
    tiers: Vec<Tier>,
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

    fn put(&self, id: BlockId, record: &BlockRecord) -> FsResult<()> {
        let mut wtxn = self.env.write_txn().map_err(crate::store::lmdb_err)?;
        self.db
            .put(&mut wtxn, &Self::index_key(id), &encode_versioned(record))
            .map_err(crate::store::lmdb_err)?;
        wtxn.commit().map_err(crate::store::lmdb_err)
    }

    fn delete(&self, id: BlockId) -> FsResult<()> {
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

    fn flush_access(&self) -> FsResult<()> {
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

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

// ---- the BlockManager actor -------------------------------------------------

/// The node's current BlockManager. Its supervisor replaces the reference
/// when it restarts the actor, so holders never call a dead actor for long.
#[derive(Clone, Default)]
pub struct BlockManagerRef {
    actor: Arc<Mutex<Option<ActorRef<BlockMsg>>>>,
    /// The node's tracer, for the spans of traced calls.
    pub tracer: Arc<std::sync::OnceLock<crate::trace::Tracer>>,
}

impl BlockManagerRef {
    pub fn set(&self, actor: Option<ActorRef<BlockMsg>>) {
        *self.actor.lock() = actor;
    }

    pub fn get(&self) -> FsResult<ActorRef<BlockMsg>> {
        self.actor
            .lock()
            .clone()
            .ok_or_else(|| FsError::Unavailable("the block manager is restarting".into()))
    }

    /// Calls the block manager, retrying briefly while it restarts.
    pub async fn call<T: Send + 'static>(
        &self,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> BlockMsg + Send + Sync,
    ) -> FsResult<T> {
        // In a traced request the call is a span of the block manager's,
        // timed here (its queueing and handling together).
        let kind = std::sync::OnceLock::new();
        let build = |reply| {
            let msg = build(reply);
            let _ = kind.set(msg.kind_name());
            msg
        };
        let ctx = crate::trace::current();
        let started = ctx.map(|_| now_ns());
        let result = self.call_untimed(&build).await;
        if let (Some(ctx), Some(start)) = (ctx, started) {
            if let Some(tracer) = self.tracer.get() {
                tracer.record_span(
                    ctx,
                    "block-manager",
                    kind.get().copied().unwrap_or("call"),
                    start,
                    crate::trace::outcome_of(&result),
                );
            }
        }
        result
    }

    async fn call_untimed<T: Send + 'static>(
        &self,
        build: &(impl Fn(RpcReplyPort<FsResult<T>>) -> BlockMsg + Send + Sync),
    ) -> FsResult<T> {
        let mut delay = Duration::from_millis(5);
        for attempt in 0..8 {
            let result = match self.get() {
                Ok(actor) => match actor.call(build, Some(Duration::from_secs(60))).await {
                    Ok(ractor::rpc::CallResult::Success(r)) => r,
                    Ok(ractor::rpc::CallResult::Timeout) => {
                        return Err(FsError::TimedOut("the block manager did not answer".into()))
                    }
                    _ => Err(FsError::Unavailable(
                        "the block manager stopped while handling the request".into(),
                    )),
                },
                Err(e) => Err(e),
            };
            match result {
                Err(FsError::Unavailable(_)) if attempt < 7 => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                other => return other,
            }
        }
        Err(FsError::Unavailable(
            "the block manager is restarting".into(),
        ))
    }

    pub fn cast(&self, message: BlockMsg) {
        if let Ok(actor) = self.get() {
            let _ = actor.cast(message);
        }
    }
}

/// Settings of the block manager and its evictors.
#[derive(Debug, Clone)]
pub struct BlockConf {
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub evict_interval: Duration,
    pub orphan_grace: Duration,
    /// How often freed blocks are collected and orphans looked for.
    pub tick: Duration,
}

#[derive(Clone)]
pub struct BlockArgs {
    pub store: Arc<BlockStore>,
    pub namespace: Arc<Namespace>,
    pub conf: BlockConf,
}

struct Reserved {
    tier: usize,
    size: u64,
    since: Instant,
}

pub struct BlockManager;

pub struct BlockState {
    args: BlockArgs,
    stats: Arc<ActorStats>,
    reservations: HashMap<BlockId, Reserved>,
    /// Blocks being moved: target tier and bytes reserved there.
    moving: HashMap<BlockId, (usize, u64)>,
    evictors: Vec<ActorRef<EvictMsg>>,
    /// A sweep of freed blocks or orphans is running.
    sweeping: Arc<std::sync::atomic::AtomicBool>,
    last_orphan_check: Instant,
}

fn answer<T>(reply: RpcReplyPort<FsResult<T>>, value: FsResult<T>) {
    let _ = reply.send(value);
}

impl BlockState {
    fn store(&self) -> &BlockStore {
        &self.args.store
    }

    fn reserve(
        &mut self,
        block: BlockId,
        want: Option<TierKind>,
        size: u64,
    ) -> FsResult<Reservation> {
        if let Some(r) = self.reservations.get(&block) {
            return Ok(Reservation {
                tier: self.store().tier_kind(r.tier),
                path: self.store().tmp_path(r.tier, block).display().to_string(),
            });
        }
        let store = &self.args.store;
        let candidates: Vec<usize> = (0..store.tier_count())
            .filter(|&t| want.is_none_or(|k| store.tiers[t].info.kind == k))
            .collect();
        if candidates.is_empty() {
            return Err(FsError::InvalidArgument(format!(
                "this node has no {} tier",
                want.map(|k| k.name()).unwrap_or("storage")
            )));
        }
        let Some(&tier) = candidates.iter().find(|&&t| store.tiers[t].free() >= size) else {
            let t = &store.tiers[candidates[0]];
            return Err(FsError::NoSpace(format!(
                "{}, no room for a block of {}{}; blocks that are the only copy of their data are never dropped",
                t.describe(),
                human(size),
                if candidates.len() > 1 { " in any tier" } else { "" }
            )));
        };
        store.tiers[tier]
            .reserved
            .fetch_add(size, Ordering::Relaxed);
        self.reservations.insert(
            block,
            Reserved {
                tier,
                size,
                since: Instant::now(),
            },
        );
        if store.usage(tier) > self.args.conf.high_watermark {
            if let Some(e) = self.evictors.get(tier) {
                let _ = e.cast(EvictMsg::Check);
            }
        }
        Ok(Reservation {
            tier: store.tier_kind(tier),
            path: store.tmp_path(tier, block).display().to_string(),
        })
    }

    fn release(&mut self, block: BlockId) -> Option<usize> {
        let r = self.reservations.remove(&block)?;
        self.store().tiers[r.tier]
            .reserved
            .fetch_sub(r.size, Ordering::Relaxed);
        Some(r.tier)
    }

    fn commit(&mut self, block: BlockId, len: u64, crcs: Vec<u32>) -> FsResult<u32> {
        let Some(r) = self.reservations.get(&block) else {
            return Err(FsError::InvalidArgument(format!(
                "block {block:#x} is not being written on this node"
            )));
        };
        let tier = r.tier;
        if crcs.len() != units(len) {
            return Err(FsError::InvalidArgument(format!(
                "block {block:#x}: {} checksums for {len} bytes (expected {})",
                crcs.len(),
                units(len)
            )));
        }
        let store = self.args.store.clone();
        let tmp = store.tmp_path(tier, block);
        let on_disk = fs::metadata(&tmp)
            .map_err(|e| io_err(format!("block {block:#x} file {}", tmp.display()), e))?
            .len();
        if on_disk != len {
            return Err(FsError::InvalidArgument(format!(
                "block {block:#x}: the writer reports {len} bytes but its file holds {on_disk}"
            )));
        }
        let crc = block_crc(&crcs);
        let now = now_ns();
        let record = BlockRecord {
            tier: tier as u8,
            kind: store.tier_kind(tier),
            len,
            crcs,
            created_ns: now,
            last_access_ns: now,
        };
        store.put(block, &record)?;
        let path = store.block_path(tier, block);
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        fs::create_dir_all(&dir).map_err(|e| io_err(dir.display(), e))?;
        fs::rename(&tmp, &path).map_err(|e| io_err(path.display(), e))?;
        if store.syncs(tier) {
            sync_dir(&dir);
        }
        self.release(block);
        let t = &store.tiers[tier];
        t.used.fetch_add(len, Ordering::Relaxed);
        t.blocks.fetch_add(1, Ordering::Relaxed);
        Ok(crc)
    }

    fn abort(&mut self, block: BlockId) {
        if let Some(tier) = self.release(block) {
            let _ = fs::remove_file(self.store().tmp_path(tier, block));
        }
    }

    fn remove(&mut self, ids: &[BlockId]) -> FsResult<u64> {
        let store = self.args.store.clone();
        let mut removed = 0;
        for &id in ids {
            self.abort(id);
            let Some(record) = store.get(id)? else {
                continue;
            };
            store.delete(id)?;
            let tier = record.tier as usize;
            let _ = fs::remove_file(store.block_path(tier, id));
            let t = &store.tiers[tier];
            t.used.fetch_sub(record.len, Ordering::Relaxed);
            t.blocks.fetch_sub(1, Ordering::Relaxed);
            removed += 1;
        }
        Ok(removed)
    }

    fn coldest(&self, tier: u8, bytes: u64) -> FsResult<Vec<(BlockId, u64)>> {
        let mut blocks: Vec<(i64, BlockId, u64)> = self
            .store()
            .all()?
            .into_iter()
            .filter(|(id, r)| r.tier == tier && !self.moving.contains_key(id))
            .map(|(id, r)| (r.last_access_ns, id, r.len))
            .collect();
        blocks.sort_unstable();
        let mut out = Vec::new();
        let mut total = 0;
        for (_, id, len) in blocks {
            if total >= bytes {
                break;
            }
            total += len;
            out.push((id, len));
        }
        Ok(out)
    }

    fn prepare_move(&mut self, block: BlockId) -> FsResult<MovePlan> {
        let store = self.args.store.clone();
        let (record, from) = store.locate(block)?;
        if self.moving.contains_key(&block) {
            return Err(FsError::Busy(format!("block {block:#x} is being moved")));
        }
        let here = record.tier as usize;
        let Some(to) =
            (here + 1..store.tier_count()).find(|&t| store.tiers[t].free() >= record.len)
        else {
            return Err(FsError::NoSpace(format!(
                "{}, and no lower tier has room for its blocks",
                store.tiers[here].describe()
            )));
        };
        store.tiers[to]
            .reserved
            .fetch_add(record.len, Ordering::Relaxed);
        self.moving.insert(block, (to, record.len));
        Ok(MovePlan {
            from: from.display().to_string(),
            to_tmp: store.tmp_path(to, block).display().to_string(),
            record,
            to_tier: to as u8,
        })
    }

    fn finish_move(&mut self, block: BlockId, to: usize, ok: bool) -> FsResult<()> {
        let store = self.args.store.clone();
        let Some((_, size)) = self.moving.remove(&block) else {
            return Err(FsError::InvalidArgument(format!(
                "block {block:#x} is not being moved"
            )));
        };
        store.tiers[to].reserved.fetch_sub(size, Ordering::Relaxed);
        let tmp = store.tmp_path(to, block);
        let record = match store.get(block)? {
            Some(r) if ok => r,
            _ => {
                // Abandoned, or the block was removed while it moved.
                let _ = fs::remove_file(&tmp);
                return Ok(());
            }
        };
        let from = record.tier as usize;
        let moved = BlockRecord {
            tier: to as u8,
            kind: store.tier_kind(to),
            ..record.clone()
        };
        store.put(block, &moved)?;
        let path = store.block_path(to, block);
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        fs::create_dir_all(&dir).map_err(|e| io_err(dir.display(), e))?;
        fs::rename(&tmp, &path).map_err(|e| io_err(path.display(), e))?;
        if store.syncs(to) {
            sync_dir(&dir);
        }
        let _ = fs::remove_file(store.block_path(from, block));
        store.tiers[from]
            .used
            .fetch_sub(record.len, Ordering::Relaxed);
        store.tiers[from].blocks.fetch_sub(1, Ordering::Relaxed);
        store.tiers[to]
            .used
            .fetch_add(record.len, Ordering::Relaxed);
        store.tiers[to].blocks.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(block, from = %store.tier_kind(from), to = %store.tier_kind(to), "block demoted");
        Ok(())
    }

    fn tick(&mut self, myself: &ActorRef<BlockMsg>) {
        if let Err(e) = self.store().flush_access() {
            tracing::warn!(error = %e, "recording block access times failed");
        }
        let grace = self.args.conf.orphan_grace;
        let stale: Vec<BlockId> = self
            .reservations
            .iter()
            .filter(|(_, r)| r.since.elapsed() > grace)
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            tracing::warn!(
                block = id,
                "dropping a block write abandoned for longer than the orphan grace"
            );
            self.abort(id);
        }
        if self
            .sweeping
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let check_orphans =
            self.last_orphan_check.elapsed() >= (grace / 4).max(Duration::from_secs(1));
        if check_orphans {
            self.last_orphan_check = Instant::now();
        }
        let args = self.args.clone();
        let me = myself.clone();
        let flag = self.sweeping.clone();
        tokio::spawn(async move {
            sweep_freed(&args, &me).await;
            if check_orphans {
                sweep_orphans(&args, &me).await;
            }
            flag.store(false, std::sync::atomic::Ordering::Release);
        });
    }
}

/// Removes blocks the shards this node serves freed, from every node that
/// holds them, then lets the shards forget them. A block on a node that is
/// down or does not answer is forgotten too: that node removes it as an
/// orphan (no shard knows it) after `data.orphan_grace`.
async fn sweep_freed(args: &BlockArgs, me: &ActorRef<BlockMsg>) {
    let cluster = args.namespace.cluster().clone();
    for shard in cluster.map().shards_of(&cluster.node_id) {
        loop {
            let freed = match args.namespace.take_freed(shard, 512).await {
                Ok(f) if !f.is_empty() => f,
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot collect freed blocks now");
                    break;
                }
            };
            let n = freed.len();
            let mut by_node: HashMap<String, Vec<BlockId>> = HashMap::new();
            for f in &freed {
                if f.locs.is_empty() {
                    by_node
                        .entry(cluster.node_id.clone())
                        .or_default()
                        .push(f.id);
                }
                for node in &f.locs {
                    by_node.entry(node.clone()).or_default().push(f.id);
                }
            }
            let mut local_ok = true;
            for (node, ids) in by_node {
                if node == cluster.node_id {
                    local_ok = matches!(
                        ractor::call!(me, |reply| BlockMsg::Remove {
                            ids: ids.clone(),
                            reply: Some(reply)
                        }),
                        Ok(Ok(_))
                    );
                } else if let Ok(gw) = cluster.gateway(&node) {
                    let _ = gw
                        .call(
                            |reply| curvine_messages::cluster::PeerMsg::RemoveBlocks { ids, reply },
                            Some(Duration::from_secs(30)),
                        )
                        .await;
                }
            }
            if !local_ok {
                tracing::warn!(shard, "removing freed blocks failed");
                break;
            }
            args.namespace
                .forget_freed(shard, freed.into_iter().map(|f| f.id).collect());
            if n < 512 {
                break;
            }
        }
    }
}

/// Removes blocks older than the grace period that no shard knows.
async fn sweep_orphans(args: &BlockArgs, me: &ActorRef<BlockMsg>) {
    let Ok(all) = args.store.all() else {
        return;
    };
    let cutoff = now_ns() - args.conf.orphan_grace.as_nanos() as i64;
    let mut by_shard: HashMap<ShardId, Vec<BlockId>> = HashMap::new();
    for (id, record) in all {
        if record.created_ns < cutoff {
            by_shard.entry(shard_of(id)).or_default().push(id);
        }
    }
    for (shard, ids) in by_shard {
        if shard as u32 >= args.namespace.shard_count() {
            continue;
        }
        for batch in ids.chunks(1024) {
            let uses = match args.namespace.check_blocks(shard, batch.to_vec()).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot check blocks now");
                    break;
                }
            };
            let orphans: Vec<BlockId> = batch
                .iter()
                .zip(uses)
                .filter(|(_, u)| *u == BlockUse::Unknown)
                .map(|(id, _)| *id)
                .collect();
            if !orphans.is_empty() {
                tracing::info!(
                    shard,
                    blocks = orphans.len(),
                    "removing blocks no file references"
                );
                let _ = me.cast(BlockMsg::Remove {
                    ids: orphans,
                    reply: None,
                });
            }
        }
    }
}

impl Actor for BlockManager {
    type Msg = BlockMsg;
    type State = BlockState;
    type Arguments = BlockArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<BlockMsg>,
        args: BlockArgs,
    ) -> Result<BlockState, ActorProcessingErr> {
        let metrics = args.namespace.cluster().metrics.clone();
        let stats = metrics.actor("block-manager", false);
        metrics.started(myself.get_id(), &stats);
        let stale = args.store.clear_tmp();
        if stale > 0 {
            tracing::warn!(
                files = stale,
                "removed temporary block files of writes cut off by a block manager restart"
            );
        }
        let mut evictors = Vec::new();
        for tier in 0..args.store.tier_count() {
            evictors.push(spawn_evictor(&myself, &args, tier as u8).await?);
        }
        myself.send_interval(args.conf.tick, || BlockMsg::Tick);
        // Collect freed blocks and check for orphans right away after a start.
        let _ = myself.cast(BlockMsg::Tick);
        Ok(BlockState {
            args,
            stats,
            reservations: HashMap::new(),
            moving: HashMap::new(),
            evictors,
            sweeping: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            last_orphan_check: Instant::now() - Duration::from_secs(3600 * 24 * 365),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<BlockMsg>,
        state: &mut BlockState,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.store().flush_access();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<BlockMsg>,
        message: BlockMsg,
        state: &mut BlockState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.stats.clone();
        let _handling = stats.handling(message.kind_name());
        match message {
            BlockMsg::Reserve {
                block,
                tier,
                size,
                reply,
            } => answer(reply, state.reserve(block, tier, size)),
            BlockMsg::Commit {
                block,
                len,
                crcs,
                reply,
            } => {
                let result = state.commit(block, len, crcs);
                if result.is_err() {
                    state.abort(block);
                }
                answer(reply, result)
            }
            BlockMsg::Abort { block } => state.abort(block),
            BlockMsg::Remove { ids, reply } => {
                let result = state.remove(&ids);
                if let Some(reply) = reply {
                    answer(reply, result);
                } else if let Err(e) = result {
                    tracing::warn!(error = %e, "removing blocks failed");
                }
            }
            BlockMsg::Coldest { tier, bytes, reply } => answer(reply, state.coldest(tier, bytes)),
            BlockMsg::PrepareMove { block, reply } => answer(reply, state.prepare_move(block)),
            BlockMsg::FinishMove {
                block,
                to_tier,
                ok,
                reply,
            } => answer(reply, state.finish_move(block, to_tier as usize, ok)),
            BlockMsg::Free { ids, reply } => {
                // Without replicas or an under-file-system every cached block
                // is the only copy of its data: nothing may be dropped.
                let mut summary = FreeSummary::default();
                for id in ids {
                    match state.store().get(id) {
                        Ok(Some(_)) => summary.kept_only_copy += 1,
                        Ok(None) => summary.not_here += 1,
                        Err(e) => {
                            answer(reply, Err(e));
                            return Ok(());
                        }
                    }
                }
                answer(reply, Ok(summary))
            }
            BlockMsg::Stats { reply } => answer(reply, Ok(state.store().stats())),
            BlockMsg::Tick => state.tick(&myself),
            BlockMsg::RestartEvictor { tier } => {
                let evictor = spawn_evictor(&myself, &state.args, tier).await?;
                if let Some(slot) = state.evictors.get_mut(tier as usize) {
                    *slot = evictor;
                }
            }
        }
        Ok(())
    }

    /// A failed evictor is started again after a pause; the blocks it was
    /// moving stay where they were (a move only switches after its copy).
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<BlockMsg>,
        event: ractor::SupervisionEvent,
        state: &mut BlockState,
    ) -> Result<(), ActorProcessingErr> {
        let failed = match &event {
            ractor::SupervisionEvent::ActorFailed(cell, error) => Some((cell, error.to_string())),
            ractor::SupervisionEvent::ActorTerminated(cell, _, reason) => {
                Some((cell, reason.clone().unwrap_or_else(|| "stopped".into())))
            }
            _ => None,
        };
        if let Some((cell, error)) = failed {
            let tier = state
                .evictors
                .iter()
                .position(|e| e.get_id() == cell.get_id());
            if let Some(tier) = tier {
                tracing::error!(tier, error = %error, "tier evictor failed; restarting it");
                let role = format!(
                    "evictor-{}",
                    state.store().tier_kind(tier).to_string().to_lowercase()
                );
                let evictor = state.args.namespace.cluster().metrics.actor(&role, false);
                evictor.failed();
                evictor.restarted();
                let moving: Vec<BlockId> = state.moving.keys().copied().collect();
                for block in moving {
                    if let Some((to, _)) = state.moving.get(&block).copied() {
                        let _ = state.finish_move(block, to, false);
                    }
                }
                let tier = tier as u8;
                myself.send_after(Duration::from_secs(1), move || BlockMsg::RestartEvictor {
                    tier,
                });
            }
        }
        Ok(())
    }
}

async fn spawn_evictor(
    myself: &ActorRef<BlockMsg>,
    args: &BlockArgs,
    tier: u8,
) -> Result<ActorRef<EvictMsg>, ActorProcessingErr> {
    let (evictor, _) = Actor::spawn_linked(
        None,
        TierEvictor,
        EvictArgs {
            tier,
            store: args.store.clone(),
            manager: myself.clone(),
            conf: args.conf.clone(),
            metrics: args.namespace.cluster().metrics.clone(),
        },
        myself.get_cell(),
    )
    .await?;
    Ok(evictor)
}

// ---- TierEvictor --------------------------------------------------------------

pub struct TierEvictor;

pub enum EvictMsg {
    /// Look at the tier's usage and demote blocks when above the high watermark.
    Check,
}

impl ractor::Message for EvictMsg {}

pub struct EvictArgs {
    pub tier: u8,
    pub store: Arc<BlockStore>,
    pub manager: ActorRef<BlockMsg>,
    pub conf: BlockConf,
    pub metrics: Metrics,
}

pub struct EvictState {
    args: EvictArgs,
    stats: Arc<ActorStats>,
    /// When the tier was last found full of blocks that cannot move (logged once).
    stuck_since: Option<Instant>,
    last_run: Option<Instant>,
}

/// Copies a block file to its new place, verifying every checksum unit.
fn copy_verified(plan: &MovePlan, sync: bool) -> FsResult<()> {
    let mut src = File::open(&plan.from).map_err(|e| io_err(&plan.from, e))?;
    let mut dst = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&plan.to_tmp)
        .map_err(|e| io_err(&plan.to_tmp, e))?;
    let mut buf = vec![0u8; 16 * CHECKSUM_UNIT];
    let mut done: u64 = 0;
    while done < plan.record.len {
        let want = ((plan.record.len - done) as usize).min(buf.len());
        src.read_exact(&mut buf[..want])
            .map_err(|e| io_err(&plan.from, e))?;
        let first = (done / CHECKSUM_UNIT as u64) as usize;
        let crcs = &plan.record.crcs[first.min(plan.record.crcs.len())..];
        verify_units(&buf[..want], crcs, first, &plan.from)?;
        dst.write_all(&buf[..want])
            .map_err(|e| io_err(&plan.to_tmp, e))?;
        done += want as u64;
    }
    if sync {
        dst.sync_data().map_err(|e| io_err(&plan.to_tmp, e))?;
    }
    Ok(())
}

impl TierEvictor {
    async fn check(state: &mut EvictState) -> Result<(), ActorProcessingErr> {
        let a = &state.args;
        let tier = a.tier as usize;
        if state
            .last_run
            .is_some_and(|t| t.elapsed() < a.conf.evict_interval / 2)
        {
            return Ok(());
        }
        state.last_run = Some(Instant::now());
        if a.store.usage(tier) <= a.conf.high_watermark {
            state.stuck_since = None;
            return Ok(());
        }
        let capacity = a.store.capacity(tier) as f64;
        let target = (a.conf.low_watermark * capacity) as u64;
        let in_use = (a.store.usage(tier) * capacity) as u64;
        let need = in_use.saturating_sub(target);
        let tier_u8 = a.tier;
        let coldest = match ractor::call!(a.manager, |reply| BlockMsg::Coldest {
            tier: tier_u8,
            bytes: need,
            reply
        }) {
            Ok(Ok(c)) => c,
            _ => return Ok(()),
        };
        for (block, _) in coldest {
            let plan = match ractor::call!(a.manager, |reply| BlockMsg::PrepareMove {
                block,
                reply
            }) {
                Ok(Ok(p)) => p,
                Ok(Err(FsError::NoSpace(why))) => {
                    if state.stuck_since.is_none() {
                        tracing::warn!(tier = %a.store.tier_kind(tier), "{why}; new writes get ENOSPC until space is freed");
                        state.stuck_since = Some(Instant::now());
                    }
                    return Ok(());
                }
                Ok(Err(_)) => continue, // removed or moving meanwhile
                Err(e) => return Err(e.into()),
            };
            let to = plan.to_tier;
            let sync = a.store.syncs(to as usize);
            let plan2 = plan.clone();
            let copied = tokio::task::spawn_blocking(move || copy_verified(&plan2, sync))
                .await
                .unwrap_or_else(|e| Err(FsError::Io(format!("copy task failed: {e}"))));
            if let Err(e) = &copied {
                if matches!(e, FsError::Corrupt(_)) {
                    a.store.checksum_errors.fetch_add(1, Ordering::Relaxed);
                }
                tracing::error!(block, error = %e, "demoting a block failed; it stays where it is");
            }
            let ok = copied.is_ok();
            let kind = a.store.tier_kind(tier).to_string();
            let outcome = if ok { "moved" } else { "failed" };
            let labels = [("tier", kind.as_str()), ("outcome", outcome)];
            a.metrics.add(
                "curvine_evictions_total",
                "Blocks the tier evictor demoted to a lower tier (or failed to).",
                &labels,
                1,
            );
            if ok {
                a.metrics.add(
                    "curvine_evicted_bytes_total",
                    "Bytes the tier evictor demoted to a lower tier.",
                    &[("tier", kind.as_str())],
                    plan.record.len,
                );
            }
            let _ = ractor::call!(a.manager, |reply| BlockMsg::FinishMove {
                block,
                to_tier: to,
                ok,
                reply
            });
            if a.store.usage(tier) <= a.conf.low_watermark {
                break;
            }
        }
        Ok(())
    }
}

impl Actor for TierEvictor {
    type Msg = EvictMsg;
    type State = EvictState;
    type Arguments = EvictArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<EvictMsg>,
        args: EvictArgs,
    ) -> Result<EvictState, ActorProcessingErr> {
        let role = format!(
            "evictor-{}",
            args.store
                .tier_kind(args.tier as usize)
                .to_string()
                .to_lowercase()
        );
        let stats = args.metrics.actor(&role, false);
        args.metrics.started(myself.get_id(), &stats);
        myself.send_interval(args.conf.evict_interval, || EvictMsg::Check);
        Ok(EvictState {
            args,
            stats,
            stuck_since: None,
            last_run: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<EvictMsg>,
        message: EvictMsg,
        state: &mut EvictState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.stats.clone();
        let _handling = stats.handling("check");
        match message {
            EvictMsg::Check => Self::check(state).await,
        }
    }
}

//! The `BlockManager` actor: every change to the node's blocks (reserving
//! room for a write, committing, aborting, removing, moving between tiers)
//! goes through it; it ticks the background sweeps and supervises its
//! tiers' evictors (a supervisor `tier-evictors` with a TierEvictor per
//! tier, which escalates to the block manager when they keep failing).

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use curvine_messages::block::{
    block_crc, units, AssemblePart, AssemblePlan, BlockId, BlockMsg, BlockRecord, ExtentRef,
    FreeSummary, MovePlan, Reclaimed, Reservation, TierKind, FIRST_RESERVATION,
};
use curvine_messages::{now_ns, FsError, FsResult};

use super::evictor::{EvictArgs, EvictMsg, TierEvictor};
use super::store::{sync_dir, BlockStore};
use super::sweep::{sweep_freed, sweep_orphans};
use super::{human, io_err};
use crate::namespace::Namespace;
use crate::stats::ActorStats;
use crate::supervisor::{ActorChild, RestartPolicy, Slot, Supervisor, SupervisorArgs};

/// Settings of the block manager and its evictors.
#[derive(Debug, Clone)]
pub struct BlockConf {
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub evict_interval: Duration,
    pub orphan_grace: Duration,
    /// How long after a block is freed it is removed when a node could not
    /// tell whether its readers hold it (else: as soon as none does).
    pub freed_grace: Duration,
    /// How long a reader holds the blocks of the version it opened at most.
    pub read_hold_max: Duration,
    /// How long a write that finds no room waits for uploads to the UFS
    /// without progress before it is refused.
    pub upload_wait: Duration,
    /// How often freed blocks are collected and orphans looked for.
    pub tick: Duration,
}

#[derive(Clone)]
pub struct BlockArgs {
    pub store: Arc<BlockStore>,
    pub namespace: Arc<Namespace>,
    pub conf: BlockConf,
    /// How the evictors are restarted.
    pub policy: RestartPolicy,
}

pub(super) struct Reserved {
    pub(super) tier: usize,
    pub(super) size: u64,
    pub(super) since: Instant,
    /// Written into an extent file (a run, `runs.rs`): its id, and where
    /// the block starts in it.
    pub(super) extent: Option<(u64, u64)>,
}

impl Reserved {
    /// Nothing reserved yet (the caller grows it), from now.
    pub(super) fn new(tier: usize, extent: Option<(u64, u64)>) -> Reserved {
        Reserved {
            tier,
            size: 0,
            since: Instant::now(),
            extent,
        }
    }
}

pub struct BlockManager;

/// How long a write that finds no room waits for readers that hold freed
/// blocks to close (a close reaches the node a moment after the program's).
const HELD_WAIT: Duration = Duration::from_millis(500);

/// An extent file being filled: its tier, the bytes reserved there, and
/// what was planned.
struct Assembling {
    tier: usize,
    size: u64,
    parts: Vec<AssemblePart>,
}

pub struct BlockState {
    pub(super) args: BlockArgs,
    stats: Arc<ActorStats>,
    pub(super) reservations: HashMap<BlockId, Reserved>,
    /// Blocks being moved: target tier and bytes reserved there.
    moving: HashMap<BlockId, (usize, u64)>,
    /// Extent files being filled, by extent id.
    assembling: HashMap<u64, Assembling>,
    /// Each tier's evictor, as its supervisor keeps it.
    evictors: Vec<Slot<EvictMsg>>,
    /// The evictors' supervisor.
    evictor_sup: ActorCell,
    /// Held by the sweep of freed blocks or orphans that runs.
    sweeping: Arc<tokio::sync::Mutex<()>>,
    /// When each freed block the sweeps met was first met.
    freed_seen: super::sweep::FreedSeen,
    /// Blocks the shards kept when asked to drop them for room.
    kept: super::room::Kept,
    last_orphan_check: Instant,
}

/// The record of a block committed now in `tier` (of `kind`).
pub(super) fn new_record(
    kind: TierKind,
    tier: usize,
    len: u64,
    crcs: Vec<u32>,
    extent: Option<ExtentRef>,
) -> BlockRecord {
    let now = now_ns();
    BlockRecord {
        tier: tier as u8,
        kind,
        len,
        crcs,
        created_ns: now,
        last_access_ns: now,
        extent,
    }
}

fn answer<T>(reply: RpcReplyPort<FsResult<T>>, value: FsResult<T>) {
    let _ = reply.send(value);
}

impl BlockState {
    pub(super) fn store(&self) -> &BlockStore {
        &self.args.store
    }

    fn reserve(
        &mut self,
        block: BlockId,
        want: Option<TierKind>,
        size: u64,
        grows: bool,
        after: Option<(BlockId, u64)>,
    ) -> FsResult<Reservation> {
        if self.reservations.contains_key(&block) {
            if !grows {
                // A copy or fill of a known length that finds the block
                // being written here already (a pull at a file's close and
                // one of the re-replication at once): the second would
                // write the same file under the first.
                return Err(FsError::Unavailable(format!(
                    "block {block:#x} is being written on this node already"
                )));
            }
            let tier = self.grow(block, size)?;
            return Ok(self.reservation(tier, block));
        }
        if let Some(r) = after.and_then(|prev| self.follow(block, want, size, grows, prev)) {
            return Ok(r);
        }
        let store = &self.args.store;
        let candidates = store.tiers_of(want);
        if candidates.is_empty() {
            return Err(FsError::InvalidArgument(format!(
                "this node has no {} tier",
                want.map(|k| k.name()).unwrap_or("storage")
            )));
        }
        // The fastest tier with room for the whole block, as a lower tier
        // with room is better than a write that fails when it grows;
        // else the fastest with room for its first part. A writer that
        // grows its reservation as it writes is given its first part only,
        // whatever the room: a whole block reserved ahead by one writer
        // would refuse another's bytes while the first has not written
        // them (many small files on a small tier; two large writers of
        // which the first took a block's room).
        let room = |need: u64| {
            candidates
                .iter()
                .copied()
                .find(|&t| store.tiers[t].free() >= need)
        };
        let first = if grows {
            size.min(FIRST_RESERVATION)
        } else {
            size
        };
        let Some((tier, size)) = room(size).or_else(|| room(first)).map(|t| (t, first)) else {
            let t = &store.tiers[candidates[0]];
            return Err(FsError::NoSpace(format!(
                "{}, no room for a block of {}{}; blocks that are the only copy of their data are never dropped",
                t.describe(),
                human(size),
                if candidates.len() > 1 { " in any tier" } else { "" }
            )));
        };
        self.reservations.insert(block, Reserved::new(tier, None));
        if let Err(e) = self.grow(block, size) {
            self.reservations.remove(&block);
            return Err(e);
        }
        Ok(self.reservation(tier, block))
    }

    pub(super) fn reservation(&self, tier: usize, block: BlockId) -> Reservation {
        let store = self.store();
        let (path, offset) = match self.reservations.get(&block).and_then(|r| r.extent) {
            Some((extent, offset)) => (store.extent_path(tier, extent), offset),
            None => (store.tmp_path(tier, block), 0),
        };
        Reservation {
            tier: store.tier_kind(tier),
            path: path.display().to_string(),
            offset,
        }
    }

    /// Grows the reservation of a block being written to `size` bytes (a
    /// writer reserves as it writes, not a whole block at once); a smaller
    /// `size` keeps it. Returns its tier.
    pub(super) fn grow(&mut self, block: BlockId, size: u64) -> FsResult<usize> {
        let store = self.args.store.clone();
        let Some(r) = self.reservations.get_mut(&block) else {
            return Err(FsError::InvalidArgument(format!(
                "block {block:#x} is not being written on this node"
            )));
        };
        let tier = r.tier;
        if size <= r.size {
            return Ok(tier);
        }
        let more = size - r.size;
        let t = &store.tiers[tier];
        if t.free() < more {
            return Err(FsError::NoSpace(format!(
                "{}, no room for block {block:#x} to grow to {}; blocks that are the only copy of their data are never dropped",
                t.describe(),
                human(size)
            )));
        }
        t.reserved.fetch_add(more, Ordering::Relaxed);
        r.size = size;
        if store.usage(tier) > self.args.conf.high_watermark {
            if let Some(e) = self.evictors.get(tier).and_then(Slot::current) {
                let _ = e.cast(EvictMsg::Check);
            }
        }
        Ok(tier)
    }

    pub(super) fn release(&mut self, block: BlockId) -> Option<usize> {
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
        let (tier, extent) = (r.tier, r.extent);
        // A writer that wrote past what it reserved needs room for it now.
        self.grow(block, len)?;
        if crcs.len() != units(len) {
            return Err(FsError::InvalidArgument(format!(
                "block {block:#x}: {} checksums for {len} bytes (expected {})",
                crcs.len(),
                units(len)
            )));
        }
        if let Some((extent, offset)) = extent {
            return self.commit_in_run(block, tier, extent, offset, len, crcs);
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
        let record = new_record(store.tier_kind(tier), tier, len, crcs, None);
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

    pub(super) fn abort(&mut self, block: BlockId) {
        let in_run = self
            .reservations
            .get(&block)
            .is_some_and(|r| r.extent.is_some());
        if let Some(tier) = self.release(block) {
            if in_run {
                self.store().leave_run(block);
            } else {
                let _ = fs::remove_file(self.store().tmp_path(tier, block));
            }
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
            store.release_file(id, &record);
            removed += 1;
        }
        Ok(removed)
    }

    fn coldest(&self, tier: u8, bytes: u64) -> FsResult<Vec<(BlockId, u64)>> {
        // Reads noted since the last tick count too.
        self.store().flush_access()?;
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
        if self.moving.contains_key(&block) || self.is_assembling(block) {
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
            from_offset: record.offset(),
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
            extent: None,
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
        store.release_file(block, &record);
        store.tiers[to]
            .used
            .fetch_add(record.len, Ordering::Relaxed);
        store.tiers[to].blocks.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(block, from = %store.tier_kind(from), to = %store.tier_kind(to), "block demoted");
        Ok(())
    }

    fn is_assembling(&self, block: BlockId) -> bool {
        self.assembling
            .values()
            .any(|a| a.parts.iter().any(|p| p.block == block))
    }

    /// Plans an extent file for `blocks` (id, offset in their file) of
    /// this node and `fetch` (id, offset, length) copied from other nodes
    /// by the caller: in the tier of the first block here when it has room
    /// for it, else the fastest with room.
    fn prepare_assemble(
        &mut self,
        blocks: &[(BlockId, u64)],
        fetch: &[(BlockId, u64, u64)],
    ) -> FsResult<AssemblePlan> {
        let store = self.args.store.clone();
        let mut parts = Vec::with_capacity(blocks.len() + fetch.len());
        for &(block, offset) in blocks {
            let (record, from) = store.locate(block)?;
            if self.moving.contains_key(&block) || self.is_assembling(block) {
                return Err(FsError::Busy(format!("block {block:#x} is being moved")));
            }
            parts.push(AssemblePart {
                block,
                from: from.display().to_string(),
                from_offset: record.offset(),
                offset,
                record,
                fetched: false,
            });
        }
        let now = now_ns();
        for &(block, offset, len) in fetch {
            if store.get(block)?.is_some() || self.reservations.contains_key(&block) {
                return Err(FsError::Busy(format!(
                    "block {block:#x} is already here or being written here"
                )));
            }
            if self.is_assembling(block) {
                return Err(FsError::Busy(format!(
                    "block {block:#x} is being copied here"
                )));
            }
            parts.push(AssemblePart {
                block,
                from: String::new(),
                from_offset: 0,
                offset,
                record: BlockRecord {
                    tier: 0,
                    kind: store.tier_kind(0),
                    len,
                    crcs: Vec::new(),
                    created_ns: now,
                    last_access_ns: now,
                    extent: None,
                },
                fetched: true,
            });
        }
        let size = parts
            .iter()
            .map(|p| p.offset + p.record.len)
            .max()
            .unwrap_or(0);
        let first = parts
            .iter()
            .find(|p| !p.fetched)
            .map_or(0, |p| p.record.tier as usize);
        let Some(tier) = std::iter::once(first)
            .chain(0..store.tier_count())
            .find(|&t| store.tiers[t].free() >= size)
        else {
            return Err(FsError::NoSpace(format!(
                "no tier has room for an extent of {}",
                human(size)
            )));
        };
        store.tiers[tier]
            .reserved
            .fetch_add(size, Ordering::Relaxed);
        let (extent, tmp) = store.new_extent(tier);
        self.assembling.insert(
            extent,
            Assembling {
                tier,
                size,
                parts: parts.clone(),
            },
        );
        Ok(AssemblePlan {
            extent,
            tier: tier as u8,
            tmp: tmp.display().to_string(),
            parts,
        })
    }

    /// Switches the blocks still as planned to the filled extent file; the
    /// files they leave go. The extent's records are written before the old
    /// files go: a crash in between leaves files the index does not know,
    /// which the next open removes.
    fn finish_assemble(
        &mut self,
        extent: u64,
        ok: bool,
        fetched: Vec<(BlockId, Vec<u32>)>,
    ) -> FsResult<String> {
        let store = self.args.store.clone();
        let Some(a) = self.assembling.remove(&extent) else {
            return Err(FsError::InvalidArgument(format!(
                "extent {extent:#x} is not being assembled"
            )));
        };
        store.tiers[a.tier]
            .reserved
            .fetch_sub(a.size, Ordering::Relaxed);
        let tmp = store.extent_tmp(a.tier, extent);
        if !ok {
            let _ = fs::remove_file(&tmp);
            return Ok(String::new());
        }
        let mut switched = Vec::new();
        let mut added = Vec::new();
        for p in &a.parts {
            if p.fetched {
                // Copied from another node: recorded unless a copy arrived
                // meanwhile (a replica pulled here), with the checksums its
                // bytes came with.
                let crcs = fetched
                    .iter()
                    .find(|(id, c)| *id == p.block && c.len() == units(p.record.len));
                if let Some((_, crcs)) = crcs {
                    if store.get(p.block)?.is_none() && !self.reservations.contains_key(&p.block) {
                        added.push((p, crcs.clone()));
                    }
                }
                continue;
            }
            let same = store.get(p.block)?.is_some_and(|now| {
                now.tier == p.record.tier
                    && now.extent == p.record.extent
                    && now.len == p.record.len
            });
            if same {
                switched.push(p);
            }
        }
        let path = store.extent_path(a.tier, extent);
        if switched.is_empty() && added.is_empty() {
            let _ = fs::remove_file(&tmp);
            return Err(FsError::NotFound(
                "the file's blocks changed while they were copied".into(),
            ));
        }
        fs::rename(&tmp, &path).map_err(|e| io_err(path.display(), e))?;
        if store.syncs(a.tier) {
            if let Some(dir) = path.parent() {
                sync_dir(dir);
            }
        }
        for p in &switched {
            let record = BlockRecord {
                tier: a.tier as u8,
                kind: store.tier_kind(a.tier),
                extent: Some(ExtentRef {
                    id: extent,
                    offset: p.offset,
                }),
                ..p.record.clone()
            };
            store.put(p.block, &record)?;
        }
        for (p, crcs) in &added {
            let record = BlockRecord {
                tier: a.tier as u8,
                kind: store.tier_kind(a.tier),
                crcs: crcs.clone(),
                extent: Some(ExtentRef {
                    id: extent,
                    offset: p.offset,
                }),
                ..p.record.clone()
            };
            store.put(p.block, &record)?;
        }
        store.add_extent(
            a.tier,
            extent,
            a.size,
            (switched.len() + added.len()) as u32,
        );
        for p in &switched {
            store.release_file(p.block, &p.record);
        }
        tracing::debug!(extent, blocks = switched.len(), bytes = a.size, tier = %store.tier_kind(a.tier), "blocks laid out in an extent file");
        Ok(path.display().to_string())
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
        self.store().reclaim_held();
        let Ok(sweeping) = self.sweeping.clone().try_lock_owned() else {
            return;
        };
        let check_orphans =
            self.last_orphan_check.elapsed() >= (grace / 4).max(Duration::from_secs(1));
        if check_orphans {
            self.last_orphan_check = Instant::now();
        }
        let args = self.args.clone();
        let me = myself.clone();
        let seen = self.freed_seen.clone();
        tokio::spawn(async move {
            sweep_freed(&args, &me, &seen).await;
            if check_orphans {
                sweep_orphans(&args, &me).await;
            }
            drop(sweeping);
        });
    }

    /// Makes room now (see [`BlockMsg::Reclaim`]), one reclaim or sweep
    /// at a time. While blocks on this node wait for their upload to the
    /// UFS, it waits for them (they are dropped once uploaded), for at
    /// most `data.upload_wait` without any progress: writers slow down to
    /// the upload rate instead of failing.
    fn reclaim(
        &self,
        myself: &ActorRef<BlockMsg>,
        (need, want, drop_clean): (u64, Option<TierKind>, bool),
        reply: RpcReplyPort<FsResult<Reclaimed>>,
    ) {
        let args = self.args.clone();
        let me = myself.clone();
        let seen = self.freed_seen.clone();
        let sweeping = self.sweeping.clone();
        let kept = self.kept.clone();
        tokio::spawn(async move {
            let used = |store: &BlockStore| store.stats().iter().map(|t| t.used).sum::<u64>();
            let before = used(&args.store);
            let started = Instant::now();
            let mut progress = started;
            let mut last_uploading = u64::MAX;
            let mut waited = false;
            let uploading = loop {
                let (held, (dropped, uploading)) = {
                    let _sweeping = sweeping.lock().await;
                    let held = sweep_freed(&args, &me, &seen).await;
                    args.store.reclaim_held();
                    let room = if drop_clean {
                        super::room::drop_clean(&args, &me, &kept, (need, want)).await
                    } else {
                        (0, 0)
                    };
                    (held, room)
                };
                if super::room::has_room(&args, need, want) {
                    break uploading;
                }
                if uploading == 0 {
                    // A reader that closed a moment ago may not have told
                    // its node yet (its close goes on after the program's):
                    // freed blocks still held get a moment.
                    if held > 0 && started.elapsed() < HELD_WAIT {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    break uploading;
                }
                if dropped > 0 || uploading < last_uploading {
                    progress = Instant::now();
                }
                last_uploading = uploading;
                if progress.elapsed() >= args.conf.upload_wait {
                    break uploading;
                }
                if !waited {
                    waited = true;
                    tracing::debug!(need, uploading, "a write waits for uploads to make room");
                    args.namespace.cluster().metrics.add(
                        "curvine_writes_waited_for_upload_total",
                        "Writes that found no room and waited for blocks being uploaded to the UFS (fs_mode) to become droppable.",
                        &[],
                        1,
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            let _ = reply.send(Ok(Reclaimed {
                freed: before.saturating_sub(used(&args.store)),
                uploading,
            }));
        });
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
        args.store.holds.set_max(args.conf.read_hold_max);
        let stale = args.store.clear_tmp() + args.store.abandon_runs();
        if stale > 0 {
            tracing::warn!(
                files = stale,
                "removed temporary block files of writes cut off by a block manager restart"
            );
        }
        let (evictors, evictor_sup) = start_evictors(&myself, &args).await?;
        myself.send_interval(args.conf.tick, || BlockMsg::Tick);
        // Collect freed blocks and check for orphans right away after a start.
        let _ = myself.cast(BlockMsg::Tick);
        Ok(BlockState {
            args,
            stats,
            reservations: HashMap::new(),
            moving: HashMap::new(),
            assembling: HashMap::new(),
            evictors,
            evictor_sup,
            sweeping: Default::default(),
            freed_seen: Default::default(),
            kept: Default::default(),
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
                grows,
                reply,
                after,
            } => answer(reply, state.reserve(block, tier, size, grows, after)),
            BlockMsg::Commit {
                block,
                len,
                crcs,
                reply,
            } => {
                let result = state.commit(block, len, crcs);
                if result.is_err() {
                    state.abort(block);
                } else {
                    state.args.namespace.cluster().metrics.add(
                        "curvine_block_bytes_written_total",
                        "Bytes of new blocks committed on this node (writes through the data port or short-circuit, and fills from under-file-systems).",
                        &[],
                        len,
                    );
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
            BlockMsg::PrepareAssemble {
                blocks,
                fetch,
                reply,
            } => answer(reply, state.prepare_assemble(&blocks, &fetch)),
            BlockMsg::FinishAssemble {
                extent,
                ok,
                fetched,
                reply,
            } => answer(reply, state.finish_assemble(extent, ok, fetched)),
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
            BlockMsg::Reclaim {
                block,
                size,
                grows,
                tier,
                drop_clean,
                reply,
            } => {
                // What the reservation lacks: its growth, or its first part.
                let need = match state.reservations.get(&block) {
                    Some(r) => size.saturating_sub(r.size),
                    None if grows => size.min(FIRST_RESERVATION),
                    None => size,
                };
                state.reclaim(&myself, (need, tier, drop_clean), reply)
            }
            BlockMsg::EvictorFailed { tier } => {
                // The blocks it was moving stay where they were (a move
                // only switches after its copy).
                tracing::warn!(tier, "tier evictor failed; its moves are undone");
                let moving: Vec<BlockId> = state.moving.keys().copied().collect();
                for block in moving {
                    if let Some((to, _)) = state.moving.get(&block).copied() {
                        let _ = state.finish_move(block, to, false);
                    }
                }
            }
        }
        Ok(())
    }

    /// The evictors' supervisor only stops when it gave up: so does the
    /// block manager (its own supervisor restarts it, evictors and all).
    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<BlockMsg>,
        event: SupervisionEvent,
        state: &mut BlockState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, error)
                if cell.get_id() == state.evictor_sup.get_id() =>
            {
                Err(format!("the tier evictors keep failing: {error}").into())
            }
            SupervisionEvent::ActorTerminated(cell, _, reason)
                if cell.get_id() == state.evictor_sup.get_id() =>
            {
                Err(format!("the tier evictors stopped: {}", reason.unwrap_or_default()).into())
            }
            _ => Ok(()),
        }
    }
}

/// Starts the supervisor of the tiers' evictors (role `tier-evictors`, a
/// child `evictor-<tier>` per tier) linked to the block manager; an
/// evictor that fails has its moves undone (`EvictorFailed`).
async fn start_evictors(
    myself: &ActorRef<BlockMsg>,
    args: &BlockArgs,
) -> Result<(Vec<Slot<EvictMsg>>, ActorCell), ActorProcessingErr> {
    let metrics = args.namespace.cluster().metrics.clone();
    let mut sup = SupervisorArgs::new("tier-evictors", args.policy.clone(), metrics.clone());
    let mut slots = Vec::new();
    for tier in 0..args.store.tier_count() {
        let tier = tier as u8;
        let role = format!(
            "evictor-{}",
            args.store
                .tier_kind(tier as usize)
                .to_string()
                .to_lowercase()
        );
        let slot = Slot::new("tier evictor");
        let evict_args = EvictArgs {
            tier,
            store: args.store.clone(),
            manager: myself.clone(),
            conf: args.conf.clone(),
            metrics: metrics.clone(),
        };
        let manager = myself.clone();
        let child = ActorChild::new(role, move || (TierEvictor, evict_args.clone()))
            .with_slot(slot.clone())
            .on_stop(move |failure| {
                if failure.is_some() {
                    let _ = manager.cast(BlockMsg::EvictorFailed { tier });
                }
            });
        sup = sup.child(child.boxed());
        slots.push(slot);
    }
    let name = myself.get_name().map(|n| format!("{n}/tier-evictors"));
    let (sup, _) = Actor::spawn_linked(name, Supervisor, sup, myself.get_cell()).await?;
    Ok((slots, sup.get_cell()))
}

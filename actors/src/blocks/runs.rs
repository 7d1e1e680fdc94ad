//! Runs: blocks that one writer writes one after another on this node (a
//! file written in order) go one after the other into one extent file, so
//! that such a file is one file here and a mount passes it through from
//! its first read, with no copy made after (`Assemble`).
//!
//! The first block is written like any other, in its temporary file. When
//! the writer asks for the next one naming it (`after`: id and length) and
//! it is not committed yet, its file becomes a new extent file
//! (`<tier>/extents/<id>`, by a rename) and the next block is reserved
//! right after it. Each block of a run is committed on its own and
//! recorded at its offset in the extent. The extent file lives while any
//! block of it is indexed or still being written. A crash leaves it with
//! the blocks the index records (opening the store removes one with none);
//! a block manager restart forgets the blocks being written.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use curvine_messages::block::{
    block_crc, BlockId, ExtentRef, Reservation, TierKind, FIRST_RESERVATION,
};
use curvine_messages::{FsError, FsResult};

use super::io_err;
use super::manager::{new_record, BlockState, Reserved};
use super::store::{sync_dir, BlockStore, ExtentUse};

impl BlockState {
    /// A reservation for `block` right after `prev` (`prev_len` bytes the
    /// same writer wrote just before, not committed) in one extent file;
    /// `None` where it cannot follow: `prev` not being written here, its
    /// file not `prev_len` long, another tier asked for, or no room left
    /// in `prev`'s tier (the caller then reserves as for any block).
    pub(super) fn follow(
        &mut self,
        block: BlockId,
        want: Option<TierKind>,
        size: u64,
        grows: bool,
        (prev, prev_len): (BlockId, u64),
    ) -> Option<Reservation> {
        let store = self.args.store.clone();
        let p = self.reservations.get(&prev)?;
        let tier = p.tier;
        let t = &store.tiers[tier];
        if want.is_some_and(|k| t.info.kind != k) {
            return None;
        }
        let first = if grows {
            size.min(FIRST_RESERVATION)
        } else {
            size
        };
        // As [`BlockState::reserve`]: a growing writer's first part only.
        if t.free() < first {
            return None;
        }
        let need = first;
        let (extent, start) = match p.extent {
            Some((extent, offset)) => {
                let len = fs::metadata(store.extent_path(tier, extent)).ok()?.len();
                if len != offset + prev_len {
                    return None;
                }
                (extent, offset + prev_len)
            }
            None => {
                let tmp = store.tmp_path(tier, prev);
                if fs::metadata(&tmp).ok()?.len() != prev_len {
                    return None;
                }
                let (extent, path) = store.new_run(tier);
                if let Err(e) = fs::rename(&tmp, &path) {
                    tracing::debug!(block = prev, error = %e, "cannot start an extent file with a block being written");
                    store.drop_if_unused(tier, extent);
                    return None;
                }
                store.join_run(prev, tier, extent);
                self.reservations.get_mut(&prev)?.extent = Some((extent, 0));
                (extent, prev_len)
            }
        };
        self.reservations
            .insert(block, Reserved::new(tier, Some((extent, start))));
        store.join_run(block, tier, extent);
        if self.grow(block, need).is_err() {
            self.abort(block);
            return None;
        }
        Some(self.reservation(tier, block))
    }

    /// Commits a block written into a run's extent file at `offset`.
    pub(super) fn commit_in_run(
        &mut self,
        block: BlockId,
        tier: usize,
        extent: u64,
        offset: u64,
        len: u64,
        crcs: Vec<u32>,
    ) -> FsResult<u32> {
        let store = self.args.store.clone();
        let path = store.extent_path(tier, extent);
        let on_disk = fs::metadata(&path)
            .map_err(|e| {
                io_err(
                    format!("block {block:#x} extent file {}", path.display()),
                    e,
                )
            })?
            .len();
        if on_disk < offset + len {
            return Err(FsError::InvalidArgument(format!(
                "block {block:#x}: the writer reports {len} bytes at {offset} of {}, which holds {on_disk}",
                path.display()
            )));
        }
        let crc = block_crc(&crcs);
        let at = ExtentRef { id: extent, offset };
        let record = new_record(store.tier_kind(tier), tier, len, crcs, Some(at));
        // The extent file's name (a rename at the run's start) is durable
        // before a record names it.
        if store.syncs(tier) {
            if let Some(dir) = path.parent() {
                sync_dir(dir);
            }
        }
        store.put(block, &record)?;
        self.release(block);
        store.commit_run(block, offset + len);
        Ok(crc)
    }
}

impl BlockStore {
    /// A new, empty extent for a run in `tier`, and its file's path.
    pub(super) fn new_run(&self, tier: usize) -> (u64, PathBuf) {
        let (id, _) = self.new_extent(tier);
        self.extents.lock().insert(
            id,
            ExtentUse {
                size: 0,
                live: 0,
                writing: 0,
            },
        );
        (id, self.extent_path(tier, id))
    }

    /// `block` is being written into `extent`.
    pub(super) fn join_run(&self, block: BlockId, tier: usize, extent: u64) {
        if let Some(u) = self.extents.lock().get_mut(&extent) {
            u.writing += 1;
        }
        self.in_runs.lock().insert(block, (tier, extent));
    }

    /// A block of a run was committed, its bytes ending at `end` in its
    /// extent: the extent holds one more block, and counts as used up to
    /// its furthest committed byte.
    pub(super) fn commit_run(&self, block: BlockId, end: u64) {
        let Some((tier, extent)) = self.in_runs.lock().remove(&block) else {
            return;
        };
        let t = &self.tiers[tier];
        t.blocks.fetch_add(1, Ordering::Relaxed);
        if let Some(u) = self.extents.lock().get_mut(&extent) {
            u.writing = u.writing.saturating_sub(1);
            u.live += 1;
            if end > u.size {
                t.used.fetch_add(end - u.size, Ordering::Relaxed);
                u.size = end;
            }
        }
    }

    /// A block of a run was dropped before its commit.
    pub(super) fn leave_run(&self, block: BlockId) {
        let Some((tier, extent)) = self.in_runs.lock().remove(&block) else {
            return;
        };
        if let Some(u) = self.extents.lock().get_mut(&extent) {
            u.writing = u.writing.saturating_sub(1);
        }
        self.drop_if_unused(tier, extent);
    }

    /// Removes an extent no block is indexed in or being written into.
    pub(super) fn drop_if_unused(&self, tier: usize, extent: u64) {
        let mut extents = self.extents.lock();
        let Some(u) = extents.get(&extent).copied() else {
            return;
        };
        if u.live == 0 && u.writing == 0 {
            extents.remove(&extent);
            let _ = fs::remove_file(self.extent_path(tier, extent));
            self.tiers[tier].used.fetch_sub(u.size, Ordering::Relaxed);
        }
    }

    /// Forgets every block being written into a run (a new block manager
    /// has no reservations, so none can be committed any more); extents
    /// left with no block go. Returns how many blocks were forgotten.
    pub fn abandon_runs(&self) -> u64 {
        let runs = std::mem::take(&mut *self.in_runs.lock());
        let n = runs.len() as u64;
        for (_, (tier, extent)) in runs {
            if let Some(u) = self.extents.lock().get_mut(&extent) {
                u.writing = u.writing.saturating_sub(1);
            }
            self.drop_if_unused(tier, extent);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::store::TierInfo;
    use curvine_messages::block::BlockRecord;

    fn open(dir: &std::path::Path) -> BlockStore {
        let tiers = vec![TierInfo {
            kind: TierKind::Mem,
            root: dir.join("mem"),
            capacity: 64 << 20,
        }];
        BlockStore::open(&dir.join("index"), tiers, false)
            .unwrap()
            .0
    }

    fn record(len: u64, extent: u64, offset: u64) -> BlockRecord {
        BlockRecord {
            tier: 0,
            kind: TierKind::Mem,
            len,
            crcs: vec![0],
            created_ns: 1,
            last_access_ns: 1,
            extent: Some(ExtentRef { id: extent, offset }),
        }
    }

    /// The block's record goes, as when its file is removed.
    fn remove(store: &BlockStore, id: BlockId, record: &BlockRecord) {
        store.delete(id).unwrap();
        store.release_file(id, record);
    }

    #[test]
    fn a_runs_extent_lives_while_blocks_are_written_into_it_and_goes_with_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let (extent, path) = store.new_run(0);
        fs::write(&path, vec![1u8; 250]).unwrap();
        store.join_run(1, 0, extent);
        store.join_run(2, 0, extent);
        store.join_run(3, 0, extent);
        // Committed blocks count up to the furthest committed byte.
        store.put(1, &record(100, extent, 0)).unwrap();
        store.commit_run(1, 100);
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (100, 1));
        // The only committed block leaves: the file stays for the writers.
        remove(&store, 1, &record(100, extent, 0));
        assert!(path.exists());
        store.put(2, &record(100, extent, 100)).unwrap();
        store.commit_run(2, 200);
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (200, 1));
        // The last writer gives up: the file stays for its indexed block,
        // then goes with it, and the tier counts nothing.
        store.leave_run(3);
        assert!(path.exists());
        remove(&store, 2, &record(100, extent, 100));
        assert!(!path.exists());
        assert_eq!((store.stats()[0].used, store.stats()[0].blocks), (0, 0));
    }

    #[test]
    fn a_restarted_manager_forgets_blocks_being_written_and_their_empty_extents() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let (kept, kept_path) = store.new_run(0);
        let (empty, empty_path) = store.new_run(0);
        fs::write(&kept_path, vec![1u8; 20]).unwrap();
        fs::write(&empty_path, vec![1u8; 20]).unwrap();
        store.join_run(1, 0, kept);
        store.join_run(2, 0, kept);
        store.join_run(3, 0, empty);
        store.put(1, &record(10, kept, 0)).unwrap();
        store.commit_run(1, 10);
        assert_eq!(store.abandon_runs(), 2);
        assert!(kept_path.exists() && !empty_path.exists());
        // The extent now goes with its one committed block.
        remove(&store, 1, &record(10, kept, 0));
        assert!(!kept_path.exists());
        assert_eq!(store.stats()[0].used, 0);
    }
}

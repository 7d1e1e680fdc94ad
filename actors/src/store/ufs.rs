//! What inodes mirror of their UFS objects: a directory brought in line
//! with a listing, a file refreshed, the cached blocks of UFS files, the
//! outcome of persisting a file, and eviction of cached blocks.

use crate::txn::WriteTxn;

use curvine_messages::block::{BlockId, BlockInfo, FileSpec};
use curvine_messages::mount::{Persist, UfsFile, UfsState};
use curvine_messages::{Attr, FileKind, FsError, FsResult, Ino, NewInode};

use super::keys::{key_block, key_pending};
use super::{lmdb_err, ShardStore};

impl ShardStore {
    /// Sets (or clears) what inode `ino` mirrors of its UFS object.
    pub fn set_ufs(&self, wtxn: &mut WriteTxn, ino: Ino, ufs: Option<UfsState>) -> FsResult<Attr> {
        let mut attr = self.getattr(wtxn, ino)?;
        attr.ufs = ufs;
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// Brings the files named in `files` under directory `parent` in line
    /// with their UFS objects: a missing name becomes a file of the
    /// object's length (no blocks: its bytes are read from the UFS), a file
    /// whose object changed gets the new length and time and loses its
    /// cached blocks, an unchanged one is marked checked. Files open for
    /// writing, files not from the UFS (being written in cache_mode, not yet
    /// persisted in fs_mode) and names that are directories here are left
    /// alone. Returns each file as it is afterwards.
    pub fn ufs_sync(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        mount: u32,
        files: &[UfsFile],
        owner: &NewInode,
        spec: &FileSpec,
    ) -> FsResult<Vec<(String, Attr)>> {
        self.dir(wtxn, parent)?;
        let now = owner.now_ns;
        let mut out = Vec::with_capacity(files.len());
        let mut added = false;
        for f in files {
            curvine_messages::path::check_name(&f.name)?;
            let state = UfsState::synced(mount, f.len, f.mtime_ns, f.etag.clone(), now);
            match self.dentry(wtxn, parent, &f.name)? {
                None => {
                    if self.lock_holder(wtxn, parent, &f.name)?.is_some() {
                        continue;
                    }
                    let ino = self.alloc_ino(wtxn)?;
                    let mut attr = Self::new_attr(ino, owner, parent);
                    attr.size = f.len;
                    attr.block_size = spec.block_size;
                    attr.replicas = spec.replicas;
                    attr.storage = spec.storage;
                    if f.mtime_ns > 0 {
                        attr.mtime_ns = f.mtime_ns;
                        attr.ctime_ns = f.mtime_ns;
                    }
                    attr.ufs = Some(state);
                    self.put_inode(wtxn, &attr)?;
                    self.put_dentry(wtxn, parent, &f.name, ino, FileKind::File)?;
                    added = true;
                    out.push((f.name.clone(), attr));
                }
                Some(d) if d.kind == FileKind::File && self.is_local(d.ino) => {
                    let attr = self.ufs_refresh(wtxn, d.ino, mount, f, now)?;
                    out.push((f.name.clone(), attr));
                }
                Some(_) => {}
            }
        }
        if added {
            self.touch_dir(wtxn, parent, 0, now)?;
        }
        Ok(out)
    }

    /// Compares UFS file `ino` with the UFS object `f` as it is now: a
    /// changed object gives the file its length and time and drops its
    /// cached blocks; either way the file is marked checked at `now`.
    /// Files open for writing and files whose content is not (yet) the
    /// UFS object's are left as they are.
    pub fn ufs_refresh(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        mount: u32,
        f: &UfsFile,
        now: i64,
    ) -> FsResult<Attr> {
        let mut attr = self.getattr(wtxn, ino)?;
        let mirrored = matches!(
            &attr.ufs,
            Some(u) if u.mount == mount && u.persist == Persist::Synced
        );
        if attr.kind != FileKind::File || attr.writing.is_some() || !mirrored {
            return Ok(attr);
        }
        let unchanged = attr
            .ufs
            .as_ref()
            .is_some_and(|u| u.matches(f.len, f.mtime_ns, &f.etag));
        if !unchanged {
            self.free_blocks_from(wtxn, ino, 0)?;
            attr.size = f.len;
            if f.mtime_ns > 0 {
                attr.mtime_ns = f.mtime_ns;
            }
            attr.ctime_ns = now;
        }
        attr.ufs = Some(UfsState::synced(
            mount,
            f.len,
            f.mtime_ns,
            f.etag.clone(),
            now,
        ));
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// Allocates a block for the cached copy of block `index` of UFS file
    /// `ino`, when the file still mirrors the UFS object `expect` and has no
    /// such block yet (`None` otherwise: the caller reads the UFS without
    /// caching).
    pub fn ufs_add_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        index: u32,
        expect: &UfsFile,
    ) -> FsResult<Option<BlockId>> {
        let attr = self.getattr(wtxn, ino)?;
        if !ufs_current(&attr, expect) {
            return Ok(None);
        }
        if self
            .blocks
            .get(wtxn, &key_block(ino, index))
            .map_err(lmdb_err)?
            .is_some()
        {
            return Ok(None);
        }
        Ok(Some(self.alloc_pending_block(wtxn, ino, index)?))
    }

    /// Records a cached block of a UFS file filled by `ufs_add_block`'s
    /// grant. `false` (and the block freed) when the file no longer mirrors
    /// `expect` or another copy got there first.
    pub fn ufs_commit_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        info: &BlockInfo,
        expect: &UfsFile,
    ) -> FsResult<bool> {
        let pending_key = key_pending(ino, info.id);
        let was_pending = self
            .pending
            .get(wtxn, &pending_key)
            .map_err(lmdb_err)?
            .is_some();
        if !was_pending {
            return Err(FsError::InvalidArgument(format!(
                "block {:#x} was not allocated to file {ino:#x}",
                info.id
            )));
        }
        self.pending.delete(wtxn, &pending_key).map_err(lmdb_err)?;
        let key = key_block(ino, info.index);
        let attr = self.inode(wtxn, ino)?;
        let fits = attr.as_ref().is_some_and(|a| {
            let bs = a.block_size.max(1);
            ufs_current(a, expect)
                && info.len <= bs
                && (info.index as u64) * bs + info.len <= a.size
        });
        let taken = self.blocks.get(wtxn, &key).map_err(lmdb_err)?.is_some();
        if !fits || taken {
            self.free_block(wtxn, info.id, info.locs.clone())?;
            return Ok(false);
        }
        self.record_block(wtxn, ino, info)?;
        Ok(true)
    }

    /// Stores the outcome of persisting `ino` while it still waits with
    /// content written at `since_ns`.
    pub fn ufs_persisted(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        since_ns: i64,
        state: &UfsState,
    ) -> FsResult<bool> {
        let Some(mut attr) = self.inode(wtxn, ino)? else {
            return Ok(false);
        };
        let waiting = attr
            .ufs
            .as_ref()
            .and_then(|u| u.persist.since_ns())
            .is_some_and(|s| s == since_ns);
        if !waiting || attr.writing.is_some() {
            return Ok(false);
        }
        attr.ufs = Some(state.clone());
        self.put_inode(wtxn, &attr)?;
        Ok(true)
    }

    /// Gives up block `id` allocated by `ufs_add_block` and never committed.
    pub fn ufs_abort_block(&self, wtxn: &mut WriteTxn, ino: Ino, id: BlockId) -> FsResult<()> {
        let key = key_pending(ino, id);
        if self.pending.get(wtxn, &key).map_err(lmdb_err)?.is_some() {
            self.pending.delete(wtxn, &key).map_err(lmdb_err)?;
            self.free_block(wtxn, id, Vec::new())?;
        }
        Ok(())
    }

    /// Drops the cached blocks of a UFS-backed file (its bytes stay in the
    /// UFS and are read from there again). Refused for a file whose content
    /// is not in the UFS.
    pub fn ufs_evict(&self, wtxn: &mut WriteTxn, ino: Ino) -> FsResult<u32> {
        let attr = self.getattr(wtxn, ino)?;
        match &attr.ufs {
            Some(u) if u.persist == Persist::Synced && attr.writing.is_none() => {}
            _ => {
                return Err(FsError::Busy(
                    "the file's content is not in the UFS yet".into(),
                ))
            }
        }
        let n = self.file_blocks(wtxn, ino)?.len() as u32;
        self.free_blocks_from(wtxn, ino, 0)?;
        Ok(n)
    }
}

/// Whether a file still mirrors the UFS object `expect`.
fn ufs_current(attr: &Attr, expect: &UfsFile) -> bool {
    attr.kind == FileKind::File
        && attr.writing.is_none()
        && attr.size == expect.len
        && attr.ufs.as_ref().is_some_and(|u| {
            u.persist == Persist::Synced && u.matches(expect.len, expect.mtime_ns, &expect.etag)
        })
}

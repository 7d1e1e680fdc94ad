//! A file's data in its shard: committed blocks (`blocks`), what each block
//! id is used for (`owners`), blocks handed to writers and not yet closed
//! (`pending`), blocks to remove from their nodes (`freed`), and the write
//! lease.

use std::collections::BTreeMap;
use std::ops::Bound;

use heed::RoTxn;

use crate::txn::WriteTxn;

use curvine_messages::block::{BlockId, BlockInfo, BlockOwner, BlockUse, CopyDrop, FreedBlock};
use curvine_messages::codec::encode_versioned;
use curvine_messages::mount::{Persist, UfsState};
use curvine_messages::shard::{NewFile, OpenForWrite};
use curvine_messages::{now_ns, Attr, FileKind, FsError, FsResult, Ino, NewInode};

use super::keys::{ino_from, key_block, key_ino, key_pending};
use super::{decode, lmdb_err, ShardStore};

impl ShardStore {
    /// Committed blocks of a file, in index order.
    pub fn file_blocks(&self, txn: &RoTxn, ino: Ino) -> FsResult<Vec<BlockInfo>> {
        let mut out = Vec::new();
        for item in self
            .blocks
            .prefix_iter(txn, &key_ino(ino))
            .map_err(lmdb_err)?
        {
            out.push(decode(item.map_err(lmdb_err)?.1)?);
        }
        Ok(out)
    }

    /// A file's attributes and committed blocks.
    pub fn file_with_blocks(&self, txn: &RoTxn, ino: Ino) -> FsResult<(Attr, Vec<BlockInfo>)> {
        let attr = self.getattr(txn, ino)?;
        match attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::IsADirectory(String::new())),
            other => {
                return Err(FsError::InvalidArgument(format!(
                    "a {} has no data",
                    other.name()
                )))
            }
        }
        let blocks = self.file_blocks(txn, ino)?;
        Ok((attr, blocks))
    }

    pub(super) fn free_block(
        &self,
        wtxn: &mut WriteTxn,
        id: BlockId,
        locs: Vec<String>,
    ) -> FsResult<()> {
        self.owners.delete(wtxn, &key_ino(id)).map_err(lmdb_err)?;
        self.freed
            .put(
                wtxn,
                &key_ino(id),
                &encode_versioned(&FreedBlock { id, locs }),
            )
            .map_err(lmdb_err)
    }

    /// Frees the committed blocks of `ino` from index `first` on.
    pub(super) fn free_blocks_from(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        first: u32,
    ) -> FsResult<()> {
        let start = key_block(ino, first);
        let end = key_ino(ino + 1);
        let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
        let mut dropped = Vec::new();
        for item in self.blocks.range(wtxn, &range).map_err(lmdb_err)? {
            let info: BlockInfo = decode(item.map_err(lmdb_err)?.1)?;
            dropped.push(info);
        }
        for info in dropped {
            self.blocks
                .delete(wtxn, &key_block(ino, info.index))
                .map_err(lmdb_err)?;
            self.free_block(wtxn, info.id, info.locs)?;
        }
        Ok(())
    }

    /// Frees blocks allocated to writers of `ino` and never committed.
    pub(super) fn free_pending(&self, wtxn: &mut WriteTxn, ino: Ino) -> FsResult<()> {
        let mut ids = Vec::new();
        for item in self
            .pending
            .prefix_iter(wtxn, &key_ino(ino))
            .map_err(lmdb_err)?
        {
            let (key, _) = item.map_err(lmdb_err)?;
            ids.push(ino_from(&key[8..])?);
        }
        for id in ids {
            self.pending
                .delete(wtxn, &key_pending(ino, id))
                .map_err(lmdb_err)?;
            // Where a pending block was written is not recorded: every node is asked.
            self.free_block(wtxn, id, Vec::new())?;
        }
        Ok(())
    }

    /// Drops the blocks past a new, smaller size and shortens the last one.
    pub(super) fn truncate_blocks(
        &self,
        wtxn: &mut WriteTxn,
        attr: &Attr,
        size: u64,
    ) -> FsResult<()> {
        let bs = attr.block_size;
        if bs == 0 {
            return Ok(());
        }
        let keep = size.div_ceil(bs);
        self.free_blocks_from(wtxn, attr.ino, keep.min(u32::MAX as u64) as u32)?;
        if !size.is_multiple_of(bs) {
            let index = (size / bs) as u32;
            let key = key_block(attr.ino, index);
            let current = self.blocks.get(wtxn, &key).map_err(lmdb_err)?;
            if let Some(bytes) = current {
                let mut info: BlockInfo = decode(bytes)?;
                if info.len > size % bs {
                    info.len = size % bs;
                    self.blocks
                        .put(wtxn, &key, &encode_versioned(&info))
                        .map_err(lmdb_err)?;
                }
            }
        }
        Ok(())
    }

    /// The file `ino`, checking that `handle` holds its write lease.
    fn leased_file(&self, txn: &RoTxn, ino: Ino, handle: u64) -> FsResult<Attr> {
        let attr = self.getattr(txn, ino)?;
        match &attr.writing {
            Some(lease) if lease.handle == handle => Ok(attr),
            Some(lease) => Err(FsError::InUse(format!(
                "the file was taken over by writer {} (this writer's lease expired)",
                lease.client
            ))),
            None => Err(FsError::InvalidArgument(
                "the file is not open for writing by this writer".into(),
            )),
        }
    }

    /// Takes the write lease of an existing file.
    pub fn open_write(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        open: &OpenForWrite,
    ) -> FsResult<(Attr, Vec<BlockInfo>, Option<BlockId>)> {
        let OpenForWrite {
            lease,
            spec,
            truncate,
            lease_timeout_ns,
            first_block,
        } = open;
        let (truncate, lease_timeout_ns, first_block) =
            (*truncate, *lease_timeout_ns, *first_block);
        let (mut attr, _) = self.file_with_blocks(wtxn, ino)?;
        let now = now_ns();
        if let Some(held) = &attr.writing {
            if held.handle != lease.handle && now - held.renewed_ns < lease_timeout_ns {
                return Err(FsError::InUse(format!(
                    "the file is being written by {}",
                    held.client
                )));
            }
            // An expired writer: its uncommitted blocks go.
            self.free_pending(wtxn, ino)?;
        }
        if truncate && attr.size > 0 {
            self.free_blocks_from(wtxn, ino, 0)?;
            attr.size = 0;
            attr.mtime_ns = now;
        }
        if attr.block_size == 0 || (attr.size == 0 && truncate) {
            attr.block_size = spec.block_size;
            attr.replicas = spec.replicas;
            if spec.storage.is_some() {
                attr.storage = spec.storage;
            }
        }
        attr.ctime_ns = now;
        attr.writing = Some(lease.clone());
        self.put_inode(wtxn, &attr)?;
        let first = match first_block {
            Some(at_end) => {
                let index = if at_end {
                    attr.size / attr.block_size.max(1)
                } else {
                    0
                };
                Some(self.add_block(wtxn, ino, lease.handle, index.min(u32::MAX as u64) as u32)?)
            }
            None => None,
        };
        let blocks = self.file_blocks(wtxn, ino)?;
        Ok((attr, blocks, first))
    }

    /// Creates a file for a writer (with its lease) and allocates its first
    /// block, in one transaction.
    pub fn create_file(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        attrs: &NewInode,
        file: &NewFile,
    ) -> FsResult<(Attr, BlockId)> {
        let lease = file.lease.clone().ok_or_else(|| {
            FsError::InvalidArgument("creating a file for a writer needs its lease".into())
        })?;
        let attr = self.create(wtxn, parent, name, attrs, Some(file))?;
        let block = self.add_block(wtxn, attr.ino, lease.handle, 0)?;
        let attr = self.getattr(wtxn, attr.ino)?;
        Ok((attr, block))
    }

    /// A new block id for block `index` of `ino`, recorded as pending (freed
    /// by the file's next completion unless committed).
    pub(super) fn alloc_pending_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        index: u32,
    ) -> FsResult<BlockId> {
        let id = self.alloc_ino(wtxn)?;
        let owner = BlockOwner {
            ino,
            index,
            pending: true,
        };
        self.owners
            .put(wtxn, &key_ino(id), &encode_versioned(&owner))
            .map_err(lmdb_err)?;
        // When it was handed out (see `reclaim_pending`).
        self.pending
            .put(wtxn, &key_pending(ino, id), &now_ns().to_be_bytes())
            .map_err(lmdb_err)?;
        Ok(id)
    }

    /// Frees blocks handed out but never committed whose writer is gone: the
    /// file's lease was last renewed before `lease_before_ns` (a writer that
    /// died; the lease is cleared too), or, for blocks of a file nobody
    /// writes (UFS fills), handed out before `fill_before_ns`. Returns the
    /// files concerned.
    pub fn reclaim_pending(
        &self,
        wtxn: &mut WriteTxn,
        lease_before_ns: i64,
        fill_before_ns: i64,
    ) -> FsResult<u32> {
        let mut by_file: BTreeMap<Ino, Vec<(BlockId, i64)>> = BTreeMap::new();
        for item in self.own(self.pending, wtxn)? {
            let (k, v) = item.map_err(lmdb_err)?;
            let at = v.try_into().map(i64::from_be_bytes).unwrap_or(0);
            by_file
                .entry(ino_from(k)?)
                .or_default()
                .push((ino_from(&k[8..])?, at));
        }
        let mut files = 0;
        for (ino, blocks) in by_file {
            let attr = self.inode(wtxn, ino)?;
            let stale: Vec<BlockId> = match attr.as_ref().and_then(|a| a.writing.as_ref()) {
                Some(lease) if lease.renewed_ns >= lease_before_ns => continue,
                Some(_) => blocks.iter().map(|(id, _)| *id).collect(),
                None => blocks
                    .iter()
                    .filter(|(_, at)| *at < fill_before_ns)
                    .map(|(id, _)| *id)
                    .collect(),
            };
            if stale.is_empty() {
                continue;
            }
            for id in stale {
                self.pending
                    .delete(wtxn, &key_pending(ino, id))
                    .map_err(lmdb_err)?;
                self.free_block(wtxn, id, Vec::new())?;
            }
            if let Some(mut attr) = attr.filter(|a| a.writing.is_some()) {
                attr.writing = None;
                self.put_inode(wtxn, &attr)?;
            }
            files += 1;
        }
        Ok(files)
    }

    /// Allocates block `index` of a file being written, renewing the lease.
    pub fn add_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        handle: u64,
        index: u32,
    ) -> FsResult<BlockId> {
        let mut attr = self.leased_file(wtxn, ino, handle)?;
        let id = self.alloc_pending_block(wtxn, ino, index)?;
        if let Some(lease) = attr.writing.as_mut() {
            lease.renewed_ns = now_ns();
        }
        self.put_inode(wtxn, &attr)?;
        Ok(id)
    }

    /// Closes a written file: switches in its new blocks, sets its size and
    /// releases the lease. Checks every block was allocated to this file at
    /// that index, so a confused writer cannot graft another file's data.
    pub fn complete_file(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        handle: u64,
        size: u64,
        blocks: &[BlockInfo],
    ) -> FsResult<Attr> {
        self.complete_file_with(wtxn, ino, handle, size, blocks, None)
    }

    /// `complete_file` that also sets the file's UFS state (when `Some`).
    pub fn complete_file_with(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        handle: u64,
        size: u64,
        blocks: &[BlockInfo],
        ufs: Option<UfsState>,
    ) -> FsResult<Attr> {
        let mut attr = self.leased_file(wtxn, ino, handle)?;
        let bs = attr.block_size.max(1);
        for b in blocks {
            let owner: Option<BlockOwner> =
                match self.owners.get(wtxn, &key_ino(b.id)).map_err(lmdb_err)? {
                    Some(v) => Some(decode(v)?),
                    None => None,
                };
            match owner {
                Some(o) if o.ino == ino && o.index == b.index && o.pending => {}
                _ => {
                    return Err(FsError::InvalidArgument(format!(
                        "block {:#x} was not allocated to this file at index {}",
                        b.id, b.index
                    )))
                }
            }
            if b.len > bs || b.stored < b.len || (b.index as u64) * bs >= size.max(1) && b.len > 0 {
                return Err(FsError::InvalidArgument(format!(
                    "block {:#x} at index {} claims {} bytes, which does not fit a file of {size} bytes in blocks of {bs}",
                    b.id, b.index, b.len
                )));
            }
            let key = key_block(ino, b.index);
            let old = self.blocks.get(wtxn, &key).map_err(lmdb_err)?;
            if let Some(old) = old {
                let old: BlockInfo = decode(old)?;
                if old.id != b.id {
                    self.free_block(wtxn, old.id, old.locs)?;
                }
            }
            self.record_block(wtxn, ino, b)?;
        }
        self.free_pending(wtxn, ino)?;
        if size < attr.size {
            self.truncate_blocks(wtxn, &attr, size)?;
        }
        // A writer that wrote nothing (no blocks, same size) leaves the
        // times alone, as closing an unwritten file does on Linux.
        if !blocks.is_empty() || size != attr.size {
            let now = now_ns();
            attr.mtime_ns = now;
            attr.ctime_ns = now;
        }
        attr.size = size;
        attr.writing = None;
        if ufs.is_some() {
            attr.ufs = ufs;
        }
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// Makes pending block `info` block `info.index` of file `ino`.
    pub(super) fn record_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        info: &BlockInfo,
    ) -> FsResult<()> {
        self.blocks
            .put(wtxn, &key_block(ino, info.index), &encode_versioned(info))
            .map_err(lmdb_err)?;
        let owner = BlockOwner {
            ino,
            index: info.index,
            pending: false,
        };
        self.owners
            .put(wtxn, &key_ino(info.id), &encode_versioned(&owner))
            .map_err(lmdb_err)?;
        self.pending
            .delete(wtxn, &key_pending(ino, info.id))
            .map(|_| ())
            .map_err(lmdb_err)
    }

    /// What each block id is used for.
    /// What each block is used for, as seen from `node`: a committed block
    /// whose nodes do not include `node` is unknown there (a stale copy).
    pub fn check_blocks(
        &self,
        txn: &RoTxn,
        ids: &[BlockId],
        node: &str,
    ) -> FsResult<Vec<BlockUse>> {
        ids.iter()
            .map(|&id| {
                let owner = match self.owners.get(txn, &key_ino(id)).map_err(lmdb_err)? {
                    Some(v) => decode::<BlockOwner>(v)?,
                    None => return Ok(BlockUse::Unknown),
                };
                if owner.pending {
                    return Ok(BlockUse::Pending);
                }
                let here = match self
                    .blocks
                    .get(txn, &key_block(owner.ino, owner.index))
                    .map_err(lmdb_err)?
                {
                    Some(v) => {
                        let info: BlockInfo = decode(v)?;
                        info.id == id && (node.is_empty() || info.locs.iter().any(|l| l == node))
                    }
                    None => false,
                };
                Ok(if here {
                    BlockUse::Live
                } else {
                    BlockUse::Unknown
                })
            })
            .collect()
    }

    /// Up to `limit` committed blocks after `(ino, index)`, with their file's
    /// replica count.
    pub fn scan_blocks(
        &self,
        txn: &RoTxn,
        after: Option<(Ino, u32)>,
        limit: u32,
    ) -> FsResult<Vec<(Ino, u16, BlockInfo)>> {
        let start: Vec<u8> = match after {
            Some((ino, index)) => match index.checked_add(1) {
                Some(next) => key_block(ino, next).to_vec(),
                None => key_block(ino + 1, 0).to_vec(),
            },
            None => vec![self.shard as u8],
        };
        let range = (Bound::Included(start.as_slice()), Bound::Unbounded);
        let mut out = Vec::new();
        let mut replicas: Option<(Ino, u16)> = None;
        for item in self.blocks.range(txn, &range).map_err(lmdb_err)? {
            let (k, v) = item.map_err(lmdb_err)?;
            if k.first() != Some(&(self.shard as u8)) || out.len() >= limit as usize {
                break;
            }
            let ino = ino_from(k)?;
            let info: BlockInfo = decode(v)?;
            let wanted = match replicas {
                Some((i, r)) if i == ino => r,
                _ => {
                    let r = self.inode(txn, ino)?.map(|a| a.replicas).unwrap_or(1);
                    replicas = Some((ino, r));
                    r
                }
            };
            out.push((ino, wanted, info));
        }
        Ok(out)
    }

    /// Sets the nodes of a committed block that is still `id`.
    pub fn set_locs(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        index: u32,
        id: BlockId,
        locs: &[String],
    ) -> FsResult<bool> {
        let key = key_block(ino, index);
        let Some(v) = self.blocks.get(wtxn, &key).map_err(lmdb_err)? else {
            return Ok(false);
        };
        let mut info: BlockInfo = decode(v)?;
        if info.id != id {
            return Ok(false);
        }
        info.locs = locs.to_vec();
        self.blocks
            .put(wtxn, &key, &encode_versioned(&info))
            .map_err(lmdb_err)?;
        Ok(true)
    }

    /// A bad copy of block `id` on `node`: forgets it when the data is whole
    /// elsewhere (see `ShardMsg::DropCopy`); without `apply` only says what
    /// it would do.
    pub fn drop_copy(
        &self,
        wtxn: &mut WriteTxn,
        id: BlockId,
        node: &str,
        apply: bool,
    ) -> FsResult<CopyDrop> {
        let Some(v) = self.owners.get(wtxn, &key_ino(id)).map_err(lmdb_err)? else {
            return Ok(CopyDrop::Unused);
        };
        let owner: BlockOwner = decode(v)?;
        if owner.pending {
            // Its writer has not closed the file: the block is not data yet
            // that anyone relies on, and the writer owns it.
            return Ok(CopyDrop::OnlyCopy);
        }
        let key = key_block(owner.ino, owner.index);
        let Some(v) = self.blocks.get(wtxn, &key).map_err(lmdb_err)? else {
            return Ok(CopyDrop::Unused);
        };
        let mut info: BlockInfo = decode(v)?;
        if info.id != id || !info.locs.iter().any(|n| n == node) {
            return Ok(CopyDrop::Unused);
        }
        if info.locs.len() > 1 {
            info.locs.retain(|n| n != node);
            if apply {
                self.blocks
                    .put(wtxn, &key, &encode_versioned(&info))
                    .map_err(lmdb_err)?;
            }
            return Ok(CopyDrop::Dropped {
                left: info.locs.len() as u32,
            });
        }
        let attr = self.inode(wtxn, owner.ino)?;
        let closed_in_ufs = |synced: bool| {
            attr.as_ref().is_some_and(|a| {
                a.writing.is_none()
                    && a.ufs
                        .as_ref()
                        .is_some_and(|u| (u.persist == Persist::Synced) == synced)
            })
        };
        if closed_in_ufs(false) {
            return Ok(CopyDrop::Uploading);
        }
        if !closed_in_ufs(true) {
            return Ok(CopyDrop::OnlyCopy);
        }
        if apply {
            self.blocks.delete(wtxn, &key).map_err(lmdb_err)?;
            self.free_block(wtxn, id, vec![node.to_string()])?;
        }
        Ok(CopyDrop::Refetch)
    }

    /// Up to `limit` freed blocks still to remove from their nodes.
    pub fn take_freed(&self, txn: &RoTxn, limit: u32) -> FsResult<Vec<FreedBlock>> {
        let mut out = Vec::new();
        for item in self.own(self.freed, txn)? {
            if out.len() >= limit as usize {
                break;
            }
            out.push(decode(item.map_err(lmdb_err)?.1)?);
        }
        Ok(out)
    }

    pub fn forget_freed(&self, wtxn: &mut WriteTxn, ids: &[BlockId]) -> FsResult<()> {
        for id in ids {
            self.freed.delete(wtxn, &key_ino(*id)).map_err(lmdb_err)?;
        }
        Ok(())
    }
}

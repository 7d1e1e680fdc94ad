//! Inodes (`inodes`) and directory entries (`dentries`): reads, and the
//! mutations that stay in one shard (create, mkdir, setattr, unlink, rmdir,
//! rename).

use std::ops::Bound;

use heed::RoTxn;

use crate::txn::WriteTxn;

use curvine_messages::codec::encode_versioned;
use curvine_messages::shard::{
    DentryValue, Intent, IntentOp, NewFile, RenameOutcome, UnlinkOutcome,
};
use curvine_messages::{
    now_ns, Attr, DirEntry, FileKind, FsError, FsResult, Ino, NewInode, SetAttr,
};

use super::keys::{delete_id_prefix, key_ino, key_name, name_of_key};
use super::{decode, lmdb_err, ShardStore};

impl ShardStore {
    // ---- reads -------------------------------------------------------------

    /// An inode this shard owns. Inodes of other shards are never visible,
    /// even when they share the environment.
    pub fn inode(&self, txn: &RoTxn, ino: Ino) -> FsResult<Option<Attr>> {
        if !self.is_local(ino) {
            return Ok(None);
        }
        match self.inodes.get(txn, &key_ino(ino)).map_err(lmdb_err)? {
            Some(bytes) => Ok(Some(decode(bytes)?)),
            None => Ok(None),
        }
    }

    pub fn getattr(&self, txn: &RoTxn, ino: Ino) -> FsResult<Attr> {
        self.inode(txn, ino)?
            .ok_or_else(|| FsError::NotFound(format!("inode {ino:#x}")))
    }

    /// A directory of this shard, or ENOENT/ENOTDIR.
    pub(super) fn dir(&self, txn: &RoTxn, ino: Ino) -> FsResult<Attr> {
        if !self.is_local(ino) {
            return Err(FsError::Io(format!(
                "directory {ino:#x} is not held by shard {}",
                self.shard
            )));
        }
        let attr = self.getattr(txn, ino)?;
        if attr.kind != FileKind::Dir {
            return Err(FsError::NotADirectory(String::new()));
        }
        Ok(attr)
    }

    pub fn dentry(&self, txn: &RoTxn, parent: Ino, name: &str) -> FsResult<Option<DentryValue>> {
        match self
            .dentries
            .get(txn, &key_name(parent, name))
            .map_err(lmdb_err)?
        {
            Some(bytes) => Ok(Some(decode(bytes)?)),
            None => Ok(None),
        }
    }

    /// The entry `parent/name`; `Busy` while an operation across shards
    /// holds the name (see [`Self::check_unlocked`]).
    pub fn lookup(&self, txn: &RoTxn, parent: Ino, name: &str) -> FsResult<DirEntry> {
        self.dir(txn, parent)?;
        self.check_unlocked(txn, parent, name, None)?;
        match self.dentry(txn, parent, name)? {
            Some(v) => Ok(DirEntry {
                name: name.to_string(),
                ino: v.ino,
                kind: v.kind,
            }),
            None => Err(FsError::NotFound(String::new())),
        }
    }

    /// [`Self::lookup`] plus the inode's attributes when it is held here.
    pub fn lookup_attr(
        &self,
        txn: &RoTxn,
        parent: Ino,
        name: &str,
    ) -> FsResult<(DirEntry, Option<Attr>)> {
        let entry = self.lookup(txn, parent, name)?;
        let attr = if self.is_local(entry.ino) {
            self.inode(txn, entry.ino)?
        } else {
            None
        };
        Ok((entry, attr))
    }

    pub fn readdir(
        &self,
        txn: &RoTxn,
        ino: Ino,
        after: Option<&str>,
        limit: u32,
    ) -> FsResult<Vec<DirEntry>> {
        self.dir(txn, ino)?;
        let start = key_name(ino, after.unwrap_or(""));
        let end = key_name(ino + 1, "");
        let lower = if after.is_some() {
            Bound::Excluded(start.as_slice())
        } else {
            Bound::Included(start.as_slice())
        };
        let range = (lower, Bound::Excluded(end.as_slice()));
        let mut out = Vec::new();
        for item in self.dentries.range(txn, &range).map_err(lmdb_err)? {
            if out.len() >= limit as usize {
                break;
            }
            let (key, value) = item.map_err(lmdb_err)?;
            let v: DentryValue = decode(value)?;
            out.push(DirEntry {
                name: name_of_key(key),
                ino: v.ino,
                kind: v.kind,
            });
        }
        Ok(out)
    }

    /// [`Self::readdir`] with the attributes of entries whose inode is held here.
    pub fn readdir_plus(
        &self,
        txn: &RoTxn,
        ino: Ino,
        after: Option<&str>,
        limit: u32,
    ) -> FsResult<Vec<(DirEntry, Option<Attr>)>> {
        self.readdir(txn, ino, after, limit)?
            .into_iter()
            .map(|entry| {
                let attr = self.inode(txn, entry.ino)?;
                Ok((entry, attr))
            })
            .collect()
    }

    /// Whether directory `ino` has entries; `Busy` while an operation
    /// across shards holds a name in it (a mkdir or rename into it not yet
    /// finished: the directory may be about to have that entry).
    /// Names held by `by` itself (a rename of a directory's own entry
    /// over the directory) do not count.
    pub(super) fn has_children(
        &self,
        txn: &RoTxn,
        ino: Ino,
        by: Option<curvine_messages::OpId>,
    ) -> FsResult<bool> {
        for lock in self
            .locks
            .prefix_iter(txn, &key_ino(ino))
            .map_err(lmdb_err)?
        {
            let (key, value) = lock.map_err(lmdb_err)?;
            let op = decode::<curvine_messages::shard::NameLock>(value)?.op;
            if Some(op) == by {
                continue;
            }
            let name = name_of_key(key);
            return Err(FsError::Busy(format!(
                "'{}' in directory {ino:#x} is being changed by operation {op:#x}",
                curvine_messages::names::shown(&name)
            )));
        }
        let mut iter = self
            .dentries
            .prefix_iter(txn, &key_ino(ino))
            .map_err(lmdb_err)?;
        Ok(iter.next().transpose().map_err(lmdb_err)?.is_some())
    }

    // ---- write helpers -----------------------------------------------------

    pub(super) fn put_inode(&self, wtxn: &mut WriteTxn, attr: &Attr) -> FsResult<()> {
        self.inodes
            .put(wtxn, &key_ino(attr.ino), &encode_versioned(attr))
            .map_err(lmdb_err)
    }

    pub(super) fn delete_inode(&self, wtxn: &mut WriteTxn, ino: Ino) -> FsResult<()> {
        self.inodes.delete(wtxn, &key_ino(ino)).map_err(lmdb_err)?;
        self.free_blocks_from(wtxn, ino, 0)?;
        self.free_pending(wtxn, ino)?;
        delete_id_prefix(self.xattrs, wtxn, ino)
    }

    pub(super) fn put_dentry(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        ino: Ino,
        kind: FileKind,
    ) -> FsResult<()> {
        self.dentries
            .put(
                wtxn,
                &key_name(parent, name),
                &encode_versioned(&DentryValue { ino, kind }),
            )
            .map_err(lmdb_err)
    }

    pub(super) fn delete_dentry(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
    ) -> FsResult<()> {
        self.dentries
            .delete(wtxn, &key_name(parent, name))
            .map_err(lmdb_err)
            .map(|_| ())
    }

    /// Updates a directory after its entries changed: times, and link count
    /// by `nlink_delta` (subdirectories added or removed).
    pub(super) fn touch_dir(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        nlink_delta: i32,
        now: i64,
    ) -> FsResult<()> {
        let mut dir = self.getattr(wtxn, ino)?;
        dir.nlink = (dir.nlink as i64 + nlink_delta as i64).max(2) as u32;
        dir.mtime_ns = now;
        dir.ctime_ns = now;
        self.put_inode(wtxn, &dir)
    }

    pub(super) fn new_attr(ino: Ino, attrs: &NewInode, parent: Ino) -> Attr {
        curvine_messages::shard::new_attr(ino, attrs, parent, None)
    }

    /// Decrements a local inode's link count, deleting it at zero.
    pub(super) fn drop_link_local(&self, wtxn: &mut WriteTxn, ino: Ino, now: i64) -> FsResult<()> {
        let Some(mut attr) = self.inode(wtxn, ino)? else {
            return Ok(());
        };
        if attr.nlink <= 1 || attr.kind == FileKind::Dir {
            self.delete_inode(wtxn, ino)
        } else {
            attr.nlink -= 1;
            attr.ctime_ns = now;
            self.put_inode(wtxn, &attr)
        }
    }

    /// Adds a link to local inode `ino` (not a directory): its link count
    /// goes up, its ctime to `now`.
    pub(super) fn add_link(&self, wtxn: &mut WriteTxn, ino: Ino, now: i64) -> FsResult<Attr> {
        let mut attr = self
            .inode(wtxn, ino)?
            .ok_or_else(|| FsError::NotFound(String::new()))?;
        if attr.kind == FileKind::Dir {
            return Err(FsError::NotPermitted(
                "a directory cannot have another name".into(),
            ));
        }
        if attr.nlink >= MAX_LINKS {
            return Err(FsError::LinkLimit(format!(
                "the file has {MAX_LINKS} names already"
            )));
        }
        attr.nlink += 1;
        attr.ctime_ns = now;
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// Checks that `parent` is a directory here where `name` is free: no
    /// entry, and not reserved by an operation in progress.
    pub(super) fn check_free_name(&self, wtxn: &WriteTxn, parent: Ino, name: &str) -> FsResult<()> {
        self.dir(wtxn, parent)?;
        self.check_unlocked(wtxn, parent, name, None)?;
        if self.dentry(wtxn, parent, name)?.is_some() {
            return Err(FsError::AlreadyExists(String::new()));
        }
        Ok(())
    }

    /// The entry `name` of directory `parent` here, which no operation in
    /// progress holds (NotFound when there is none).
    pub(super) fn named_entry(
        &self,
        wtxn: &WriteTxn,
        parent: Ino,
        name: &str,
    ) -> FsResult<DentryValue> {
        self.dir(wtxn, parent)?;
        self.check_unlocked(wtxn, parent, name, None)?;
        self.dentry(wtxn, parent, name)?
            .ok_or_else(|| FsError::NotFound(String::new()))
    }

    // ---- single-shard mutations --------------------------------------------

    /// Makes `name` in `parent` a new link to `ino` when this shard holds
    /// the inode too; `None`, having changed nothing, when it does not.
    pub fn link_local(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        parent: Ino,
        name: &str,
    ) -> FsResult<Option<Attr>> {
        self.check_free_name(wtxn, parent, name)?;
        if !self.is_local(ino) {
            return Ok(None);
        }
        let now = now_ns();
        let attr = self.add_link(wtxn, ino, now)?;
        self.put_dentry(wtxn, parent, name, ino, attr.kind)?;
        self.touch_dir(wtxn, parent, 0, now)?;
        Ok(Some(attr))
    }

    /// Creates a file or symlink with its inode in this shard.
    pub fn create(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        attrs: &NewInode,
        file: Option<&NewFile>,
    ) -> FsResult<Attr> {
        self.create_as(wtxn, parent, name, attrs, file, None)
    }

    /// [`Self::create`] with inode number `ino` when given (one set aside
    /// earlier, see `delegations`), a new one otherwise.
    pub(super) fn create_as(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        attrs: &NewInode,
        file: Option<&NewFile>,
        ino: Option<Ino>,
    ) -> FsResult<Attr> {
        if attrs.kind == FileKind::Dir {
            return Err(FsError::InvalidArgument(
                "create makes files and symlinks; use mkdir".into(),
            ));
        }
        self.check_free_name(wtxn, parent, name)?;
        let ino = match ino {
            Some(ino) => ino,
            None => self.alloc_ino(wtxn)?,
        };
        let attr = curvine_messages::shard::new_attr(ino, attrs, parent, file);
        self.put_inode(wtxn, &attr)?;
        self.put_dentry(wtxn, parent, name, ino, attr.kind)?;
        self.touch_dir(wtxn, parent, 0, attrs.now_ns)?;
        Ok(attr)
    }

    /// Creates a directory whose inode lives in this shard, like its parent.
    pub fn mkdir_local(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        attrs: &NewInode,
    ) -> FsResult<Attr> {
        self.check_free_name(wtxn, parent, name)?;
        let ino = self.alloc_ino(wtxn)?;
        let attr = Self::new_attr(
            ino,
            &NewInode {
                kind: FileKind::Dir,
                ..attrs.clone()
            },
            parent,
        );
        self.put_inode(wtxn, &attr)?;
        self.put_dentry(wtxn, parent, name, ino, FileKind::Dir)?;
        self.touch_dir(wtxn, parent, 1, attrs.now_ns)?;
        Ok(attr)
    }

    pub fn setattr(&self, wtxn: &mut WriteTxn, ino: Ino, set: &SetAttr) -> FsResult<Attr> {
        let mut attr = self.getattr(wtxn, ino)?;
        let now = now_ns();
        if let Some(size) = set.size {
            match attr.kind {
                FileKind::Dir => return Err(FsError::IsADirectory(String::new())),
                FileKind::File => {}
                other => {
                    return Err(FsError::InvalidArgument(format!(
                        "cannot truncate a {}",
                        other.name()
                    )))
                }
            }
            if size < attr.size {
                self.truncate_blocks(wtxn, &attr, size)?;
            }
            attr.size = size;
            attr.mtime_ns = now;
        }
        attr.apply(set, now);
        attr.ctime_ns = now;
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// Removes a file or symlink entry. Its inode goes with it when it is
    /// local; otherwise an intent to drop the remote link is recorded.
    pub fn unlink(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str) -> FsResult<UnlinkOutcome> {
        let entry = self.named_entry(wtxn, parent, name)?;
        if entry.kind == FileKind::Dir {
            return Err(FsError::IsADirectory(String::new()));
        }
        let now = now_ns();
        self.delete_dentry(wtxn, parent, name)?;
        self.touch_dir(wtxn, parent, 0, now)?;
        let removed = DirEntry {
            name: name.to_string(),
            ino: entry.ino,
            kind: entry.kind,
        };
        if self.is_local(entry.ino) {
            self.drop_link_local(wtxn, entry.ino, now)?;
            Ok(UnlinkOutcome::Done(removed))
        } else {
            let op = self.alloc_op(wtxn)?;
            let intent = Intent {
                op,
                action: IntentOp::DropLink { ino: entry.ino },
                created_ns: now,
                aborting: false,
            };
            self.intents
                .put(wtxn, &key_ino(op), &encode_versioned(&intent))
                .map_err(lmdb_err)?;
            Ok(UnlinkOutcome::Pending(removed, intent))
        }
    }

    /// Removes an empty directory whose inode lives here.
    pub fn rmdir_local(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str) -> FsResult<DirEntry> {
        let entry = self.named_entry(wtxn, parent, name)?;
        if entry.kind != FileKind::Dir {
            return Err(FsError::NotADirectory(String::new()));
        }
        if !self.is_local(entry.ino) {
            return Err(FsError::Io(format!(
                "directory {:#x} is not held by shard {}",
                entry.ino, self.shard
            )));
        }
        if self.has_children(wtxn, entry.ino, None)? {
            return Err(FsError::NotEmpty(String::new()));
        }
        self.delete_inode(wtxn, entry.ino)?;
        self.delete_dentry(wtxn, parent, name)?;
        self.touch_dir(wtxn, parent, -1, now_ns())?;
        Ok(DirEntry {
            name: name.to_string(),
            ino: entry.ino,
            kind: entry.kind,
        })
    }

    /// Renames between two directories of this shard when every inode the
    /// rename changes is here too; otherwise answers `NeedsIntent` and changes nothing.
    pub fn rename_local(
        &self,
        wtxn: &mut WriteTxn,
        src_parent: Ino,
        src_name: &str,
        dst_parent: Ino,
        dst_name: &str,
    ) -> FsResult<RenameOutcome> {
        self.dir(wtxn, src_parent)?;
        self.dir(wtxn, dst_parent)?;
        self.check_unlocked(wtxn, src_parent, src_name, None)?;
        self.check_unlocked(wtxn, dst_parent, dst_name, None)?;
        let src = self
            .dentry(wtxn, src_parent, src_name)?
            .ok_or_else(|| FsError::NotFound(String::new()))?;
        if src_parent == dst_parent && src_name == dst_name {
            return Ok(RenameOutcome::Done);
        }
        let dst = self.dentry(wtxn, dst_parent, dst_name)?;
        let moves_dir = src.kind == FileKind::Dir && src_parent != dst_parent;
        if moves_dir && !self.is_local(src.ino) {
            return Ok(RenameOutcome::NeedsIntent);
        }
        if let Some(d) = dst {
            if d.ino == src.ino {
                return Ok(RenameOutcome::Done);
            }
            check_rename_kinds(src.kind, d.kind)?;
            if !self.is_local(d.ino) {
                return Ok(RenameOutcome::NeedsIntent);
            }
            if d.kind == FileKind::Dir && self.has_children(wtxn, d.ino, None)? {
                return Err(FsError::NotEmpty(String::new()));
            }
        }
        let now = now_ns();
        let mut dst_delta = 0;
        if let Some(d) = dst {
            if d.kind == FileKind::Dir {
                self.delete_inode(wtxn, d.ino)?;
                dst_delta -= 1;
            } else {
                self.drop_link_local(wtxn, d.ino, now)?;
            }
        }
        self.delete_dentry(wtxn, src_parent, src_name)?;
        self.put_dentry(wtxn, dst_parent, dst_name, src.ino, src.kind)?;
        if moves_dir {
            let mut attr = self.getattr(wtxn, src.ino)?;
            attr.parent = dst_parent;
            attr.ctime_ns = now;
            self.put_inode(wtxn, &attr)?;
            self.touch_dir(wtxn, src_parent, -1, now)?;
            dst_delta += 1;
        } else {
            if self.is_local(src.ino) {
                // A rename changes the inode's ctime, as Linux file systems do.
                let mut attr = self.getattr(wtxn, src.ino)?;
                attr.ctime_ns = now;
                self.put_inode(wtxn, &attr)?;
            }
            if src_parent != dst_parent {
                self.touch_dir(wtxn, src_parent, 0, now)?;
            }
        }
        self.touch_dir(wtxn, dst_parent, dst_delta, now)?;
        Ok(RenameOutcome::Done)
    }
}

/// Most names one inode may have (ext4's limit): `link` answers EMLINK past it.
pub const MAX_LINKS: u32 = 65_000;

/// POSIX rules for what a rename may replace.
pub fn check_rename_kinds(src: FileKind, dst: FileKind) -> FsResult<()> {
    match (src == FileKind::Dir, dst == FileKind::Dir) {
        (true, false) => Err(FsError::NotADirectory(String::new())),
        (false, true) => Err(FsError::IsADirectory(String::new())),
        _ => Ok(()),
    }
}

//! Directory delegations (see `curvine_messages::delegation`): which mount
//! holds which directory of this shard, the grant (the directory's entries
//! and inode numbers set aside) and the holder's batched changes. The
//! shard actor keeps the leases and recalls; this table is what survives
//! a restart or a new leader, so a directory a mount may still be
//! answering for is never handed to anyone else unasked.

use std::ops::Bound;

use heed::RoTxn;

use crate::txn::WriteTxn;

use curvine_messages::block::WriteLease;
use curvine_messages::codec::encode_versioned;
use curvine_messages::delegation::{
    DelegationRecord, DirGrant, DirOp, DirOpDone, DELEGATION_LEASE_MS, MAX_GRANT_INOS,
};
use curvine_messages::shard::NewFile;
use curvine_messages::{make_id, FileKind, FsError, FsResult, Ino};

use super::keys::{ino_from, key_ino, key_name};
use super::{decode, lmdb_err, ShardStore};

impl ShardStore {
    /// The mount holding directory `dir`, if any.
    pub fn delegation(&self, txn: &RoTxn, dir: Ino) -> FsResult<Option<u64>> {
        match self.delegations.get(txn, &key_ino(dir)).map_err(lmdb_err)? {
            Some(v) => Ok(Some(decode::<DelegationRecord>(v)?.holder)),
            None => Ok(None),
        }
    }

    /// Every delegated directory of this shard and its holder.
    pub fn delegations(&self, txn: &RoTxn) -> FsResult<Vec<(Ino, u64)>> {
        let mut out = Vec::new();
        for item in self.own(self.delegations, txn)? {
            let (k, v) = item.map_err(lmdb_err)?;
            out.push((ino_from(k)?, decode::<DelegationRecord>(v)?.holder));
        }
        Ok(out)
    }

    /// Delegates directory `dir` to `holder` (again, for its holder: a
    /// fresh listing and more inode numbers), listing its entries and
    /// setting `inos` inode numbers aside. `InUse` while another mount
    /// holds it or an operation across shards holds one of its names (an
    /// entry about to appear that the listing would miss); `TooBig` above
    /// `max_entries` entries.
    pub fn grant_delegation(
        &self,
        wtxn: &mut WriteTxn,
        dir: Ino,
        holder: u64,
        inos: u32,
        max_entries: u32,
    ) -> FsResult<DirGrant> {
        match self.delegation(wtxn, dir)? {
            Some(h) if h != holder => {
                return Err(FsError::InUse(format!(
                    "directory {dir:#x} is delegated to another mount"
                )))
            }
            _ => {}
        }
        let (attr, entries) = self.grant_check(wtxn, dir, max_entries)?;
        let inos = inos.clamp(1, MAX_GRANT_INOS);
        let mut meta = self.meta(wtxn)?;
        meta.next_ino = meta.next_ino.max(wtxn.id_floor());
        let first_ino = make_id(self.shard, meta.next_ino);
        meta.next_ino += u64::from(inos);
        self.meta
            .put(wtxn, &self.meta_key, &encode_versioned(&meta))
            .map_err(lmdb_err)?;
        self.delegations
            .put(
                wtxn,
                &key_ino(dir),
                &encode_versioned(&DelegationRecord { holder }),
            )
            .map_err(lmdb_err)?;
        Ok(DirGrant {
            dir: attr,
            entries,
            first_ino,
            inos,
            lease_ms: DELEGATION_LEASE_MS,
            spec: Default::default(),
            plain: false,
        })
    }

    /// What a grant of `dir` checks and lists: the directory and its
    /// entries; `InUse` while an operation across shards holds one of its
    /// names, `TooBig` above `max_entries` entries.
    pub fn grant_check(
        &self,
        txn: &RoTxn,
        dir: Ino,
        max_entries: u32,
    ) -> FsResult<(curvine_messages::Attr, Vec<curvine_messages::DirEntry>)> {
        let attr = self.dir(txn, dir)?;
        let start = key_name(dir, "");
        let end = key_name(dir + 1, "");
        let range = (
            Bound::Included(start.as_slice()),
            Bound::Excluded(end.as_slice()),
        );
        if self
            .locks
            .range(txn, &range)
            .map_err(lmdb_err)?
            .next()
            .is_some()
        {
            return Err(FsError::InUse(format!(
                "an operation in progress holds a name in directory {dir:#x}"
            )));
        }
        let entries = self.readdir(txn, dir, None, max_entries.saturating_add(1))?;
        if entries.len() > max_entries as usize {
            return Err(FsError::TooBig(format!(
                "directory {dir:#x} has more than {max_entries} entries"
            )));
        }
        Ok((attr, entries))
    }

    /// Ends the delegation of `dir` when `holder` holds it (any holder's
    /// when `None`: it expired).
    pub fn end_delegation(
        &self,
        wtxn: &mut WriteTxn,
        dir: Ino,
        holder: Option<u64>,
    ) -> FsResult<()> {
        match self.delegation(wtxn, dir)? {
            Some(h) if holder.is_none_or(|mine| mine == h) => {
                self.delegations
                    .delete(wtxn, &key_ino(dir))
                    .map_err(lmdb_err)?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Applies `holder`'s changes in its delegated directory `dir`, in
    /// order; a change that fails leaves nothing and the next ones go on.
    /// `Stale` when `holder` does not hold `dir`.
    pub fn dir_ops(
        &self,
        wtxn: &mut WriteTxn,
        dir: Ino,
        holder: u64,
        ops: &[DirOp],
    ) -> FsResult<Vec<FsResult<DirOpDone>>> {
        if self.delegation(wtxn, dir)? != Some(holder) {
            return Err(FsError::Stale(format!(
                "directory {dir:#x} is no longer delegated to this mount"
            )));
        }
        let next = make_id(self.shard, self.meta(wtxn)?.next_ino);
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(match op {
                DirOp::Create {
                    name,
                    ino,
                    attrs,
                    spec,
                    lease,
                    complete,
                } => {
                    let new = Delegated {
                        name,
                        ino: *ino,
                        attrs,
                        file: NewFile {
                            spec: spec.clone(),
                            // Created complete: nobody writes it.
                            lease: (!*complete).then(|| lease.clone()),
                        },
                        lease,
                        complete: *complete,
                    };
                    self.delegated_create(wtxn, dir, next, &new)
                }
                DirOp::Rename { from, to, ino } => self.delegated_rename(wtxn, dir, from, to, *ino),
            });
        }
        Ok(out)
    }

    /// One create of [`Self::dir_ops`]: with inode `ino`, which must have
    /// been set aside (below `next`) and not be in use. The same create
    /// made again (a batch sent twice) finds its file and answers it.
    fn delegated_create(
        &self,
        wtxn: &mut WriteTxn,
        dir: Ino,
        next: Ino,
        new: &Delegated<'_>,
    ) -> FsResult<DirOpDone> {
        let (name, ino, lease) = (new.name, new.ino, new.lease);
        if !self.is_local(ino) || ino >= next || new.attrs.kind != FileKind::File {
            return Err(FsError::InvalidArgument(format!(
                "inode {ino:#x} was not set aside for this directory's creates"
            )));
        }
        if let Some(attr) = self.inode(wtxn, ino)? {
            let writer = attr.writing.as_ref().map(|l| l.handle);
            let same = self.dentry(wtxn, dir, name)?.is_some_and(|d| d.ino == ino)
                && (if new.complete {
                    writer.is_none()
                } else {
                    writer == Some(lease.handle)
                });
            if !same {
                return Err(FsError::InvalidArgument(format!(
                    "inode {ino:#x} is already in use"
                )));
            }
            if new.complete {
                return Ok(DirOpDone::Created {
                    attr: Box::new(attr),
                    block: None,
                });
            }
            let block = self.add_block(wtxn, ino, lease.handle, 0)?;
            return Ok(DirOpDone::Created {
                attr: Box::new(attr),
                block: Some(block),
            });
        }
        curvine_messages::path::check_name(name)?;
        let attr = self.create_as(wtxn, dir, name, new.attrs, Some(&new.file), Some(ino))?;
        if new.complete {
            return Ok(DirOpDone::Created {
                attr: Box::new(attr),
                block: None,
            });
        }
        let block = self.add_block(wtxn, ino, lease.handle, 0)?;
        let attr = self.getattr(wtxn, attr.ino)?;
        Ok(DirOpDone::Created {
            attr: Box::new(attr),
            block: Some(block),
        })
    }
}

impl ShardStore {
    /// One rename of [`Self::dir_ops`]: file `from` (inode `ino`) to `to`,
    /// which the holder saw absent; done already when `to` names `ino`.
    fn delegated_rename(
        &self,
        wtxn: &mut WriteTxn,
        dir: Ino,
        from: &str,
        to: &str,
        ino: Ino,
    ) -> FsResult<DirOpDone> {
        curvine_messages::path::check_name(to)?;
        if self.dentry(wtxn, dir, to)?.is_some_and(|d| d.ino == ino)
            && self.dentry(wtxn, dir, from)?.is_none()
        {
            return Ok(DirOpDone::Renamed);
        }
        match self.dentry(wtxn, dir, from)? {
            Some(d) if d.ino == ino && d.kind == FileKind::File => {}
            _ => {
                return Err(FsError::NotFound(format!(
                    "'{from}' is not the file the mount renamed"
                )))
            }
        }
        if self.dentry(wtxn, dir, to)?.is_some() {
            return Err(FsError::AlreadyExists(to.to_string()));
        }
        match self.rename_local(wtxn, dir, from, dir, to)? {
            curvine_messages::shard::RenameOutcome::Done => Ok(DirOpDone::Renamed),
            curvine_messages::shard::RenameOutcome::NeedsIntent => Err(FsError::Io(format!(
                "renaming '{from}' to '{to}' in one directory needed another shard"
            ))),
        }
    }
}

/// A create of [`ShardStore::dir_ops`], borrowed from its [`DirOp`].
struct Delegated<'a> {
    name: &'a str,
    ino: Ino,
    attrs: &'a curvine_messages::NewInode,
    /// The layout, and the lease unless created complete.
    file: NewFile,
    lease: &'a WriteLease,
    complete: bool,
}

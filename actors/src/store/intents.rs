//! Cross-shard operations: their intents (`intents`), the names they
//! reserve (`locks`) and the recorded results of their steps (`ops`), which
//! make every step idempotent.

use heed::RoTxn;
use serde::{Deserialize, Serialize};

use crate::txn::WriteTxn;

use curvine_messages::codec::{encode_versioned, Versioned};
use curvine_messages::shard::{Intent, IntentOp, NameLock, Step, StepResult};
use curvine_messages::{
    now_ns, shard_of, DirEntry, FileKind, FsError, FsResult, Ino, NewInode, OpId,
};

use super::keys::{ino_from, key_ino, key_name, key_step};
use super::{decode, lmdb_err, ShardStore};

/// The recorded result of one step, with when it was applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub at_ns: i64,
    pub result: StepResult,
}

impl Versioned for StepRecord {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "step record";
}

impl ShardStore {
    pub fn intents(&self, txn: &RoTxn) -> FsResult<Vec<Intent>> {
        let mut out = Vec::new();
        for item in self.own(self.intents, txn)? {
            let (_, v) = item.map_err(lmdb_err)?;
            out.push(decode(v)?);
        }
        Ok(out)
    }

    fn intent(&self, txn: &RoTxn, op: OpId) -> FsResult<Intent> {
        match self.intents.get(txn, &key_ino(op)).map_err(lmdb_err)? {
            Some(v) => decode(v),
            None => Err(FsError::NotFound(format!("operation {op:#x}"))),
        }
    }

    pub(super) fn lock_holder(
        &self,
        txn: &RoTxn,
        parent: Ino,
        name: &str,
    ) -> FsResult<Option<OpId>> {
        match self
            .locks
            .get(txn, &key_name(parent, name))
            .map_err(lmdb_err)?
        {
            Some(v) => Ok(Some(decode::<NameLock>(v)?.op)),
            None => Ok(None),
        }
    }

    /// Fails with `Busy` when another operation holds `parent/name`.
    pub(super) fn check_unlocked(
        &self,
        txn: &RoTxn,
        parent: Ino,
        name: &str,
        by: Option<OpId>,
    ) -> FsResult<()> {
        match self.lock_holder(txn, parent, name)? {
            Some(holder) if Some(holder) != by => Err(FsError::Busy(format!(
                "'{name}' is being changed by operation {holder:#x}"
            ))),
            _ => Ok(()),
        }
    }

    fn lock_name(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str, op: OpId) -> FsResult<()> {
        self.locks
            .put(
                wtxn,
                &key_name(parent, name),
                &encode_versioned(&NameLock { op }),
            )
            .map_err(lmdb_err)
    }

    fn unlock_name(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str, op: OpId) -> FsResult<()> {
        if self.lock_holder(wtxn, parent, name)? == Some(op) {
            self.locks
                .delete(wtxn, &key_name(parent, name))
                .map_err(lmdb_err)?;
        }
        Ok(())
    }

    /// Validates a cross-shard operation, reserves its name and records it.
    pub fn begin_intent(&self, wtxn: &mut WriteTxn, action: &IntentOp) -> FsResult<Intent> {
        let action = match action.clone() {
            IntentOp::Mkdir {
                parent,
                name,
                attrs,
                child_shard,
            } => {
                self.check_free_name(wtxn, parent, &name)?;
                IntentOp::Mkdir {
                    parent,
                    name,
                    attrs,
                    child_shard,
                }
            }
            IntentOp::Rmdir { parent, name, .. } => {
                let entry = self.named_entry(wtxn, parent, &name)?;
                if entry.kind != FileKind::Dir {
                    return Err(FsError::NotADirectory(String::new()));
                }
                IntentOp::Rmdir {
                    parent,
                    name,
                    ino: entry.ino,
                }
            }
            IntentOp::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ..
            } => {
                let entry = self.named_entry(wtxn, src_parent, &src_name)?;
                IntentOp::Rename {
                    src_parent,
                    src_name,
                    dst_parent,
                    dst_name,
                    ino: entry.ino,
                    kind: entry.kind,
                }
            }
            IntentOp::DropLink { .. } => {
                return Err(FsError::InvalidArgument(
                    "drop-link intents are recorded by unlink".into(),
                ))
            }
            IntentOp::Exchange {
                a_parent,
                a_name,
                b_parent,
                b_name,
                ..
            } => {
                let entry = self.named_entry(wtxn, a_parent, &a_name)?;
                IntentOp::Exchange {
                    a_parent,
                    a_name,
                    b_parent,
                    b_name,
                    ino: entry.ino,
                    kind: entry.kind,
                }
            }
            IntentOp::Link { parent, name, ino } => {
                self.check_free_name(wtxn, parent, &name)?;
                IntentOp::Link { parent, name, ino }
            }
        };
        let op = self.alloc_op(wtxn)?;
        match &action {
            IntentOp::Mkdir { parent, name, .. }
            | IntentOp::Rmdir { parent, name, .. }
            | IntentOp::Link { parent, name, .. } => self.lock_name(wtxn, *parent, name, op)?,
            IntentOp::Rename {
                src_parent: parent,
                src_name: name,
                ..
            }
            | IntentOp::Exchange {
                a_parent: parent,
                a_name: name,
                ..
            } => self.lock_name(wtxn, *parent, name, op)?,
            IntentOp::DropLink { .. } => {}
        }
        let intent = Intent {
            op,
            action,
            created_ns: now_ns(),
            aborting: false,
        };
        self.intents
            .put(wtxn, &key_ino(op), &encode_versioned(&intent))
            .map_err(lmdb_err)?;
        Ok(intent)
    }

    /// Marks intent `op` as rolling back. An intent no longer recorded was
    /// ended by another driver that rolled it back (no driver finishes an
    /// operation one of its steps refused).
    pub fn abort_intent(&self, wtxn: &mut WriteTxn, op: OpId) -> FsResult<()> {
        let mut intent = match self.intent(wtxn, op) {
            Err(FsError::NotFound(_)) => return Ok(()),
            other => other?,
        };
        intent.aborting = true;
        self.intents
            .put(wtxn, &key_ino(op), &encode_versioned(&intent))
            .map_err(lmdb_err)
    }

    /// Deletes a finished intent and the locks it still holds here.
    pub fn end_intent(&self, wtxn: &mut WriteTxn, op: OpId) -> FsResult<()> {
        if let Ok(intent) = self.intent(wtxn, op) {
            match &intent.action {
                IntentOp::Mkdir { parent, name, .. }
                | IntentOp::Rmdir { parent, name, .. }
                | IntentOp::Link { parent, name, .. } => {
                    self.unlock_name(wtxn, *parent, name, op)?
                }
                IntentOp::Rename {
                    src_parent,
                    src_name,
                    dst_parent,
                    dst_name,
                    ..
                }
                | IntentOp::Exchange {
                    a_parent: src_parent,
                    a_name: src_name,
                    b_parent: dst_parent,
                    b_name: dst_name,
                    ..
                } => {
                    self.unlock_name(wtxn, *src_parent, src_name, op)?;
                    if shard_of(*dst_parent) == self.shard {
                        self.unlock_name(wtxn, *dst_parent, dst_name, op)?;
                    }
                }
                IntentOp::DropLink { .. } => {}
            }
        }
        // The step records stay (until swept by age): a step of this
        // operation that arrives late, from a second driver (the node that
        // started it retrying while this shard's node re-drove it after a
        // restart), returns its recorded result instead of applying again.
        self.intents.delete(wtxn, &key_ino(op)).map_err(lmdb_err)?;
        Ok(())
    }

    /// Deletes step records older than `before_ns` whose operation is no
    /// longer recorded as an intent here. Returns how many went.
    pub fn sweep_op_records(&self, wtxn: &mut WriteTxn, before_ns: i64) -> FsResult<u64> {
        let mut stale = Vec::new();
        let mut old_answers = Vec::new();
        for item in self.ops.iter(wtxn).map_err(lmdb_err)? {
            let (k, v) = item.map_err(lmdb_err)?;
            // Answers of calls recorded here by the release before the
            // `answers` table (`shard ++ 0xff ++ at ++ nonce`) go by age.
            if k.len() == 18 && k[1] == 0xff {
                let at = i64::from_be_bytes(k[2..10].try_into().expect("8 bytes"));
                if at < before_ns {
                    old_answers.push(k.to_vec());
                }
                continue;
            }
            if k.len() != 9 {
                continue;
            }
            let record: StepRecord = decode(v)?;
            if record.at_ns < before_ns {
                stale.push(k.to_vec());
            }
        }
        for k in old_answers {
            self.ops.delete(wtxn, &k).map_err(lmdb_err)?;
        }
        let mut removed = 0;
        for k in stale {
            let op = ino_from(&k)?;
            if self
                .intents
                .get(wtxn, &key_ino(op))
                .map_err(lmdb_err)?
                .is_none()
            {
                self.ops.delete(wtxn, &k).map_err(lmdb_err)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Applies one step of a cross-shard operation, or returns the result it
    /// had when it was applied before.
    pub fn apply_step(
        &self,
        wtxn: &mut WriteTxn,
        op: OpId,
        step_no: u8,
        step: &Step,
    ) -> FsResult<StepResult> {
        let key = key_step(op, step_no);
        if let Some(bytes) = self.ops.get(wtxn, &key).map_err(lmdb_err)? {
            return Ok(decode::<StepRecord>(bytes)?.result);
        }
        let now = now_ns();
        let result = match step {
            Step::CreateDirInode { attrs, parent } => {
                let ino = self.alloc_ino(wtxn)?;
                let attr = Self::new_attr(
                    ino,
                    &NewInode {
                        kind: FileKind::Dir,
                        ..attrs.clone()
                    },
                    *parent,
                );
                self.put_inode(wtxn, &attr)?;
                StepResult::Created(Box::new(attr))
            }
            Step::RemoveDirIfEmpty { ino } => {
                if self.inode(wtxn, *ino)?.is_some() {
                    if self.has_children(wtxn, *ino, Some(op))? {
                        return Err(FsError::NotEmpty(String::new()));
                    }
                    self.delete_inode(wtxn, *ino)?;
                }
                StepResult::Done
            }
            Step::DropLink { ino } => {
                self.drop_link_local(wtxn, *ino, now)?;
                StepResult::Done
            }
            Step::AddLink { ino } => StepResult::Created(Box::new(self.add_link(wtxn, *ino, now)?)),
            Step::SetDirParent { ino, parent } => {
                if let Some(mut attr) = self.inode(wtxn, *ino)? {
                    attr.parent = *parent;
                    attr.ctime_ns = now;
                    self.put_inode(wtxn, &attr)?;
                }
                StepResult::Done
            }
            Step::LockName { parent, name } => {
                self.dir(wtxn, *parent)?;
                self.check_unlocked(wtxn, *parent, name, Some(op))?;
                let existing = self.dentry(wtxn, *parent, name)?.map(|v| DirEntry {
                    name: name.clone(),
                    ino: v.ino,
                    kind: v.kind,
                });
                self.lock_name(wtxn, *parent, name, op)?;
                StepResult::Existing(existing)
            }
            Step::LinkName {
                parent,
                name,
                ino,
                kind,
            } => {
                self.check_unlocked(wtxn, *parent, name, Some(op))?;
                let replaced = self.dentry(wtxn, *parent, name)?;
                let mut delta = 0;
                if *kind == FileKind::Dir {
                    delta += 1;
                }
                if replaced.is_some_and(|r| r.kind == FileKind::Dir) {
                    delta -= 1;
                }
                self.put_dentry(wtxn, *parent, name, *ino, *kind)?;
                self.touch_dir(wtxn, *parent, delta, now)?;
                self.unlock_name(wtxn, *parent, name, op)?;
                StepResult::Done
            }
            Step::UnlinkName { parent, name, ino } => {
                if let Some(current) = self.dentry(wtxn, *parent, name)? {
                    if current.ino == *ino {
                        self.delete_dentry(wtxn, *parent, name)?;
                        let delta = if current.kind == FileKind::Dir { -1 } else { 0 };
                        self.touch_dir(wtxn, *parent, delta, now)?;
                    }
                }
                self.unlock_name(wtxn, *parent, name, op)?;
                StepResult::Done
            }
            Step::UnlockName { parent, name } => {
                self.unlock_name(wtxn, *parent, name, op)?;
                StepResult::Done
            }
            Step::Refuse { error } => StepResult::Refused(error.clone()),
        };
        let record = StepRecord {
            at_ns: now,
            result: result.clone(),
        };
        self.ops
            .put(wtxn, &key, &encode_versioned(&record))
            .map_err(lmdb_err)?;
        Ok(result)
    }
}

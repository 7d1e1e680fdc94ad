//! The shard actor's side of directory delegations (see
//! `curvine_messages::delegation`): the leases of the directories it
//! delegated, the recall of a directory when another client touches it,
//! and the delegation messages.
//!
//! Invariants:
//! - A directory the `delegations` table names is held until its holder
//!   releases it or its lease runs out; an actor that finds a record it
//!   has no lease for (after a restart, or as a new leader of the group)
//!   gives it a full lease from then, since the holder may have renewed it
//!   just before.
//! - A holder's entry goes into the lease map when its grant is submitted,
//!   before the grant is applied: any message that conflicts with it and
//!   comes later is refused, so nothing reaches the writer between the
//!   grant's listing and the holder's creates.
//! - After a recall the holder answers nothing new; it sends what it
//!   answered and releases. Its renewals and batches keep extending the
//!   lease meanwhile, for at most `RECALL_GRACE_MS` from the recall (a
//!   loaded host or a slow sync must not lose creates it acknowledged);
//!   a holder that goes quiet loses the directory a lease later.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ractor::RpcReplyPort;

use curvine_messages::delegation::DirOp;
use curvine_messages::delegation::{
    DirGrant, Renewal, DELEGATION_LEASE_MS, MAX_DELEGATED_ENTRIES, RECALL_GRACE_MS,
};
use curvine_messages::shard::{IntentOp, ShardMsg, Step};
use curvine_messages::trace::Outcome;
use curvine_messages::{FsError, FsResult, Ino};

use super::{answer, ShardState};

/// A directory in the lease map.
pub(super) enum Lease {
    Held(Held),
    /// Released or expired here (its record's deletion may still be on
    /// its way to the writer): nothing conflicts with it any more.
    Ended {
        term: u64,
    },
}

pub(super) struct Held {
    holder: u64,
    until: Instant,
    /// The group's term when the lease was taken or found (see
    /// `ShardState::lease_of`).
    term: u64,
    /// When the shard asked for the directory back.
    recalled: Option<Instant>,
    /// The holder's `AwaitRecall`, answered at the recall (or `false` at
    /// its next renewal).
    waiter: Option<RpcReplyPort<FsResult<bool>>>,
}

/// Leases of the directories this shard delegated.
#[derive(Default)]
pub(super) struct Delegations {
    map: HashMap<Ino, Lease>,
}

impl Delegations {
    /// Forgets every lease (the shard's records were replaced).
    pub(super) fn clear(&mut self) {
        for (_, lease) in self.map.drain() {
            if let Lease::Held(h) = lease {
                if let Some(w) = h.waiter {
                    answer(w, Ok(false));
                }
            }
        }
    }
}

fn lease() -> Duration {
    Duration::from_millis(u64::from(DELEGATION_LEASE_MS))
}

impl Held {
    /// A lease from now; after a recall, no later than the recall's grace.
    fn extend(&mut self) {
        let mut until = Instant::now() + lease();
        if let Some(at) = self.recalled {
            until = until.min(at + Duration::from_millis(u64::from(RECALL_GRACE_MS)));
        }
        self.until = self.until.max(until);
    }
}

/// The directories a message would read or change the entries of (or the
/// attributes, for `SetAttr` and xattrs), each with a name when only that
/// name's absence conflicts (a lookup: an existing entry is the same for
/// everyone). The holder's own changes come as `DirOps`, which is not here.
fn touched(message: &ShardMsg) -> Vec<(Ino, Option<&str>)> {
    match message {
        ShardMsg::Lookup { parent, name, .. } | ShardMsg::LookupAttr { parent, name, .. } => {
            vec![(*parent, Some(name.as_str()))]
        }
        ShardMsg::ReadDir { ino, .. }
        | ShardMsg::ReadDirPlus { ino, .. }
        | ShardMsg::SetAttr { ino, .. }
        | ShardMsg::SetXattr { ino, .. }
        | ShardMsg::RemoveXattr { ino, .. } => vec![(*ino, None)],
        ShardMsg::Create { parent, .. }
        | ShardMsg::CreateFile { parent, .. }
        | ShardMsg::MkdirLocal { parent, .. }
        | ShardMsg::Unlink { parent, .. }
        | ShardMsg::RmdirLocal { parent, .. }
        | ShardMsg::LinkLocal { parent, .. }
        | ShardMsg::UfsSync { parent, .. } => vec![(*parent, None)],
        ShardMsg::RenameLocal {
            src_parent,
            dst_parent,
            ..
        } => vec![(*src_parent, None), (*dst_parent, None)],
        ShardMsg::BeginIntent { action, .. } => match action {
            IntentOp::Mkdir { parent, .. } => vec![(*parent, None)],
            IntentOp::Rmdir { parent, ino, .. } => vec![(*parent, None), (*ino, None)],
            IntentOp::Rename {
                src_parent,
                dst_parent,
                ino,
                ..
            } => vec![(*src_parent, None), (*dst_parent, None), (*ino, None)],
            IntentOp::DropLink { .. } => Vec::new(),
            IntentOp::Link { parent, .. } => vec![(*parent, None)],
            IntentOp::Exchange {
                a_parent,
                b_parent,
                ino,
                ..
            } => vec![(*a_parent, None), (*b_parent, None), (*ino, None)],
        },
        ShardMsg::ApplyStep { step, .. } => match step {
            Step::LockName { parent, .. }
            | Step::LinkName { parent, .. }
            | Step::UnlinkName { parent, .. } => vec![(*parent, None)],
            Step::RemoveDirIfEmpty { ino }
            | Step::SetDirParent { ino, .. }
            | Step::AddLink { ino } => vec![(*ino, None)],
            Step::CreateDirInode { .. }
            | Step::DropLink { .. }
            | Step::UnlockName { .. }
            | Step::Refuse { .. } => Vec::new(),
        },
        _ => Vec::new(),
    }
}

impl ShardState {
    /// The group's term now (0 for a shard without a group).
    fn term(&self) -> u64 {
        self.writer
            .status()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.store.shard)
            .map_or(0, |g| g.term)
    }

    /// The lease of directory `dir`, found in the `delegations` table when
    /// the map has none for this term. The map keeps only directories
    /// delegated here: a directory the table does not name leaves nothing.
    fn lease_of(&mut self, txn: &heed::RoTxn, dir: Ino, term: u64) -> Option<&mut Held> {
        let recorded = || matches!(self.store.delegation(txn, dir), Ok(Some(_)));
        match self.delegations.map.get(&dir) {
            Some(Lease::Held(h)) if h.term == term => {}
            // Ended here; its record's deletion may still be on its way.
            Some(Lease::Ended { term: t }) if *t == term => {
                if !recorded() {
                    self.delegations.map.remove(&dir);
                }
                return None;
            }
            _ => {
                let lease = match self.store.delegation(txn, dir) {
                    Ok(Some(holder)) => Some(Lease::Held(Held {
                        holder,
                        until: Instant::now() + lease(),
                        term,
                        recalled: None,
                        waiter: None,
                    })),
                    _ => None,
                };
                let old = match lease {
                    Some(l) => self.delegations.map.insert(dir, l),
                    None => self.delegations.map.remove(&dir),
                };
                if let Some(Lease::Held(Held {
                    waiter: Some(w), ..
                })) = old
                {
                    answer(w, Ok(false));
                }
            }
        }
        match self.delegations.map.get_mut(&dir) {
            Some(Lease::Held(h)) => Some(h),
            _ => None,
        }
    }

    /// Lets a message through unless it conflicts with a delegation: then
    /// the holder is asked to give the directory back and the message is
    /// answered `Busy` (its caller tries again); a holder whose lease ran
    /// out loses the directory and the message goes on.
    pub(super) fn check_delegations(&mut self, message: ShardMsg) -> Option<ShardMsg> {
        let touched = touched(&message);
        if touched.is_empty() {
            return Some(message);
        }
        let Ok(txn) = self.store.read_txn() else {
            // The message's own read or write reports the store's trouble.
            return Some(message);
        };
        let term = self.term();
        for (dir, name) in touched {
            let Some(held) = self.lease_of(&txn, dir, term) else {
                continue;
            };
            let holder = held.holder;
            if let Some(name) = name {
                if matches!(self.store.dentry(&txn, dir, name), Ok(Some(_))) {
                    continue;
                }
            }
            let Some(Lease::Held(held)) = self.delegations.map.get_mut(&dir) else {
                continue;
            };
            if held.until <= Instant::now() {
                tracing::info!(
                    shard = self.store.shard,
                    dir,
                    holder = format!("{holder:x}"),
                    "a directory's delegation ran out; taking it back"
                );
                self.end_lease(dir, term);
                self.write_unanswered(move |s, t| s.end_delegation(t, dir, Some(holder)));
                continue;
            }
            if held.recalled.is_none() {
                held.recalled = Some(Instant::now());
                if let Some(w) = held.waiter.take() {
                    answer(w, Ok(true));
                }
            }
            let e = FsError::Busy(format!(
                "directory {dir:#x} is delegated to mount {holder:x}, which is giving it back"
            ));
            if let Some(span) = self.span.take() {
                span.end(Outcome::Error(e.kind_name().to_string()));
            }
            message.fail(e);
            return None;
        }
        Some(message)
    }

    /// Marks `dir`'s lease ended, answering its holder's waiter.
    fn end_lease(&mut self, dir: Ino, term: u64) {
        if let Some(Lease::Held(old)) = self.delegations.map.insert(dir, Lease::Ended { term }) {
            if let Some(w) = old.waiter {
                answer(w, Ok(false));
            }
        }
    }

    /// The delegation messages.
    pub(super) fn delegation(&mut self, message: ShardMsg) {
        let term = self.term();
        let txn = match self.store.read_txn() {
            Ok(t) => t,
            Err(e) => return message.fail(e),
        };
        match message {
            ShardMsg::Delegate {
                dir,
                holder,
                inos,
                reply,
            } => {
                if let Some(h) = self.lease_of(&txn, dir, term) {
                    if h.holder == holder && h.recalled.is_some() {
                        // Asked back: its holder gives it back, not more.
                        return answer(
                            reply,
                            Err(FsError::InUse(format!(
                                "directory {dir:#x} is being given back"
                            ))),
                        );
                    }
                    if h.holder != holder {
                        if h.until > Instant::now() {
                            return answer(
                                reply,
                                Err(FsError::InUse(format!(
                                    "directory {dir:#x} is delegated to another mount"
                                ))),
                            );
                        }
                        let other = h.holder;
                        self.end_lease(dir, term);
                        self.write_unanswered(move |s, t| s.end_delegation(t, dir, Some(other)));
                    }
                }
                // What the grant would refuse is refused here, before the
                // lease is taken (a refused grant leaves no lease behind).
                if let Err(e) = self.store.grant_check(&txn, dir, MAX_DELEGATED_ENTRIES) {
                    return answer(reply, Err(e));
                }
                drop(txn);
                let waiter = match self.delegations.map.remove(&dir) {
                    Some(Lease::Held(h)) if h.holder == holder => h.waiter,
                    _ => None,
                };
                self.delegations.map.insert(
                    dir,
                    Lease::Held(Held {
                        holder,
                        until: Instant::now() + lease(),
                        term,
                        recalled: None,
                        waiter,
                    }),
                );
                self.write(reply, move |s, t| -> FsResult<DirGrant> {
                    s.grant_delegation(t, dir, holder, inos, MAX_DELEGATED_ENTRIES)
                });
            }
            ShardMsg::RenewDelegation { dir, holder, reply } => {
                match self.lease_of(&txn, dir, term) {
                    Some(h) if h.holder == holder => {
                        h.extend();
                        if let Some(w) = h.waiter.take() {
                            answer(w, Ok(false));
                        }
                        let recalled = h.recalled.is_some();
                        answer(
                            reply,
                            Ok(Renewal {
                                lease_ms: DELEGATION_LEASE_MS,
                                recalled,
                            }),
                        );
                    }
                    _ => answer(reply, Err(not_held(dir))),
                }
            }
            ShardMsg::AwaitRecall { dir, holder, reply } => match self.lease_of(&txn, dir, term) {
                Some(h) if h.holder == holder => {
                    if h.recalled.is_some() {
                        answer(reply, Ok(true));
                    } else if let Some(old) = h.waiter.replace(reply) {
                        answer(old, Ok(false));
                    }
                }
                _ => answer(reply, Err(not_held(dir))),
            },
            ShardMsg::DirOps {
                dir,
                holder,
                ops,
                reply,
            } => {
                // A batch is a sign of life, like a renewal.
                if let Some(h) = self.lease_of(&txn, dir, term) {
                    if h.holder == holder {
                        h.extend();
                    }
                }
                drop(txn);
                // Like a writer's `CreateFile`: a file made for a writer is
                // made durable by its close (or fsync), whose commit in
                // this shard comes later. A file created complete was
                // closed already, and the holder answers a rename once its
                // batch is back: such a batch is answered once durable.
                let early = ops.iter().all(DirOp::answered_before);
                self.write_when(reply, early, move |s, t| s.dir_ops(t, dir, holder, &ops));
            }
            ShardMsg::ReleaseDelegation { dir, holder, reply } => {
                if self
                    .lease_of(&txn, dir, term)
                    .is_some_and(|h| h.holder == holder)
                {
                    self.end_lease(dir, term);
                }
                drop(txn);
                self.write(reply, move |s, t| s.end_delegation(t, dir, Some(holder)));
            }
            other => super::misrouted(other),
        }
    }
}

fn not_held(dir: Ino) -> FsError {
    FsError::Stale(format!(
        "directory {dir:#x} is not delegated to this mount (any more)"
    ))
}

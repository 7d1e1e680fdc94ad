//! `NamespaceShard`: one shard of the namespace, over its own LMDB environment.
//!
//! Reads run in the actor against a short read transaction. Mutations are
//! handed to the writer thread of the shard's environment and answered after their group commit,
//! so the actor never waits on a disk flush and queued mutations share one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::de::DeserializeOwned;
use serde::Serialize;

use curvine_messages::shard::ShardMsg;
use curvine_messages::trace::{Outcome, TraceCtx, Traced};
use curvine_messages::{now_ns, FsResult, ReqId};

use crate::stats::{ActorStats, Metrics};
use crate::store::{AnswerAge, ShardStore, ANSWER_AGE_EVERY, REQUEST_RECORD_TTL};
use crate::trace::{outcome_of, Span, Tracer};
use crate::writer::Writer;

mod delegation;

pub struct NamespaceShard;

/// A shard's store is opened once when the node starts (LMDB must not open
/// databases while other transactions of the process run) and handed to
/// every incarnation of the shard's actor.
#[derive(Clone)]
pub struct ShardArgs {
    pub store: Arc<ShardStore>,
    pub group_commit_max: usize,
    pub commit_delay: Duration,
    pub op_record_ttl: Duration,
    /// How long a writer's lease lasts without renewal (`data.write_lease`).
    pub write_lease: Duration,
    pub tracer: Tracer,
    pub metrics: Metrics,
}

pub struct ShardState {
    store: Arc<ShardStore>,
    writer: Writer,
    /// The cluster's rename lock (used on shard 0): holder and lease end.
    rename_lock: Option<RenameLock>,
    tracer: Tracer,
    stats: Arc<ActorStats>,
    /// The actor's name in trace events (`shard-3`).
    name: String,
    /// The span of the message being handled, if it is traced; ended by
    /// the reply.
    span: Option<Span>,
    /// The call the message being handled is an attempt of.
    req: Option<ReqId>,
    /// Leases of the directories this shard delegated to mounts.
    delegations: delegation::Delegations,
    /// How long this member has seen the shard's generation of answers.
    answer_age: AnswerAge,
}

/// The least time left on a leader's lease for a read to rely on it (the
/// read's transaction opens a moment later).
const LEASE_MARGIN: std::time::Duration = std::time::Duration::from_millis(50);

fn answer<T>(reply: RpcReplyPort<FsResult<T>>, value: FsResult<T>) {
    // The caller may have timed out and gone; nothing to do then.
    let _ = reply.send(value);
}

/// A shard's group as a read sees it.
struct ReadView {
    /// More than one member: reads go through the leader.
    replicated: bool,
    serving: bool,
    lease_until: Option<std::time::Instant>,
}

/// The cluster's rename lock (see [`ShardState::rename_lock`]).
struct RenameLock {
    holder: String,
    /// The end of its lease.
    until: std::time::Instant,
    /// The term of shard 0's group in which it was taken.
    term: u64,
}

impl ShardState {
    /// The shard's Raft group as of its writer's last pass.
    fn group_status(&self) -> Option<crate::replica::GroupStatus> {
        self.writer
            .status()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.store.shard)
            .cloned()
    }

    /// What a read needs of the group's status, taken under its board's
    /// lock (every read asks: the member lists are not copied).
    fn read_view(&self) -> Option<ReadView> {
        self.writer
            .status()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.store.shard)
            .map(|g| ReadView {
                replicated: g.voters.len() + g.learners.len() > 1,
                serving: g.serving,
                lease_until: g.lease_until,
            })
    }

    fn read<T: Send + 'static>(
        &mut self,
        reply: RpcReplyPort<FsResult<T>>,
        f: impl FnOnce(&ShardStore, &heed::RoTxn) -> FsResult<T> + Send + 'static,
    ) {
        let status = self.read_view();
        let replicated = status.as_ref().is_some_and(|g| g.replicated);
        if !replicated {
            // One member: LMDB holds what the group committed.
            let result = self.store.read_txn().and_then(|txn| f(&self.store, &txn));
            if let Some(span) = self.span.take() {
                span.end(outcome_of(&result));
            }
            answer(reply, result);
            return;
        }
        // Several members: only the leader reads, once a quorum confirmed
        // it still leads and it applied what was committed then (Raft's
        // ReadIndex, or a lease from an earlier round), so no read returns
        // what an acknowledged change replaced; and it answers once what it
        // read is committed, so none returns what could be taken back.
        // Within a lease (a quorum confirmed this leader less than
        // `LEASE` ago) no other leader can exist: the read needs no round,
        // and one is asked in the background once half the lease is gone.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let now = std::time::Instant::now();
        let lease_left = status
            .as_ref()
            .filter(|g| g.serving)
            .and_then(|g| g.lease_until)
            .map(|until| until.saturating_duration_since(now))
            .unwrap_or_default();
        if lease_left > LEASE_MARGIN {
            if lease_left < crate::replica::LEASE / 2 {
                self.writer.read_barrier(Box::new(|_| {}));
            }
            let _ = tx.send(Ok(()));
        } else if status.is_some_and(|g| g.serving) {
            self.writer.read_barrier(Box::new(move |r| {
                let _ = tx.send(r);
            }));
        } else {
            let _ = tx.send(Err(curvine_messages::FsError::Unavailable(format!(
                "shard {}: this node is not the leader of its group",
                self.store.shard
            ))));
        }
        let store = self.store.clone();
        let span = self.span.take();
        let writer = self.writer.clone();
        tokio::spawn(async move {
            let stopped =
                || curvine_messages::FsError::Unavailable("the shard's writer stopped".into());
            let confirmed = rx.await.unwrap_or_else(|_| Err(stopped()));
            let read = confirmed.and_then(|()| store.read_txn()).and_then(|txn| {
                let seen = crate::replica::read_group_state(store.tables()[0], &txn, store.shard)?;
                Ok((f(&store, &txn), seen))
            });
            // The leader's state holds its changes from their proposal on:
            // the answer waits until what the read saw is committed.
            let result = match read {
                Err(e) => Err(e),
                Ok((result, None)) => result,
                Ok((result, Some(seen))) => {
                    let (index, term) = (seen.applied_index, seen.applied_term);
                    let committed = writer
                        .status()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&store.shard)
                        .is_some_and(|g| g.term == term && g.commit >= index);
                    if committed {
                        result
                    } else {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        writer.wait_committed(
                            index,
                            term,
                            Box::new(move |r| {
                                let _ = tx.send(r);
                            }),
                        );
                        rx.await.unwrap_or_else(|_| Err(stopped())).and(result)
                    }
                }
            };
            if let Some(span) = span {
                span.end(outcome_of(&result));
            }
            answer(reply, result);
        });
    }

    /// A mutation answered once committed. One that is an attempt of a
    /// call the shard answered before returns that answer, unapplied; one
    /// that succeeds records its answer with its changes.
    fn write<T, F>(&mut self, reply: RpcReplyPort<FsResult<T>>, f: F)
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        F: FnOnce(&ShardStore, &mut crate::txn::WriteTxn<'_>) -> FsResult<T> + Send + 'static,
    {
        self.write_when(reply, false, f)
    }

    /// [`Self::write`], answered as soon as the change is applied (before it
    /// is durable) when `early`: for a change a later durable one of the
    /// same caller makes durable (see [`crate::writer::Writer::submit_early`]).
    fn write_when<T, F>(&mut self, reply: RpcReplyPort<FsResult<T>>, early: bool, f: F)
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        F: FnOnce(&ShardStore, &mut crate::txn::WriteTxn<'_>) -> FsResult<T> + Send + 'static,
    {
        let store = self.store.clone();
        let req = self.req.take();
        self.writer.submit_with(
            move |txn| {
                let Some(req) = req else {
                    return f(&store, txn);
                };
                if let Some(answered) = store.answered(txn, req)? {
                    return Ok(answered);
                }
                let value = f(&store, txn)?;
                store.record_answer(txn, req, &value)?;
                Ok(value)
            },
            move |result| answer(reply, result),
            self.span.take(),
            early,
        );
    }

    /// A mutation nobody waits for (a message that may be lost).
    fn write_unanswered<F>(&mut self, f: F)
    where
        F: FnOnce(&ShardStore, &mut crate::txn::WriteTxn<'_>) -> FsResult<()> + Send + 'static,
    {
        let store = self.store.clone();
        self.writer
            .submit_traced(move |txn| f(&store, txn), |_| {}, self.span.take());
    }
}

impl ShardState {
    /// Hands a message to the handler of its group.
    fn dispatch(&mut self, message: ShardMsg, ctx: Option<TraceCtx>) {
        match message {
            m @ (ShardMsg::Lookup { .. }
            | ShardMsg::LookupAttr { .. }
            | ShardMsg::GetAttr { .. }
            | ShardMsg::ReadDir { .. }
            | ShardMsg::ReadDirPlus { .. }
            | ShardMsg::Create { .. }
            | ShardMsg::MkdirLocal { .. }
            | ShardMsg::SetAttr { .. }
            | ShardMsg::Unlink { .. }
            | ShardMsg::RmdirLocal { .. }
            | ShardMsg::RenameLocal { .. }
            | ShardMsg::LinkLocal { .. }) => self.namespace(m),
            m @ (ShardMsg::SetXattr { .. }
            | ShardMsg::GetXattr { .. }
            | ShardMsg::ListXattr { .. }
            | ShardMsg::RemoveXattr { .. }) => self.xattrs(m),
            m @ (ShardMsg::OpenWrite { .. }
            | ShardMsg::CreateFile { .. }
            | ShardMsg::AddBlock { .. }
            | ShardMsg::CompleteFile { .. }
            | ShardMsg::FileBlocks { .. }
            | ShardMsg::CheckBlocks { .. }
            | ShardMsg::TakeFreed { .. }
            | ShardMsg::ForgetFreed { .. }
            | ShardMsg::ReclaimPending { .. }
            | ShardMsg::ScanBlocks { .. }
            | ShardMsg::SetLocs { .. }
            | ShardMsg::DropCopy { .. }) => self.file_data(m),
            m @ (ShardMsg::BeginIntent { .. }
            | ShardMsg::AbortIntent { .. }
            | ShardMsg::ApplyStep { .. }
            | ShardMsg::EndIntent { .. }
            | ShardMsg::ListIntents { .. }
            | ShardMsg::SweepOps { .. }
            | ShardMsg::AgeAnswers { .. }) => self.intents(m),
            m @ (ShardMsg::GetMap { .. }
            | ShardMsg::SetMap { .. }
            | ShardMsg::GetMounts { .. }
            | ShardMsg::SetMounts { .. }
            | ShardMsg::JournalAppend { .. }
            | ShardMsg::JournalRead { .. }
            | ShardMsg::JournalTrim { .. }
            | ShardMsg::RecordPut { .. }
            | ShardMsg::RecordScan { .. }) => self.shard0_records(m, ctx),
            m @ (ShardMsg::SetUfs { .. }
            | ShardMsg::UfsSync { .. }
            | ShardMsg::UfsRefresh { .. }
            | ShardMsg::UfsPersisted { .. }
            | ShardMsg::UfsAddBlock { .. }
            | ShardMsg::UfsCommitBlock { .. }
            | ShardMsg::UfsAbortBlock { .. }
            | ShardMsg::UfsEvict { .. }) => self.ufs(m),
            m @ (ShardMsg::Stats { .. }
            | ShardMsg::Scan { .. }
            | ShardMsg::Digest { .. }
            | ShardMsg::Export { .. }
            | ShardMsg::Import { .. }
            | ShardMsg::DropAll { .. }
            | ShardMsg::Freeze { .. }
            | ShardMsg::Unfreeze { .. }) => self.whole_shard(m),
            m @ (ShardMsg::LockRenames { .. } | ShardMsg::UnlockRenames { .. }) => {
                self.rename_lock(m)
            }
            m @ (ShardMsg::Delegate { .. }
            | ShardMsg::RenewDelegation { .. }
            | ShardMsg::AwaitRecall { .. }
            | ShardMsg::DirOps { .. }
            | ShardMsg::ReleaseDelegation { .. }) => self.delegation(m),
        }
    }

    /// Refuses a message while the shard is being moved away.
    fn refuse_frozen(&mut self, message: ShardMsg) {
        let shard = self.store.shard;
        let e = curvine_messages::FsError::Unavailable(format!(
            "shard {shard} is moving to another node"
        ));
        if let Some(span) = self.span.take() {
            span.end(Outcome::Error(e.kind_name().to_string()));
        }
        message.fail(e);
    }

    /// Reads and single-shard changes of inodes and entries.
    fn namespace(&mut self, message: ShardMsg) {
        match message {
            ShardMsg::Lookup {
                parent,
                name,
                reply,
            } => self.read(reply, move |s, t| s.lookup(t, parent, &name)),
            ShardMsg::LookupAttr {
                parent,
                name,
                reply,
            } => self.read(reply, move |s, t| s.lookup_attr(t, parent, &name)),
            ShardMsg::GetAttr { ino, reply } => self.read(reply, move |s, t| s.getattr(t, ino)),
            ShardMsg::ReadDir {
                ino,
                after,
                limit,
                reply,
            } => self.read(reply, move |s, t| {
                s.readdir(t, ino, after.as_deref(), limit)
            }),
            ShardMsg::ReadDirPlus {
                ino,
                after,
                limit,
                reply,
            } => self.read(reply, move |s, t| {
                s.readdir_plus(t, ino, after.as_deref(), limit)
            }),
            ShardMsg::Create {
                parent,
                name,
                attrs,
                file,
                reply,
            } => self.write(reply, move |s, t| {
                s.create(t, parent, &name, &attrs, file.as_ref())
            }),
            ShardMsg::MkdirLocal {
                parent,
                name,
                attrs,
                reply,
            } => self.write(reply, move |s, t| s.mkdir_local(t, parent, &name, &attrs)),
            ShardMsg::SetAttr { ino, set, reply } => {
                self.write(reply, move |s, t| s.setattr(t, ino, &set))
            }
            ShardMsg::Unlink {
                parent,
                name,
                reply,
            } => self.write(reply, move |s, t| s.unlink(t, parent, &name)),
            ShardMsg::RmdirLocal {
                parent,
                name,
                reply,
            } => self.write(reply, move |s, t| s.rmdir_local(t, parent, &name)),
            ShardMsg::RenameLocal {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                reply,
            } => self.write(reply, move |s, t| {
                s.rename_local(t, src_parent, &src_name, dst_parent, &dst_name)
            }),
            ShardMsg::LinkLocal {
                ino,
                parent,
                name,
                reply,
            } => self.write(reply, move |s, t| s.link_local(t, ino, parent, &name)),
            other => misrouted(other),
        }
    }

    /// Extended attributes.
    fn xattrs(&mut self, message: ShardMsg) {
        match message {
            ShardMsg::SetXattr {
                ino,
                name,
                value,
                mode,
                reply,
            } => self.write(reply, move |s, t| s.set_xattr(t, ino, &name, &value, mode)),
            ShardMsg::GetXattr { ino, name, reply } => {
                self.read(reply, move |s, t| s.get_xattr(t, ino, &name))
            }
            ShardMsg::ListXattr { ino, reply } => {
                self.read(reply, move |s, t| s.list_xattr(t, ino))
            }
            ShardMsg::RemoveXattr { ino, name, reply } => {
                self.write(reply, move |s, t| s.remove_xattr(t, ino, &name))
            }
            other => misrouted(other),
        }
    }

    /// Files' data: writers and their leases, blocks and their nodes, freed
    /// blocks.
    fn file_data(&mut self, message: ShardMsg) {
        match message {
            ShardMsg::OpenWrite { ino, open, reply } => {
                self.write(reply, move |s, t| s.open_write(t, ino, &open))
            }
            ShardMsg::CreateFile {
                parent,
                name,
                attrs,
                file,
                reply,
            } => {
                // A file made by its writer's open is made durable by its
                // close (or fsync), whose commit in this shard comes after
                // this one: the open is answered once the file is applied.
                self.write_when(reply, true, move |s, t| {
                    s.create_file(t, parent, &name, &attrs, &file)
                })
            }
            ShardMsg::AddBlock {
                ino,
                handle,
                index,
                reply,
            } => self.write(reply, move |s, t| s.add_block(t, ino, handle, index)),
            ShardMsg::CompleteFile {
                ino,
                handle,
                size,
                blocks,
                ufs,
                set,
                reply,
            } => self.write(reply, move |s, t| {
                let attr = s.complete_file_with(t, ino, handle, size, &blocks, ufs.clone())?;
                match &set {
                    Some(set) if set.size.is_none() => s.setattr(t, ino, set),
                    Some(_) => Err(curvine_messages::FsError::InvalidArgument(
                        "a file's close cannot also change its size".into(),
                    )),
                    None => Ok(attr),
                }
            }),
            ShardMsg::FileBlocks { ino, reply } => {
                self.read(reply, move |s, t| s.file_with_blocks(t, ino))
            }
            ShardMsg::CheckBlocks { ids, node, reply } => {
                self.read(reply, move |s, t| s.check_blocks(t, &ids, &node))
            }
            ShardMsg::TakeFreed { limit, reply } => {
                self.read(reply, move |s, t| s.take_freed(t, limit))
            }
            ShardMsg::ForgetFreed { ids } => {
                self.write_unanswered(move |s, t| s.forget_freed(t, &ids))
            }
            ShardMsg::ReclaimPending {
                lease_before_ns,
                fill_before_ns,
            } => {
                let shard = self.store.shard;
                self.write_unanswered(move |s, t| {
                    let n = s.reclaim_pending(t, lease_before_ns, fill_before_ns)?;
                    if n > 0 {
                        tracing::info!(
                            shard,
                            files = n,
                            "freed the unfinished blocks of writers that are gone"
                        );
                    }
                    Ok(())
                })
            }
            ShardMsg::ScanBlocks {
                after,
                limit,
                reply,
            } => self.read(reply, move |s, t| s.scan_blocks(t, after, limit.min(4096))),
            ShardMsg::SetLocs {
                ino,
                index,
                id,
                locs,
                reply,
            } => self.write(reply, move |s, t| s.set_locs(t, ino, index, id, &locs)),
            ShardMsg::DropCopy {
                id,
                node,
                apply,
                reply,
            } => self.write(reply, move |s, t| s.drop_copy(t, id, &node, apply)),
            other => misrouted(other),
        }
    }

    /// Cross-shard operations: their intents and steps, and old step records.
    fn intents(&mut self, message: ShardMsg) {
        match message {
            ShardMsg::BeginIntent { action, reply } => {
                self.write(reply, move |s, t| s.begin_intent(t, &action))
            }
            ShardMsg::AbortIntent { op, reply } => {
                self.write(reply, move |s, t| s.abort_intent(t, op))
            }
            ShardMsg::ApplyStep {
                op,
                step_no,
                step,
                reply,
            } => self.write(reply, move |s, t| s.apply_step(t, op, step_no, &step)),
            ShardMsg::EndIntent { op, reply } => self.write(reply, move |s, t| s.end_intent(t, op)),
            ShardMsg::ListIntents { reply } => self.read(reply, move |s, t| s.intents(t)),
            ShardMsg::AgeAnswers {} => {
                let generation = self
                    .store
                    .read_txn()
                    .and_then(|t| self.store.answers_generation(&t));
                match generation {
                    Ok(g) if self.answer_age.due(g, Instant::now(), REQUEST_RECORD_TTL) => {
                        let shard = self.store.shard;
                        self.write_unanswered(move |s, t| {
                            let now = s.rotate_answers(t, g)?;
                            tracing::debug!(
                                shard,
                                generation = now,
                                "answers of calls: next generation"
                            );
                            Ok(())
                        })
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(shard = self.store.shard, error = %e, "cannot read the generation of answers")
                    }
                }
            }
            ShardMsg::SweepOps { before_ns } => {
                let shard = self.store.shard;
                self.write_unanswered(move |s, t| {
                    let n = s.sweep_op_records(t, before_ns)?;
                    if n > 0 {
                        tracing::debug!(shard, swept = n, "removed old step records");
                    }
                    Ok(())
                })
            }
            other => misrouted(other),
        }
    }

    /// Shard 0's records: the cluster map, the mount table, the UFS journal
    /// and service records. `ctx` is the trace of the message.
    fn shard0_records(&mut self, message: ShardMsg, ctx: Option<TraceCtx>) {
        match message {
            ShardMsg::GetMap { reply } => self.read(reply, move |s, t| s.cluster_map(t)),
            ShardMsg::SetMap { expect, map, reply } => {
                self.write(reply, move |s, t| s.set_cluster_map(t, expect, &map))
            }
            ShardMsg::GetMounts { reply } => self.read(reply, move |s, t| s.mounts(t)),
            ShardMsg::SetMounts {
                expect,
                table,
                reply,
            } => self.write(reply, move |s, t| s.set_mounts(t, expect, &table)),
            // The replays join the trace of the request that made the change.
            ShardMsg::JournalAppend { mount, ops, reply } => {
                self.write(reply, move |s, t| s.journal_append(t, mount, &ops, ctx))
            }
            ShardMsg::JournalRead { limit, reply } => {
                self.read(reply, move |s, t| s.journal_read(t, limit))
            }
            ShardMsg::JournalTrim { upto, reply } => {
                self.write(reply, move |s, t| s.journal_trim(t, upto))
            }
            ShardMsg::RecordPut { entries, reply } => {
                self.write(reply, move |s, t| s.record_put(t, &entries))
            }
            ShardMsg::RecordScan {
                prefix,
                after,
                limit,
                reply,
            } => self.read(reply, move |s, t| {
                s.record_scan(t, &prefix, after.as_deref(), limit)
            }),
            other => misrouted(other),
        }
    }

    /// What inodes mirror of their UFS objects.
    fn ufs(&mut self, message: ShardMsg) {
        match message {
            ShardMsg::SetUfs { ino, ufs, reply } => {
                self.write(reply, move |s, t| s.set_ufs(t, ino, ufs))
            }
            ShardMsg::UfsSync {
                parent,
                mount,
                files,
                owner,
                spec,
                reply,
            } => self.write(reply, move |s, t| {
                s.ufs_sync(t, parent, mount, &files, &owner, &spec)
            }),
            ShardMsg::UfsRefresh {
                ino,
                mount,
                file,
                now_ns,
                reply,
            } => self.write(reply, move |s, t| {
                s.ufs_refresh(t, ino, mount, &file, now_ns)
            }),
            ShardMsg::UfsPersisted {
                ino,
                since_ns,
                state: ufs,
                reply,
            } => self.write(reply, move |s, t| s.ufs_persisted(t, ino, since_ns, &ufs)),
            ShardMsg::UfsAddBlock {
                ino,
                index,
                expect,
                reply,
            } => self.write(reply, move |s, t| s.ufs_add_block(t, ino, index, &expect)),
            ShardMsg::UfsCommitBlock {
                ino,
                info,
                expect,
                reply,
            } => self.write(reply, move |s, t| {
                s.ufs_commit_block(t, ino, &info, &expect)
            }),
            ShardMsg::UfsAbortBlock { ino, id, reply } => {
                self.write(reply, move |s, t| s.ufs_abort_block(t, ino, id))
            }
            ShardMsg::UfsEvict { ino, reply } => self.write(reply, move |s, t| s.ufs_evict(t, ino)),
            other => misrouted(other),
        }
    }

    /// The shard as a whole: its counters and content, and moving it (export,
    /// import, drop, freeze).
    fn whole_shard(&mut self, message: ShardMsg) {
        match message {
            ShardMsg::Stats { reply } => {
                let group = self.group_status().map(|g| curvine_messages::GroupReport {
                    voters: g.voters.clone(),
                    learners: g.learners.clone(),
                    leader: g.leader,
                    term: g.term,
                    commit: g.commit,
                    applied: g.applied,
                });
                self.read(reply, move |s, t| {
                    s.stats(t)
                        .map(|stats| curvine_messages::ShardStats { group, ..stats })
                })
            }
            ShardMsg::Scan { reply } => self.read(reply, move |s, t| s.scan(t)),
            ShardMsg::Digest { reply } => {
                let store = &self.store;
                let digest = store.read_txn().and_then(|t| {
                    let applied =
                        crate::replica::read_group_state(store.tables()[0], &t, store.shard)?
                            .map_or(0, |g| g.applied_index);
                    let (records, hash) = store.digest(&t)?;
                    Ok(curvine_messages::shard::CopyDigest {
                        applied,
                        records,
                        hash,
                    })
                });
                answer(reply, digest)
            }
            ShardMsg::Export {
                from,
                max_bytes,
                reply,
            } => self.read(reply, move |s, t| {
                s.export(t, from, (max_bytes as usize).clamp(4096, 4 << 20))
            }),
            ShardMsg::Import { records, reply } => {
                self.delegations.clear();
                self.write(reply, move |s, t| s.import(t, &records))
            }
            ShardMsg::DropAll { reply } => {
                self.delegations.clear();
                self.write(reply, |s, t| s.drop_all(t))
            }
            ShardMsg::Freeze { reply } => {
                self.store
                    .frozen
                    .store(true, std::sync::atomic::Ordering::Release);
                // Answered after the writer committed everything queued before.
                self.write(reply, |_, _| Ok(()));
            }
            ShardMsg::Unfreeze { reply } => {
                self.store
                    .frozen
                    .store(false, std::sync::atomic::Ordering::Release);
                answer(reply, Ok(()));
            }
            other => misrouted(other),
        }
    }

    /// The cluster's rename lock, held in memory by shard 0's leader. A
    /// lock taken in an earlier term of the group is void: this node may
    /// have lost the leadership since, and its holder's unlock gone to
    /// another leader.
    fn rename_lock(&mut self, message: ShardMsg) {
        match message {
            ShardMsg::LockRenames {
                holder,
                lease_ms,
                reply,
            } => {
                let term = match self.group_status() {
                    Some(g) if !g.serving => {
                        return answer(
                            reply,
                            Err(curvine_messages::FsError::Unavailable(format!(
                                "shard {}: this node does not lead it, and the rename lock is its leader's",
                                self.store.shard
                            ))),
                        )
                    }
                    Some(g) => g.term,
                    None => 0,
                };
                let now = std::time::Instant::now();
                let free = match &self.rename_lock {
                    None => true,
                    Some(lock) => lock.holder == holder || lock.until <= now || lock.term != term,
                };
                if free {
                    let lease = Duration::from_millis(lease_ms as u64);
                    self.rename_lock = Some(RenameLock {
                        holder,
                        until: now + lease,
                        term,
                    });
                }
                answer(reply, Ok(free));
            }
            ShardMsg::UnlockRenames { holder, reply } => {
                if self
                    .rename_lock
                    .as_ref()
                    .is_some_and(|l| l.holder == holder)
                {
                    self.rename_lock = None;
                }
                answer(reply, Ok(()));
            }
            other => misrouted(other),
        }
    }
}

/// A message handed to a group handler that does not serve it: `dispatch`
/// and the handlers disagree.
fn misrouted(message: ShardMsg) -> ! {
    unreachable!("{} was dispatched to the wrong handler", message.kind())
}

impl Actor for NamespaceShard {
    type Msg = Traced<ShardMsg>;
    type State = ShardState;
    type Arguments = ShardArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Traced<ShardMsg>>,
        args: ShardArgs,
    ) -> Result<ShardState, ActorProcessingErr> {
        let store = args.store;
        let stats = args.metrics.shard(store.shard);
        args.metrics.started(myself.get_id(), &stats);
        let writer = Writer::for_store(&store, args.group_commit_max, args.commit_delay);
        let before = now_ns() - args.op_record_ttl.as_nanos() as i64;
        let shard = store.shard;
        let sweeper = store.clone();
        writer.submit(
            move |txn| sweeper.sweep_op_records(txn, before),
            move |r| match r {
                Ok(n) if n > 0 => tracing::info!(shard, swept = n, "removed stale step records"),
                Ok(_) => {}
                // Another member leads the shard's group, which sweeps.
                Err(e) if e.is_retryable() => {
                    tracing::debug!(shard, error = %e, "step records not swept here")
                }
                Err(e) => tracing::warn!(shard, error = %e, "sweeping step records failed"),
            },
        );
        // Step records of finished operations go once they are older than
        // the TTL, checked a few times per TTL.
        let ttl = args.op_record_ttl;
        let every = (ttl / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600));
        myself.send_interval(every, move || {
            Traced::new(
                ShardMsg::SweepOps {
                    before_ns: now_ns() - ttl.as_nanos() as i64,
                },
                None,
            )
        });
        // The generation of answers moves on once its TTL has passed here.
        myself.send_interval(ANSWER_AGE_EVERY, || {
            Traced::new(ShardMsg::AgeAnswers {}, None)
        });
        // Blocks of writers that died go once their lease has long run out
        // (and blocks of fills after an hour).
        let lease = args.write_lease;
        myself.send_interval(
            lease.clamp(Duration::from_secs(1), Duration::from_secs(60)),
            move || {
                let now = now_ns();
                Traced::new(
                    ShardMsg::ReclaimPending {
                        lease_before_ns: now - 2 * lease.as_nanos() as i64,
                        fill_before_ns: now - 3600 * 1_000_000_000,
                    },
                    None,
                )
            },
        );
        tracing::debug!(shard, "namespace shard started");
        Ok(ShardState {
            name: format!("shard-{shard}"),
            store,
            writer,
            rename_lock: None,
            tracer: args.tracer,
            stats,
            span: None,
            req: None,
            delegations: Default::default(),
            answer_age: AnswerAge::default(),
        })
    }

    /// Waits until every mutation queued before the stop is committed.
    async fn post_stop(
        &self,
        _myself: ActorRef<Traced<ShardMsg>>,
        state: &mut ShardState,
    ) -> Result<(), ActorProcessingErr> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        state.writer.submit(
            |_| Ok(()),
            move |r: FsResult<()>| {
                let _ = tx.send(r);
            },
        );
        let _ = rx.await;
        tracing::debug!(shard = state.store.shard, "namespace shard stopped");
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Traced<ShardMsg>>,
        message: Traced<ShardMsg>,
        state: &mut ShardState,
    ) -> Result<(), ActorProcessingErr> {
        let Traced {
            msg: message,
            ctx,
            sent_ns,
            req,
        } = message;
        state.req = req;
        let stats = state.stats.clone();
        let _handling = stats.handling(message.kind());
        state.span = state
            .tracer
            .start(ctx, sent_ns, &state.name, myself.get_id(), message.kind());
        if state
            .store
            .frozen
            .load(std::sync::atomic::Ordering::Acquire)
            && !message.allowed_while_frozen()
        {
            state.refuse_frozen(message);
            return Ok(());
        }
        let Some(message) = state.check_delegations(message) else {
            return Ok(());
        };
        state.dispatch(message, ctx);
        // Messages answered in the actor itself (locks, unfreeze).
        if let Some(span) = state.span.take() {
            span.end(Outcome::Ok);
        }
        Ok(())
    }
}

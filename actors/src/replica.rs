//! Every shard is a Raft group (TiKV's raft-rs): its log is the metadata
//! log, LMDB is its state machine.
//!
//! The groups of one LMDB environment are driven by that environment's
//! writer thread (`writer`), which already owns every write to it: in one
//! pass it runs the queued mutations, proposes each group's changes as one
//! entry, writes what every group must make durable (new entries and hard
//! states) as one record of the environment's log (`wal`) with one sync,
//! commits LMDB, and advances the groups. Mutations of many shards thus
//! share one sync, as before the log was Raft's.
//!
//! A leader runs a mutation on its own LMDB state and proposes what it
//! wrote (the [`Change`]s), not the request: followers apply the changes
//! as they are, so no mutation has to be deterministic (clocks, ids and
//! placement are decided once). The leader's changes are in LMDB from the
//! moment they are proposed (`spec_index`); a mutation is answered once its
//! entry is committed.
//!
//! A group's [`GroupState`] (applied index and term, members, hard state)
//! is written in LMDB by the transaction that applies its entries, so the
//! snapshot a checkpoint flushes always says which entry it ends with; the
//! log's records after the checkpoint restore the rest (`wal`).
//!
//! This release runs every group with one member, the node that holds the
//! shard: an entry is committed as soon as its record is synced, which is
//! exactly the guarantee of the log before it.

use std::collections::{HashMap, VecDeque};

use heed::{RoTxn, RwTxn, WithoutTls};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState as PbHardState, Snapshot};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};

use curvine_messages::codec::{decode_versioned, encode_versioned};
use curvine_messages::wal::{
    Change, GroupId, GroupState, GroupWrite, HardState, LogEntry, LogRecord,
};
use curvine_messages::{FsError, FsResult};

use crate::txn::{lmdb_err, Db};

/// The key of a group's [`GroupState`] in the `meta` table. It is the
/// node's own record: a shard's export leaves it out.
pub fn group_state_key(group: GroupId) -> Vec<u8> {
    format!("raft{group:03}").into_bytes()
}

/// A group's state as stored in `meta`, if it has one.
pub fn read_group_state(
    meta: Db,
    txn: &RoTxn<WithoutTls>,
    group: GroupId,
) -> FsResult<Option<GroupState>> {
    match meta.get(txn, &group_state_key(group)).map_err(lmdb_err)? {
        Some(bytes) => decode_versioned(bytes).map(Some).map_err(FsError::from),
        None => Ok(None),
    }
}

/// Writes a group's state in `meta` (not a replicated change: each member
/// keeps its own).
pub fn write_group_state(
    meta: Db,
    txn: &mut RwTxn,
    group: GroupId,
    state: &GroupState,
) -> FsResult<()> {
    meta.put(txn, &group_state_key(group), &encode_versioned(state))
        .map_err(lmdb_err)
}

/// raft-rs logs through slog; its lines go to `tracing` (elections and
/// membership at debug, problems at warn and error).
struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{}", record.msg())
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{}", record.msg()),
            slog::Level::Info => tracing::debug!(target: "raft", "{}", record.msg()),
            _ => tracing::trace!(target: "raft", "{}", record.msg()),
        }
        Ok(())
    }
}

fn logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}

/// The Raft groups of one environment, owned by its writer thread.
pub struct Groups {
    /// This node's member id in every group.
    id: u64,
    /// The environment's tables by number (as changes name them).
    dbs: Vec<Db>,
    logger: slog::Logger,
    groups: HashMap<GroupId, Group>,
    /// Set when a pass failed after proposing: the logs and LMDB may
    /// disagree until a restart recovers both from the log.
    stopped: Option<String>,
}

struct Group {
    raw: RawNode<MemStorage>,
    /// The last entry whose changes are in LMDB (applied, or proposed by
    /// this leader ahead of its commit), and its term.
    spec_index: u64,
    spec_term: u64,
    /// Whether LMDB's [`GroupState`] is behind `spec_index` or the hard state.
    state_dirty: bool,
    /// Callers answered once the group commits the index they wait for.
    waiting: VecDeque<(u64, Done)>,
}

/// Answers a caller once the group committed what it waited for.
pub type Done = Box<dyn FnOnce(FsResult<()>) + Send>;

/// What the groups wrote in one pass, to make durable before they advance.
pub struct Unpersisted {
    readies: Vec<(GroupId, raft::Ready)>,
    pub record: LogRecord,
}

fn to_log_entry(e: &Entry) -> LogEntry {
    LogEntry {
        index: e.index,
        term: e.term,
        conf_change: e.get_entry_type() != EntryType::EntryNormal,
        data: e.data.to_vec(),
    }
}

fn hard_state(hs: &PbHardState) -> HardState {
    HardState {
        term: hs.term,
        vote: hs.vote,
        commit: hs.commit,
    }
}

impl Groups {
    pub fn new(id: u64, dbs: Vec<Db>) -> Groups {
        Groups {
            id,
            dbs,
            logger: logger(),
            groups: HashMap::new(),
            stopped: None,
        }
    }

    /// The group of `shard`, loaded from its state in LMDB on first use (a
    /// new group has this node as its only member). A group of one member
    /// elects itself at once.
    fn group(&mut self, txn: &RoTxn<WithoutTls>, shard: GroupId) -> FsResult<&mut Group> {
        if !self.groups.contains_key(&shard) {
            let state = read_group_state(self.dbs[0], txn, shard)?;
            let group = self.load(shard, state)?;
            self.groups.insert(shard, group);
        }
        Ok(self.groups.get_mut(&shard).expect("inserted above"))
    }

    fn load(&self, shard: GroupId, state: Option<GroupState>) -> FsResult<Group> {
        let raft_err = |e: raft::Error| {
            FsError::Io(format!("shard {shard}: cannot start its Raft group: {e}"))
        };
        let mut state = state.unwrap_or_default();
        if state.voters.is_empty() && state.learners.is_empty() {
            // A new group (or one whose state recovery rebuilt from the
            // log alone): this node is its member.
            state.voters = vec![self.id];
        }
        let conf = ConfState::from((state.voters.clone(), state.learners.clone()));
        let storage = MemStorage::new_with_conf_state(conf.clone());
        if state.applied_index > 0 {
            let mut snapshot = Snapshot::default();
            let meta = snapshot.mut_metadata();
            meta.index = state.applied_index;
            meta.term = state.applied_term;
            meta.set_conf_state(conf);
            storage.wl().apply_snapshot(snapshot).map_err(raft_err)?;
        }
        storage.wl().set_hardstate(PbHardState {
            term: state.hard_state.term.max(state.applied_term),
            vote: state.hard_state.vote,
            commit: state.hard_state.commit.max(state.applied_index),
            ..Default::default()
        });
        let config = raft::Config {
            id: self.id,
            applied: state.applied_index,
            election_tick: 10,
            heartbeat_tick: 3,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        let mut raw = RawNode::new(&config, storage, &self.logger).map_err(raft_err)?;
        if state.voters == [self.id] && state.learners.is_empty() {
            raw.campaign().map_err(raft_err)?;
        }
        Ok(Group {
            raw,
            spec_index: state.applied_index,
            spec_term: state.applied_term,
            state_dirty: false,
            waiting: VecDeque::new(),
        })
    }

    /// Whether this node may run a mutation of `shard` now: it leads the
    /// group and has applied every entry of earlier terms.
    pub fn check_leader(&mut self, txn: &RoTxn<WithoutTls>, shard: GroupId) -> FsResult<()> {
        if let Some(why) = &self.stopped {
            return Err(FsError::Io(format!(
                "shard {shard}: a metadata commit failed ({why}); no change is accepted until the node restarts"
            )));
        }
        let group = self.group(txn, shard)?;
        let raft = &group.raw.raft;
        if raft.state != StateRole::Leader {
            return Err(FsError::Unavailable(format!(
                "shard {shard}: this node is not the leader of its group (term {}, leader {})",
                raft.term, raft.leader_id
            )));
        }
        Ok(())
    }

    /// Proposes what this leader's mutations of `shard` wrote (already in
    /// `txn`'s LMDB state) as one entry. Returns its index.
    pub fn propose(&mut self, shard: GroupId, changes: &[Change]) -> FsResult<u64> {
        let group = self.groups.get_mut(&shard).ok_or_else(|| {
            FsError::Io(format!(
                "shard {shard}: proposing to a group that is not loaded"
            ))
        })?;
        let data = postcard::to_allocvec(changes)
            .map_err(|e| FsError::Io(format!("encoding shard {shard}'s changes: {e}")))?;
        group
            .raw
            .propose(Vec::new(), data)
            .map_err(|e| FsError::Unavailable(format!("shard {shard}: proposal refused: {e}")))?;
        let last = group.raw.raft.raft_log.last_index();
        group.spec_index = last;
        group.spec_term = group.raw.raft.term;
        group.state_dirty = true;
        Ok(last)
    }

    /// Answers `done` once `shard` has committed what its LMDB state holds
    /// now (a caller that read or changed that state must not be answered
    /// before it is committed).
    pub fn wait(&mut self, shard: GroupId, done: Done) {
        match self.groups.get_mut(&shard) {
            Some(group) => {
                let index = group.spec_index;
                group.waiting.push_back((index, done));
            }
            // Never loaded: nothing of it is waiting for a commit.
            None => done(Ok(())),
        }
    }

    /// Takes what every group has to make durable and apply, applying the
    /// committed entries this leader did not write itself into `txn`, and
    /// records each changed group's state there.
    pub fn collect(&mut self, txn: &mut RwTxn) -> FsResult<Unpersisted> {
        let mut out = Unpersisted {
            readies: Vec::new(),
            record: LogRecord::default(),
        };
        for (&shard, group) in self.groups.iter_mut() {
            if group.raw.has_ready() {
                let mut rd = group.raw.ready();
                let committed = rd.take_committed_entries();
                apply_committed(&self.dbs, txn, shard, group, &committed)?;
                let entries: Vec<LogEntry> = rd.entries().iter().map(to_log_entry).collect();
                let hs = rd.hs().map(hard_state);
                if !rd.entries().is_empty() {
                    group
                        .raw
                        .store()
                        .wl()
                        .append(rd.entries())
                        .map_err(|e| FsError::Io(format!("shard {shard}: raft log: {e}")))?;
                }
                if let Some(pb) = rd.hs() {
                    group.raw.store().wl().set_hardstate(pb.clone());
                    group.state_dirty = true;
                }
                // One member: no message to send (peers arrive with
                // replication).
                if !entries.is_empty() || hs.is_some() {
                    out.record.groups.push(GroupWrite {
                        group: shard,
                        entries,
                        hard_state: hs,
                    });
                }
                out.readies.push((shard, rd));
            }
            if group.state_dirty {
                let state = group_state(&group.raw, group.spec_index, group.spec_term);
                write_group_state(self.dbs[0], txn, shard, &state)?;
                group.state_dirty = false;
            }
        }
        Ok(out)
    }

    /// After the record of `pending` is durable and LMDB committed: the
    /// groups advance, and callers whose index is committed are answered.
    pub fn persisted(&mut self, pending: Unpersisted) {
        for (shard, rd) in pending.readies {
            let Some(group) = self.groups.get_mut(&shard) else {
                continue;
            };
            let mut light = group.raw.advance(rd);
            // Committed entries of a one-member group are this leader's own,
            // already applied; a follower's come before persisting.
            let late = light.take_committed_entries();
            if late.iter().any(|e| e.index > group.spec_index) {
                tracing::error!(shard, "entries committed after persisting were not applied");
            }
            group.raw.advance_apply();
        }
        for group in self.groups.values_mut() {
            let committed = group.raw.raft.raft_log.committed;
            while group.waiting.front().is_some_and(|(i, _)| *i <= committed) {
                let (_, done) = group.waiting.pop_front().expect("checked above");
                done(Ok(()));
            }
            // A group of one member needs no entry it has applied.
            let applied = group.raw.raft.raft_log.applied;
            let first = raft::Storage::first_index(group.raw.store()).unwrap_or(applied);
            if applied > first + 64 && group.raw.raft.prs().conf().voters().ids().len() == 1 {
                let _ = group.raw.store().wl().compact(applied);
            }
        }
    }

    /// A pass failed after proposing: every caller waiting on a group is
    /// answered with `e`, and no change is accepted any more.
    pub fn stop(&mut self, e: &FsError) {
        self.stopped = Some(e.to_string());
        for group in self.groups.values_mut() {
            for (_, done) in group.waiting.drain(..) {
                done(Err(e.clone()));
            }
        }
    }
}

/// Applies committed entries past what LMDB holds (a follower's, or a
/// leader's from an earlier term).
fn apply_committed(
    dbs: &[Db],
    txn: &mut RwTxn,
    shard: GroupId,
    group: &mut Group,
    entries: &[Entry],
) -> FsResult<()> {
    for e in entries {
        if e.index <= group.spec_index {
            continue;
        }
        if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
            let changes: Vec<Change> = postcard::from_bytes(&e.data).map_err(|err| {
                FsError::Corrupt(format!(
                    "shard {shard}: entry {} of term {} does not decode: {err}",
                    e.index, e.term
                ))
            })?;
            crate::txn::apply(txn, dbs, &changes).map_err(lmdb_err)?;
        }
        group.spec_index = e.index;
        group.spec_term = e.term;
        group.state_dirty = true;
    }
    Ok(())
}

fn group_state(raw: &RawNode<MemStorage>, index: u64, term: u64) -> GroupState {
    let conf = raw.raft.prs().conf().to_conf_state();
    let hs = raw.raft.hard_state();
    GroupState {
        applied_index: index,
        applied_term: term,
        voters: conf.voters.clone(),
        learners: conf.learners.clone(),
        hard_state: hard_state(&hs),
    }
}

/// Replays one group's part of a log record at recovery: applies its
/// entries past `state`'s applied index and keeps its hard state. Groups
/// of one member commit what they persist, so every entry counts.
pub fn replay(
    dbs: &[Db],
    txn: &mut RwTxn,
    write: &GroupWrite,
    state: &mut GroupState,
) -> FsResult<usize> {
    let mut changes = 0;
    for e in &write.entries {
        if e.index <= state.applied_index {
            continue;
        }
        if !e.conf_change && !e.data.is_empty() {
            let decoded: Vec<Change> = postcard::from_bytes(&e.data).map_err(|err| {
                FsError::Corrupt(format!(
                    "the metadata log's entry {} of shard {} does not decode ({err}); it was written by another release",
                    e.index, write.group
                ))
            })?;
            crate::txn::apply(txn, dbs, &decoded).map_err(lmdb_err)?;
            changes += decoded.len();
        }
        state.applied_index = e.index;
        state.applied_term = e.term;
    }
    if let Some(hs) = write.hard_state {
        state.hard_state = hs;
    }
    state.hard_state.commit = state.hard_state.commit.max(state.applied_index);
    Ok(changes)
}

/// A node's member id in every group it is part of: a hash of its node id
/// (never 0, which raft-rs reserves).
pub fn member_id(node_id: &str) -> u64 {
    // FNV-1a: stable across releases and platforms.
    let h = node_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}

//! Every shard is a Raft group (TiKV's raft-rs): its log is the metadata
//! log, LMDB is its state machine.
//!
//! The groups of one LMDB environment are driven by that environment's
//! writer thread (`writer`), which already owns every write to it. In one
//! pass it steps the messages other members sent and ticks the groups,
//! runs the queued mutations of the groups this node leads, proposes what
//! each group's mutations wrote as one entry, applies what followers learnt
//! is committed, writes what every group must make durable (new entries and
//! hard states) as one record of the environment's log (`wal`) with one
//! sync, commits LMDB, advances the groups, and sends each other member
//! the messages of all groups as one batch ([`Transport`]). Mutations of
//! many shards thus share one sync.
//!
//! A leader runs a mutation on its own LMDB state and proposes what it
//! wrote (the [`Change`]s), not the request: followers apply the changes
//! as they are, so no mutation has to be deterministic (clocks, ids and
//! placement are decided once). The leader's changes are in LMDB from the
//! moment they are proposed (`spec_index`), so the next mutations see them;
//! with other members it keeps what each write replaced, and a leader that
//! loses its leadership takes back what was not committed (and answers its
//! callers that the operation may or may not have happened). A caller is
//! answered once the entry holding what it saw is committed.
//!
//! A group's [`GroupState`] (applied index and term, members, hard state)
//! is written in LMDB by the transaction that applies its entries, so the
//! snapshot a checkpoint flushes always says which entry it ends with; the
//! log's records after the checkpoint restore the rest (`wal`). A
//! checkpoint waits until no leader has uncommitted changes in LMDB, and
//! the entries a group has not applied yet are written again after it
//! ([`Groups::carry`]).

mod state;

pub use state::{
    alone, decode_changes, extend_tail, group_state_key, member_id, read_group_state, replay,
    stored_groups, write_group_state, Tail,
};
pub(crate) use state::{leave_tail, take_tail};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use heed::{RoTxn, RwTxn, WithoutTls};
use raft::eraftpb::{
    ConfChangeV2, ConfState, Entry, EntryType, HardState as PbHardState, Message, Snapshot,
};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};

use curvine_messages::wal::{
    Change, GroupId, GroupState, GroupWrite, HardState, LogEntry, LogRecord,
};
use curvine_messages::{FsError, FsResult};

use crate::txn::{lmdb_err, Db, Undo};

/// A Raft message of one group.
#[derive(Debug, Clone)]
pub struct GroupMessage {
    pub group: GroupId,
    pub message: Message,
}

/// Carries the groups' messages to other members: everything one pass has
/// for a member, in order, as one call.
pub trait Transport: Send + Sync + 'static {
    fn send(&self, to: u64, messages: Vec<GroupMessage>);
}

/// Answers a caller once the group committed what it waited for.
pub type Done = Box<dyn FnOnce(FsResult<()>) + Send>;

/// What other threads may know of a group (for reads, reports and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupStatus {
    pub leader: u64,
    pub term: u64,
    /// This node leads the group and has applied every entry of earlier
    /// terms: it may run mutations.
    pub serving: bool,
    pub commit: u64,
    pub applied: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
}

/// The status of an environment's groups, updated after every pass.
pub type StatusBoard = Arc<Mutex<BTreeMap<GroupId, GroupStatus>>>;

/// The Raft groups of one environment, owned by its writer thread.
pub struct Groups {
    /// This node's member id in every group.
    id: u64,
    /// The environment's tables by number (as changes name them).
    dbs: Vec<Db>,
    env_path: std::path::PathBuf,
    logger: slog::Logger,
    groups: HashMap<GroupId, Group>,
    transport: Option<Arc<dyn Transport>>,
    outbox: BTreeMap<u64, Vec<GroupMessage>>,
    status: StatusBoard,
    /// Set when a pass failed after proposing: the logs and LMDB may
    /// disagree until a restart recovers both from the log.
    stopped: Option<String>,
    /// Read barriers waiting for their group to confirm its leadership
    /// with a quorum (ReadIndex), by request context.
    reads: HashMap<Vec<u8>, (GroupId, Done)>,
    next_read: u64,
}

struct Group {
    raw: RawNode<MemStorage>,
    /// The last entry whose changes are in LMDB (applied, or proposed by
    /// this leader ahead of its commit), and its term.
    spec_index: u64,
    spec_term: u64,
    /// Whether LMDB's [`GroupState`] is behind.
    state_dirty: bool,
    /// Callers answered once the group commits the entry (index, term)
    /// they wait for.
    waiting: VecDeque<(u64, u64, Done)>,
    /// How to take back this leader's entries past the commit.
    undo: VecDeque<(u64, Vec<Undo>)>,
    /// Whether this node led the group at the end of the last pass, and
    /// the first index of its term as leader.
    leading: bool,
    term_start: u64,
    /// Committed entries learnt after a pass persisted: applied first in
    /// the next pass.
    late: Vec<Entry>,
    /// Whether the group did anything since its status was published.
    touched: bool,
}

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

fn from_log_entry(e: &LogEntry) -> Entry {
    let mut entry = Entry {
        index: e.index,
        term: e.term,
        data: e.data.clone().into(),
        ..Default::default()
    };
    if e.conf_change {
        entry.set_entry_type(EntryType::EntryConfChangeV2);
    }
    entry
}

fn hard_state(hs: &PbHardState) -> HardState {
    HardState {
        term: hs.term,
        vote: hs.vote,
        commit: hs.commit,
    }
}

fn raft_err(shard: GroupId) -> impl Fn(raft::Error) -> FsError {
    move |e| FsError::Io(format!("shard {shard}'s Raft group: {e}"))
}

impl Groups {
    pub fn new(
        id: u64,
        dbs: Vec<Db>,
        env_path: std::path::PathBuf,
        transport: Option<Arc<dyn Transport>>,
    ) -> Groups {
        Groups {
            id,
            dbs,
            env_path,
            logger: state::logger(),
            groups: HashMap::new(),
            transport,
            outbox: BTreeMap::new(),
            status: Default::default(),
            stopped: None,
            reads: HashMap::new(),
            next_read: 0,
        }
    }

    pub fn status(&self) -> StatusBoard {
        self.status.clone()
    }

    /// Loads every group that has a state in LMDB (a restarted node takes
    /// its part in them again at once).
    pub fn load_stored(&mut self, txn: &RoTxn<WithoutTls>) -> FsResult<()> {
        for (shard, state) in stored_groups(self.dbs[0], txn)? {
            if !self.groups.contains_key(&shard) {
                let group = self.load(shard, Some(state))?;
                self.groups.insert(shard, group);
            }
        }
        Ok(())
    }

    /// The group of `shard`, loaded from its state in LMDB on first use (a
    /// new group has this node as its only member).
    fn group(&mut self, txn: &RoTxn<WithoutTls>, shard: GroupId) -> FsResult<&mut Group> {
        if !self.groups.contains_key(&shard) {
            let state = read_group_state(self.dbs[0], txn, shard)?;
            let group = self.load(shard, state)?;
            self.groups.insert(shard, group);
        }
        Ok(self.groups.get_mut(&shard).expect("inserted above"))
    }

    fn load(&self, shard: GroupId, state: Option<GroupState>) -> FsResult<Group> {
        let mut state = state.unwrap_or_default();
        if state.voters.is_empty() && state.learners.is_empty() {
            // A new group (or one whose state recovery rebuilt from the
            // log alone): this node is its member.
            state.voters = vec![self.id];
        }
        let tail = take_tail(&self.env_path, shard).unwrap_or_default();
        let conf = ConfState::from((state.voters.clone(), state.learners.clone()));
        let storage = MemStorage::new_with_conf_state(conf.clone());
        if state.applied_index > 0 {
            let mut snapshot = Snapshot::default();
            let meta = snapshot.mut_metadata();
            meta.index = state.applied_index;
            meta.term = state.applied_term;
            meta.set_conf_state(conf);
            storage
                .wl()
                .apply_snapshot(snapshot)
                .map_err(raft_err(shard))?;
        }
        let entries: Vec<Entry> = tail
            .entries
            .iter()
            .filter(|e| e.index > state.applied_index)
            .map(from_log_entry)
            .collect();
        if !entries.is_empty() {
            storage.wl().append(&entries).map_err(raft_err(shard))?;
        }
        let hs = tail.hard_state.unwrap_or(state.hard_state);
        let last = entries.last().map_or(state.applied_index, |e| e.index);
        storage.wl().set_hardstate(PbHardState {
            term: hs.term.max(state.applied_term),
            vote: hs.vote,
            commit: hs.commit.clamp(state.applied_index, last),
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
        let mut raw = RawNode::new(&config, storage, &self.logger).map_err(raft_err(shard))?;
        if alone(&state) && state.voters == [self.id] {
            raw.campaign().map_err(raft_err(shard))?;
        }
        let mut group = Group {
            raw,
            spec_index: state.applied_index,
            spec_term: state.applied_term,
            state_dirty: false,
            waiting: VecDeque::new(),
            undo: VecDeque::new(),
            leading: false,
            term_start: 0,
            late: Vec::new(),
            touched: true,
        };
        group.follow_role(shard);
        Ok(group)
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
        if group.spec_index < group.term_start {
            return Err(FsError::Unavailable(format!(
                "shard {shard}: the new leader is still applying the entries of earlier terms"
            )));
        }
        Ok(())
    }

    /// Whether this leader's mutations of `shard` must keep what they
    /// replace (the group has other members).
    pub fn needs_undo(&self, shard: GroupId) -> bool {
        self.groups
            .get(&shard)
            .is_some_and(|g| g.raw.raft.prs().conf().voters().ids().len() > 1)
    }

    /// Proposes what this leader's mutations of `shard` wrote (already in
    /// LMDB's state) as one entry, with how to take it back. Returns its
    /// index.
    pub fn propose(
        &mut self,
        shard: GroupId,
        changes: &[Change],
        undo: Vec<Undo>,
    ) -> FsResult<u64> {
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
        if !undo.is_empty() || group.raw.raft.prs().conf().voters().ids().len() > 1 {
            group.undo.push_back((last, undo));
        }
        Ok(last)
    }

    /// Proposes a change of `shard`'s members (this node must lead it).
    pub fn propose_members(&mut self, shard: GroupId, change: ConfChangeV2) -> FsResult<()> {
        let group = self.groups.get_mut(&shard).ok_or_else(|| {
            FsError::Io(format!(
                "shard {shard}: changing the members of a group that is not loaded"
            ))
        })?;
        group
            .raw
            .propose_conf_change(Vec::new(), change)
            .map_err(|e| FsError::Unavailable(format!("shard {shard}: member change refused: {e}")))
    }

    /// Answers `done` once `shard` has committed what its LMDB state holds
    /// now (a caller that read or changed that state must not be answered
    /// before it is committed).
    pub fn wait(&mut self, shard: GroupId, done: Done) {
        match self.groups.get_mut(&shard) {
            Some(group) => {
                let (index, term) = (group.spec_index, group.spec_term);
                group.waiting.push_back((index, term, done));
            }
            // Never loaded: nothing of it is waiting for a commit.
            None => done(Ok(())),
        }
    }

    /// Answers `done` once this node has confirmed with a quorum of
    /// `shard`'s group that it still leads (Raft's ReadIndex) and has
    /// applied everything committed at that moment: what it then reads is
    /// linearizable. Refused when this node does not lead; a leader that
    /// loses its leadership before the quorum answers refuses it then.
    pub fn read_barrier(&mut self, txn: &RoTxn<WithoutTls>, shard: GroupId, done: Done) {
        if let Err(e) = self.check_leader(txn, shard) {
            done(Err(e));
            return;
        }
        let group = self.groups.get_mut(&shard).expect("loaded by check_leader");
        let ctx = self.next_read.to_le_bytes().to_vec();
        self.next_read += 1;
        group.raw.read_index(ctx.clone());
        group.touched = true;
        self.reads.insert(ctx, (shard, done));
    }

    /// Hands a message from another member to its group.
    pub fn step(&mut self, txn: &RoTxn<WithoutTls>, m: GroupMessage) -> FsResult<()> {
        let shard = m.group;
        if !self.groups.contains_key(&shard) {
            // Only a group this node is a member of (it has a state) takes
            // messages; a lone group is never made up for a stranger's.
            let Some(state) = read_group_state(self.dbs[0], txn, shard)? else {
                tracing::debug!(
                    shard,
                    from = m.message.from,
                    "a Raft message for a group this node is not a member of"
                );
                return Ok(());
            };
            let group = self.load(shard, Some(state))?;
            self.groups.insert(shard, group);
        }
        let group = self.groups.get_mut(&shard).expect("loaded above");
        if let Err(e) = group.raw.step(m.message) {
            tracing::debug!(shard, error = %e, "a Raft message was not taken");
        }
        Ok(())
    }

    /// One tick of every group's clock (elections and heartbeats).
    pub fn tick(&mut self) {
        for group in self.groups.values_mut() {
            group.raw.tick();
        }
    }

    /// Whether a pass has anything to do without new mutations.
    pub fn has_work(&self) -> bool {
        self.groups
            .values()
            .any(|g| g.raw.has_ready() || !g.late.is_empty() || g.leading != g.is_leader())
    }

    /// Whether a leader has changes in LMDB that are not committed (a
    /// checkpoint must not flush them).
    pub fn speculating(&self) -> bool {
        self.groups
            .values()
            .any(|g| g.spec_index > g.raw.raft.raft_log.committed)
    }

    /// Takes back the uncommitted changes of groups this node stopped
    /// leading, in `txn` (before any mutation of the pass runs).
    pub fn follow_roles(&mut self, txn: &mut RwTxn) -> FsResult<()> {
        let mut deposed = Vec::new();
        for (&shard, group) in self.groups.iter_mut() {
            if group.leading && !group.is_leader() {
                group.step_down(shard, &self.dbs, txn)?;
                deposed.push(shard);
            }
            group.follow_role(shard);
        }
        if !deposed.is_empty() {
            let cancelled: Vec<Vec<u8>> = self
                .reads
                .iter()
                .filter(|(_, (shard, _))| deposed.contains(shard))
                .map(|(ctx, _)| ctx.clone())
                .collect();
            for ctx in cancelled {
                if let Some((shard, done)) = self.reads.remove(&ctx) {
                    done(Err(FsError::Unavailable(format!(
                        "shard {shard}: leadership moved before a read could be confirmed"
                    ))));
                }
            }
        }
        Ok(())
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
            let late = std::mem::take(&mut group.late);
            group.apply_committed(shard, &self.dbs, txn, &late)?;
            if group.raw.has_ready() {
                group.touched = true;
                let mut rd = group.raw.ready();
                // Confirmed reads wait until what was committed when they
                // asked is applied.
                for state in rd.take_read_states() {
                    if let Some((_, done)) = self.reads.remove(&state.request_ctx) {
                        let term = group.raw.raft.raft_log.term(state.index).unwrap_or(0);
                        group.waiting.push_back((state.index, term, done));
                    }
                }
                if !rd.snapshot().is_empty() {
                    // Snapshots are sent only when a member lacks entries
                    // this node no longer has; groups keep their log until
                    // every member has it (see `persisted`).
                    tracing::error!(
                        shard,
                        "a Raft snapshot arrived; this release cannot install one"
                    );
                }
                // A leader sends its appends while it persists them.
                for message in rd.take_messages() {
                    push(&mut self.outbox, shard, message);
                }
                let committed = rd.take_committed_entries();
                group.apply_committed(shard, &self.dbs, txn, &committed)?;
                let entries: Vec<LogEntry> = rd.entries().iter().map(to_log_entry).collect();
                let hs = rd.hs().map(hard_state);
                if !rd.entries().is_empty() {
                    group
                        .raw
                        .store()
                        .wl()
                        .append(rd.entries())
                        .map_err(raft_err(shard))?;
                }
                if let Some(pb) = rd.hs() {
                    group.raw.store().wl().set_hardstate(pb.clone());
                    group.state_dirty = true;
                }
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
                let state = group.state();
                write_group_state(self.dbs[0], txn, shard, &state)?;
                group.state_dirty = false;
            }
        }
        Ok(out)
    }

    /// After the record of `pending` is durable and LMDB committed: the
    /// groups advance, callers whose entry is committed are answered, and
    /// the messages of the pass go out.
    pub fn persisted(&mut self, pending: Unpersisted) {
        for (shard, mut rd) in pending.readies {
            let Some(group) = self.groups.get_mut(&shard) else {
                continue;
            };
            // A follower acknowledges what is now durable.
            for message in rd.take_persisted_messages() {
                push(&mut self.outbox, shard, message);
            }
            let mut light = group.raw.advance(rd);
            for message in light.take_messages() {
                push(&mut self.outbox, shard, message);
            }
            // Entries committed by this very persist are usually this
            // leader's own, already in LMDB; others are applied next pass.
            for e in light.take_committed_entries() {
                if e.index > group.spec_index {
                    group.late.push(e);
                } else {
                    group.undo.retain(|(i, _)| *i > e.index);
                }
            }
            group.raw.advance_apply();
        }
        for (&shard, group) in self.groups.iter_mut() {
            if !group.waiting.is_empty() {
                group.answer(shard);
            }
            if group.touched {
                group.compact();
            }
        }
        self.publish();
        self.flush();
    }

    /// A pass failed after proposing: every caller waiting on a group is
    /// answered with `e`, and no change is accepted any more.
    pub fn stop(&mut self, e: &FsError) {
        self.stopped = Some(e.to_string());
        for (_, (_, done)) in self.reads.drain() {
            done(Err(e.clone()));
        }
        for group in self.groups.values_mut() {
            for (_, _, done) in group.waiting.drain(..) {
                done(Err(e.clone()));
            }
        }
    }

    /// What must be written again right after a checkpoint: the entries
    /// each group has not applied yet and its hard state (the checkpoint
    /// starts the log over).
    pub fn carry(&self) -> LogRecord {
        let mut record = LogRecord::default();
        for (&shard, group) in &self.groups {
            let hs = hard_state(&group.raw.raft.hard_state());
            let applied = group.spec_index.min(group.raw.raft.raft_log.committed);
            let last = group.raw.raft.raft_log.last_index();
            let lone = group.raw.raft.prs().conf().voters().ids().len() <= 1
                && group.raw.raft.prs().conf().learners().is_empty();
            if lone && last <= applied {
                // Its state in LMDB says everything.
                continue;
            }
            let entries = if last > applied {
                group
                    .raw
                    .raft
                    .raft_log
                    .entries(applied + 1, u64::MAX, raft::GetEntriesContext::empty(false))
                    .map(|es| es.iter().map(to_log_entry).collect())
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            record.groups.push(GroupWrite {
                group: shard,
                entries,
                hard_state: Some(hs),
            });
        }
        record
    }

    /// Publishes the status of the groups that did something this pass.
    fn publish(&mut self) {
        let mut board = self.status.lock().unwrap_or_else(|p| p.into_inner());
        for (&shard, group) in self.groups.iter_mut() {
            if !std::mem::take(&mut group.touched) {
                continue;
            }
            let raft = &group.raw.raft;
            let conf = raft.prs().conf().to_conf_state();
            board.insert(
                shard,
                GroupStatus {
                    leader: raft.leader_id,
                    term: raft.term,
                    serving: raft.state == StateRole::Leader
                        && group.spec_index >= group.term_start,
                    commit: raft.raft_log.committed,
                    applied: group.spec_index.min(raft.raft_log.committed),
                    voters: conf.voters.clone(),
                    learners: conf.learners.clone(),
                },
            );
        }
    }

    fn flush(&mut self) {
        let outbox = std::mem::take(&mut self.outbox);
        if let Some(transport) = &self.transport {
            for (to, messages) in outbox {
                transport.send(to, messages);
            }
        }
    }
}

fn push(outbox: &mut BTreeMap<u64, Vec<GroupMessage>>, group: GroupId, message: Message) {
    outbox
        .entry(message.to)
        .or_default()
        .push(GroupMessage { group, message });
}

impl Group {
    fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Notes a change of role. A new leader that has applied everything
    /// before the entry it appended for its term counts that entry (which
    /// changes nothing) as applied, so it serves at once.
    fn follow_role(&mut self, shard: GroupId) {
        let leader = self.is_leader();
        if leader && !self.leading {
            let last = self.raw.raft.raft_log.last_index();
            self.term_start = last;
            if self.spec_index + 1 == last {
                self.spec_index = last;
                self.spec_term = self.raw.raft.term;
                self.state_dirty = true;
            }
            tracing::debug!(
                shard,
                term = self.raw.raft.term,
                "this node leads the shard's group"
            );
        }
        self.leading = leader;
    }

    /// This node no longer leads: what it changed past the commit is taken
    /// back (the entries may still commit under the new leader, and are
    /// then applied from the log), and its callers waiting on them learn
    /// that their operation may or may not happen.
    fn step_down(&mut self, shard: GroupId, dbs: &[Db], txn: &mut RwTxn) -> FsResult<()> {
        let committed = self.raw.raft.raft_log.committed;
        while let Some((index, undo)) = self.undo.pop_back() {
            if index <= committed {
                self.undo.clear();
                break;
            }
            crate::txn::undo(txn, dbs, &undo).map_err(lmdb_err)?;
        }
        if self.spec_index > committed {
            self.spec_index = committed;
            self.spec_term = self.raw.raft.raft_log.term(committed).unwrap_or(0);
            self.state_dirty = true;
        }
        let leader = self.raw.raft.leader_id;
        for (index, _, done) in std::mem::take(&mut self.waiting) {
            if index <= committed {
                done(Ok(()));
            } else {
                done(Err(FsError::Unavailable(format!(
                    "shard {shard}: leadership moved (to member {leader}) before the operation was committed; it may or may not have been applied"
                ))));
            }
        }
        tracing::info!(
            shard,
            leader,
            committed,
            "this node no longer leads the shard's group"
        );
        Ok(())
    }

    /// Applies committed entries past what LMDB holds (a follower's, or a
    /// new leader's from earlier terms), and membership changes.
    fn apply_committed(
        &mut self,
        shard: GroupId,
        dbs: &[Db],
        txn: &mut RwTxn,
        entries: &[Entry],
    ) -> FsResult<()> {
        for e in entries {
            if e.index <= self.spec_index {
                // This leader's own entry, already in LMDB.
                self.undo.retain(|(i, _)| *i > e.index);
                continue;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal if !e.data.is_empty() => {
                    let changes = decode_changes(shard, e.index, e.term, &e.data)?;
                    crate::txn::apply(txn, dbs, &changes).map_err(lmdb_err)?;
                }
                EntryType::EntryNormal => {}
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    self.apply_members(shard, e)?;
                }
            }
            self.spec_index = e.index;
            self.spec_term = e.term;
            self.state_dirty = true;
        }
        Ok(())
    }

    fn apply_members(&mut self, shard: GroupId, e: &Entry) -> FsResult<()> {
        use protobuf::Message as _;
        let result = if e.get_entry_type() == EntryType::EntryConfChangeV2 {
            let cc = ConfChangeV2::parse_from_bytes(&e.data).map_err(|err| {
                FsError::Corrupt(format!("shard {shard}: member change {}: {err}", e.index))
            })?;
            self.raw.apply_conf_change(&cc)
        } else {
            let cc = raft::eraftpb::ConfChange::parse_from_bytes(&e.data).map_err(|err| {
                FsError::Corrupt(format!("shard {shard}: member change {}: {err}", e.index))
            })?;
            self.raw.apply_conf_change(&cc)
        };
        match result {
            Ok(conf) => {
                self.raw.store().wl().set_conf_state(conf);
                tracing::info!(shard, index = e.index, "the shard's group changed members");
            }
            Err(err) => {
                tracing::warn!(shard, index = e.index, error = %err, "a member change was not applied")
            }
        }
        Ok(())
    }

    /// Answers the callers whose entry is committed; a caller whose index
    /// was taken by an entry of another term learns its operation may not
    /// have happened.
    fn answer(&mut self, shard: GroupId) {
        let committed = self.raw.raft.raft_log.committed.min(self.spec_index);
        while self
            .waiting
            .front()
            .is_some_and(|(i, _, _)| *i <= committed)
        {
            let (index, term, done) = self.waiting.pop_front().expect("checked above");
            let kept = index == 0 || self.raw.raft.raft_log.term(index).ok() == Some(term);
            if kept {
                done(Ok(()));
            } else {
                done(Err(FsError::Unavailable(format!(
                    "shard {shard}: another leader replaced the entry of the operation; it was not applied"
                ))));
            }
        }
    }

    /// Drops log entries no member needs any more.
    fn compact(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        let first = raft::Storage::first_index(self.raw.store()).unwrap_or(applied);
        let mut upto = applied;
        if self.is_leader() {
            for (id, progress) in self.raw.raft.prs().iter() {
                if *id != self.raw.raft.id {
                    upto = upto.min(progress.matched);
                }
            }
        } else if self.raw.raft.prs().conf().voters().ids().len() > 1 {
            // A follower may lead later: it keeps a window for the others.
            upto = applied.saturating_sub(4096);
        }
        if upto > first + 64 {
            let _ = self.raw.store().wl().compact(upto);
        }
    }

    fn state(&self) -> GroupState {
        let conf = self.raw.raft.prs().conf().to_conf_state();
        let hs = self.raw.raft.hard_state();
        GroupState {
            applied_index: self.spec_index,
            applied_term: self.spec_term,
            voters: conf.voters.clone(),
            learners: conf.learners.clone(),
            hard_state: hard_state(&hs),
        }
    }
}

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
//! log's records after the checkpoint restore the rest (`wal`). A change
//! of the hard state alone goes to LMDB only for a group with no other
//! member (or without a log): the others' is in the log's record and in
//! each checkpoint's carry. A
//! checkpoint waits until no leader has uncommitted changes in LMDB, and
//! the entries a group has not applied yet are written again after it
//! ([`Groups::carry`]).

mod group;
mod reads;
mod snapshot;
mod state;
mod status;
pub mod wire;

pub use state::{
    alone, decode_changes, delete_tail, extend_tail, group_state_key, member_id, read_group_state,
    read_tail, replay, stored_groups, write_group_state, write_tail, Tail,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use group::{is_members, Group};
use heed::{RoTxn, RwTxn, WithoutTls};
use raft::eraftpb::{
    ConfChangeV2, ConfState, Entry, EntryType, HardState as PbHardState, Message, Snapshot,
};
use raft::storage::MemStorage;
use raft::{RawNode, SnapshotStatus, StateRole};
pub use reads::LEASE;
use snapshot::GroupStore;
pub use snapshot::ShardCopy;
pub use status::GroupStatus;

use curvine_messages::wal::{
    Change, GroupId, GroupState, GroupWrite, HardState, LogEntry, LogRecord,
};
use curvine_messages::{FsError, FsResult};

use crate::clock::Clock;
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

/// A leader of term T hands out ids (inodes, blocks, operations) from
/// T << 32 on (or from where the shard's counter is, if higher): a term
/// handing out fewer than 2^32 ids never meets the ids of a later one. An
/// id handed out in an entry that never committed (a file's creation is
/// answered before its commit, and the writer may have stored blocks under
/// the id) is thus never handed out again by the next leader, which does
/// not know of it. Ids keep 56 bits (8 hold the shard): terms past 2^23
/// share the last range.
pub const ID_TERM_SHIFT: u32 = 32;
const ID_TERM_MAX: u64 = (1 << 23) - 1;

/// How long a read waits for a majority to confirm its leader.
const READ_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether this node may start a group of a shard with itself as its only
/// member (a shard that has no group anywhere yet); refused for a shard
/// whose group lives on other nodes.
pub type MayFound = Arc<dyn Fn(GroupId) -> bool + Send + Sync>;

/// One change of a group's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberChange {
    /// A member that gets the log but does not vote (a new replica while
    /// it catches up).
    AddLearner(u64),
    /// A voting member (or a learner promoted).
    AddVoter(u64),
    Remove(u64),
}

/// The Raft proposal for `changes`, made at once (joint consensus when
/// there are several).
pub fn conf_change(changes: &[MemberChange]) -> ConfChangeV2 {
    use raft::eraftpb::{ConfChangeSingle, ConfChangeType};
    let mut cc = ConfChangeV2::default();
    for change in changes {
        let (kind, node_id) = match *change {
            MemberChange::AddLearner(id) => (ConfChangeType::AddLearnerNode, id),
            MemberChange::AddVoter(id) => (ConfChangeType::AddNode, id),
            MemberChange::Remove(id) => (ConfChangeType::RemoveNode, id),
        };
        let mut single = ConfChangeSingle::default();
        single.set_change_type(kind);
        single.node_id = node_id;
        cc.mut_changes().push(single);
    }
    cc
}

/// The status of an environment's groups, updated after every pass.
pub type StatusBoard = Arc<Mutex<BTreeMap<GroupId, GroupStatus>>>;

/// The Raft groups of one environment, owned by its writer thread.
pub struct Groups {
    /// This node's member id in every group.
    id: u64,
    /// The environment's tables by number (as changes name them).
    dbs: Vec<Db>,
    /// Exports and installs the snapshots of the environment's shards.
    copy: Arc<dyn ShardCopy>,
    /// When set: which shards this node may found a group of.
    may_found: Option<MayFound>,
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
    reads: HashMap<Vec<u8>, (GroupId, Done, std::time::Instant)>,
    /// The read asked of each group in this pass: later reads of the pass
    /// join it (one quorum round confirms them all, as it was asked after
    /// every one of them arrived).
    open_reads: HashMap<GroupId, Vec<u8>>,
    next_read: u64,
    /// Groups that installed a snapshot not yet made durable by a
    /// checkpoint, and their messages, held until it is (a member must
    /// not say it has what a crash could take from it).
    installed: std::collections::HashSet<GroupId>,
    held: BTreeMap<u64, Vec<GroupMessage>>,
    /// Groups loaded with a tail recovery left in LMDB, deleted by the next
    /// pass (see [`read_tail`]).
    recovered: std::collections::HashSet<GroupId>,
    /// Whether the environment has a metadata log (`meta.wal`): without
    /// one, LMDB's synced commits are the only record of hard states.
    logged: bool,
    /// Where deferrals, leases and reads' ages are measured.
    clock: Clock,
    /// The ticks without a leader after which this member campaigns,
    /// fixed (`set_election_tick`); else raft-rs draws it from 10 to 19 at
    /// each reset with the process's random generator.
    election_tick: Option<usize>,
    /// Entries a member keeps in memory below what it applied
    /// ([`group::LOG_WINDOW`]; smaller in simulations, so that members
    /// catch up by snapshot within a short run).
    log_window: u64,
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
        copy: Arc<dyn ShardCopy>,
        transport: Option<Arc<dyn Transport>>,
        may_found: Option<MayFound>,
    ) -> Groups {
        Groups {
            id,
            dbs,
            copy,
            may_found,
            logger: state::logger(),
            groups: HashMap::new(),
            transport,
            outbox: BTreeMap::new(),
            status: Default::default(),
            stopped: None,
            reads: HashMap::new(),
            open_reads: HashMap::new(),
            next_read: 0,
            installed: Default::default(),
            held: BTreeMap::new(),
            recovered: Default::default(),
            logged: false,
            clock: Clock::system(),
            election_tick: None,
            log_window: group::LOG_WINDOW,
        }
    }

    /// Keeps `entries` below what was applied (at least 8) instead of
    /// [`group::LOG_WINDOW`].
    pub fn set_log_window(&mut self, entries: u64) {
        self.log_window = entries.max(8);
    }

    /// Fixes this member's election timeout at `ticks` (at least 10): the
    /// simulation draws it from its seed, so that a run is the same run
    /// every time (raft-rs draws from a random generator of its own).
    pub fn set_election_tick(&mut self, ticks: usize) {
        self.election_tick = Some(ticks.max(10));
    }

    /// The clock the groups measure time on (the engine's).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Says the environment has a metadata log, which records every
    /// group's hard state (see [`Groups::collect`]).
    pub fn set_logged(&mut self, logged: bool) {
        self.logged = logged;
    }

    pub fn status(&self) -> StatusBoard {
        self.status.clone()
    }

    /// Loads every group that has a state in LMDB (a restarted node takes
    /// its part in them again at once).
    pub fn load_stored(&mut self, txn: &RoTxn<WithoutTls>) -> FsResult<()> {
        for (shard, state) in stored_groups(self.dbs[0], txn)? {
            if !self.groups.contains_key(&shard) {
                let group = self.load(txn, shard, Some(state))?;
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
            if state.is_none() && self.may_found.as_ref().is_some_and(|may| !may(shard)) {
                return Err(FsError::Unavailable(format!(
                    "shard {shard}: this node holds no replica of it"
                )));
            }
            let group = self.load(txn, shard, state)?;
            self.groups.insert(shard, group);
        }
        Ok(self.groups.get_mut(&shard).expect("inserted above"))
    }

    fn load(
        &mut self,
        txn: &RoTxn<WithoutTls>,
        shard: GroupId,
        state: Option<GroupState>,
    ) -> FsResult<Group> {
        let mut state = state.unwrap_or_default();
        if state.voters.is_empty() && state.learners.is_empty() {
            // A new group (or one whose state recovery rebuilt from the
            // log alone): this node is its member.
            state.voters = vec![self.id];
        }
        let tail = match read_tail(self.dbs[0], txn, shard)? {
            Some(tail) => {
                // Deleted by the next pass: from then on the group's
                // entries are in memory and in each checkpoint's carry.
                self.recovered.insert(shard);
                tail
            }
            None => Tail::default(),
        };
        let conf = ConfState::from((state.voters.clone(), state.learners.clone()));
        let storage = GroupStore::new(MemStorage::new_with_conf_state(conf.clone()));
        if state.applied_index > 0 {
            let mut snapshot = Snapshot::default();
            let meta = snapshot.mut_metadata();
            meta.index = state.applied_index;
            meta.term = state.applied_term;
            meta.set_conf_state(conf);
            storage
                .mem
                .wl()
                .apply_snapshot(snapshot)
                .map_err(raft_err(shard))?;
        }
        let mut entries: Vec<Entry> = tail
            .entries
            .iter()
            .filter(|e| e.index > state.applied_index)
            .map(from_log_entry)
            .collect();
        if entries
            .first()
            .is_some_and(|e| e.index != state.applied_index + 1)
        {
            // Entries that followed a snapshot which no checkpoint made
            // durable: this member never said it had them (its messages
            // were held), and the leader sends the snapshot again.
            tracing::info!(
                shard,
                applied = state.applied_index,
                first = entries[0].index,
                "dropping log entries that followed a snapshot lost in a crash"
            );
            entries.clear();
        }
        if !entries.is_empty() {
            storage.mem.wl().append(&entries).map_err(raft_err(shard))?;
        }
        let hs = tail.hard_state.unwrap_or(state.hard_state);
        let last = entries.last().map_or(state.applied_index, |e| e.index);
        storage.mem.wl().set_hardstate(PbHardState {
            term: hs.term.max(state.applied_term),
            vote: hs.vote,
            commit: hs.commit.clamp(state.applied_index, last),
            ..Default::default()
        });
        let config = self.config(state.applied_index);
        let mut raw = RawNode::new(&config, storage, &self.logger).map_err(raft_err(shard))?;
        if alone(&state) && state.voters == [self.id] {
            raw.campaign().map_err(raft_err(shard))?;
        }
        Ok(Group::new(
            shard,
            raw,
            (state.applied_index, state.applied_term),
        ))
    }

    /// Makes this node a new member of `shard`'s group, with nothing yet:
    /// the leader sends it a snapshot, then the log. Nothing is stored
    /// until the snapshot is installed (a restart before forgets it, and
    /// the member change is made again).
    /// `leader` (the member adding this node) is a member of the group
    /// this node joins: a group this node already has without it is a
    /// stale one (of a copy that did not come from the group), and goes.
    pub fn join(&mut self, txn: &mut RwTxn, shard: GroupId, leader: u64) -> FsResult<()> {
        let has_leader = |voters: &[u64], learners: &[u64]| {
            leader == 0 || voters.contains(&leader) || learners.contains(&leader)
        };
        if let Some(group) = self.groups.get(&shard) {
            let conf = group.raw.raft.prs().conf().to_conf_state();
            if group.raw.raft.leader_id == leader || has_leader(&conf.voters, &conf.learners) {
                return Ok(());
            }
        } else if let Some(state) = read_group_state(self.dbs[0], txn, shard)? {
            if has_leader(&state.voters, &state.learners) {
                return Ok(());
            }
        }
        if self.groups.remove(&shard).is_some() {
            tracing::info!(
                shard,
                "dropping a stale group of the shard to join the live one"
            );
        }
        self.dbs[0]
            .delete(txn, &group_state_key(shard))
            .map_err(lmdb_err)?;
        // A tail recovery left for the stale group is not this group's.
        delete_tail(self.dbs[0], txn, shard)?;
        self.recovered.remove(&shard);
        let config = self.config(0);
        let storage = GroupStore::new(MemStorage::new());
        let raw = RawNode::new(&config, storage, &self.logger).map_err(raft_err(shard))?;
        self.groups.insert(shard, Group::new(shard, raw, (0, 0)));
        tracing::info!(shard, "joining the shard's group; waiting for a snapshot");
        Ok(())
    }

    fn config(&self, applied: u64) -> raft::Config {
        raft::Config {
            id: self.id,
            applied,
            election_tick: 10,
            heartbeat_tick: 3,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            // A commit is not sent on its own: followers learn it with the
            // next append or heartbeat (at most `heartbeat_tick` later; a
            // leader's reads and answers do not wait for them). One message
            // and one follower pass less per commit: 8% less CPU, 6% more
            // creates with 3 copies here.
            skip_bcast_commit: true,
            min_election_tick: self.election_tick.unwrap_or(0),
            max_election_tick: self.election_tick.map_or(0, |t| t + 1),
            ..Default::default()
        }
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
        if let Some(to) = raft.lead_transferee {
            return Err(FsError::Unavailable(format!(
                "shard {shard}: this node is handing the group's leadership to member {to:016x}"
            )));
        }
        if group.spec_index < group.term_start {
            return Err(FsError::Unavailable(format!(
                "shard {shard}: the new leader is still applying the entries of earlier terms"
            )));
        }
        Ok(())
    }

    /// The lowest id this leader's mutations of `shard` may hand out: its
    /// term's own range of ids ([`ID_TERM_SHIFT`]).
    pub fn id_floor(&self, shard: GroupId) -> u64 {
        self.groups
            .get(&shard)
            .map_or(0, |g| g.raw.raft.term.min(ID_TERM_MAX) << ID_TERM_SHIFT)
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

    /// Proposes a change of `shard`'s members (this node must lead it);
    /// `done` is answered once the change is committed and applied here.
    /// A member added gets a snapshot first: the leader drops the entries
    /// it applied from its log, so no member replays the log onto a copy
    /// of the shard that did not come from the group.
    pub fn propose_members(&mut self, shard: GroupId, change: ConfChangeV2, done: Done) {
        let Some(group) = self.groups.get_mut(&shard) else {
            done(Err(FsError::Io(format!(
                "shard {shard}: changing the members of a group that is not loaded"
            ))));
            return;
        };
        let conf = group.raw.raft.prs().conf().to_conf_state();
        let adds = change
            .get_changes()
            .iter()
            .any(|c| !conf.voters.contains(&c.node_id) && !conf.learners.contains(&c.node_id));
        if adds {
            let applied = group.raw.raft.raft_log.applied;
            group.raw.store().compact_to(applied);
        }
        Self::end_lease(&self.status, shard, group);
        group.members_at = Some(self.clock.now());
        match group.raw.propose_conf_change(Vec::new(), change) {
            Ok(()) => {
                let index = group.raw.raft.raft_log.last_index();
                let term = group.raw.raft.term;
                group.touched = true;
                group.waiting.push_back((index, term, done));
            }
            Err(e) => done(Err(FsError::Unavailable(format!(
                "shard {shard}: member change refused: {e}"
            )))),
        }
    }

    /// Hands the leadership of `shard` to member `to` (this node must
    /// lead; `to` takes over once its log is caught up).
    pub fn transfer(&mut self, shard: GroupId, to: u64) -> FsResult<()> {
        let group = self.groups.get_mut(&shard).ok_or_else(|| {
            FsError::Unavailable(format!("shard {shard}: this node has no member of it"))
        })?;
        if group.raw.raft.state != StateRole::Leader {
            return Err(FsError::Unavailable(format!(
                "shard {shard}: this node does not lead it"
            )));
        }
        Self::end_lease(&self.status, shard, group);
        group.no_lease_term = group.raw.raft.term;
        group.raw.transfer_leader(to);
        group.touched = true;
        Ok(())
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
            let group = self.load(txn, shard, Some(state))?;
            self.groups.insert(shard, group);
        }
        let group = self.groups.get_mut(&shard).expect("loaded above");
        group.touched = true;
        if let Err(e) = group.raw.step(m.message) {
            tracing::debug!(shard, error = %e, "a Raft message was not taken");
        }
        Ok(())
    }

    /// One tick of every group's clock (elections and heartbeats). Reads
    /// not confirmed within `READ_WAIT` (the quorum's answers were lost)
    /// are answered `Unavailable`, and asked again by their callers.
    pub fn tick(&mut self) {
        for group in self.groups.values_mut() {
            group.raw.tick();
        }
        let expired: Vec<Vec<u8>> = self
            .reads
            .iter()
            .filter(|(_, (_, _, at))| self.clock.since(*at) > READ_WAIT)
            .map(|(ctx, _)| ctx.clone())
            .collect();
        for ctx in expired {
            if let Some((shard, done, _)) = self.reads.remove(&ctx) {
                done(Err(FsError::Unavailable(format!(
                    "shard {shard}: a majority of its members did not confirm the leader in {READ_WAIT:?}"
                ))));
            }
        }
    }

    /// Whether a pass has anything to do without new mutations.
    pub fn has_work(&self) -> bool {
        self.groups
            .values()
            .any(|g| g.raw.has_ready() || !g.late.is_empty() || g.leading != g.is_leader())
            || self.next_apply().is_some_and(|at| at <= self.clock.now())
    }

    /// When a follower must apply the entries it holds back next.
    pub fn next_apply(&self) -> Option<std::time::Instant> {
        self.groups
            .values()
            .filter_map(|g| g.deferred_since)
            .min()
            .map(|since| since + group::APPLY_DELAY)
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
            if group.deposed() {
                group.step_down(shard, &self.dbs, txn)?;
                deposed.push(shard);
            }
            if !group.leading && group.is_leader() {
                // A new leader serves from its LMDB state: all of it.
                group.apply_deferred(shard, &self.dbs, txn)?;
            }
            group.follow_role(shard);
        }
        if !deposed.is_empty() {
            let cancelled: Vec<Vec<u8>> = self
                .reads
                .iter()
                .filter(|(_, (shard, _, _))| deposed.contains(shard))
                .map(|(ctx, _)| ctx.clone())
                .collect();
            for ctx in cancelled {
                if let Some((shard, done, _)) = self.reads.remove(&ctx) {
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
        // The reads asked so far go out with this pass's messages.
        self.open_reads.clear();
        let mut out = Unpersisted {
            readies: Vec::new(),
            record: LogRecord::default(),
        };
        for shard in std::mem::take(&mut self.recovered) {
            delete_tail(self.dbs[0], txn, shard)?;
        }
        let now = self.clock.now();
        // Held back entries stay well inside the window the log keeps.
        let defer_max = group::DEFER_MAX.min(self.log_window as usize / 2).max(1);
        for (&shard, group) in self.groups.iter_mut() {
            let late = std::mem::take(&mut group.late);
            group.take_committed(shard, &self.dbs, txn, &late, (now, defer_max))?;
            if group.raw.has_ready() {
                group.touched = true;
                let mut rd = group.raw.ready();
                // Confirmed reads wait until what was committed when they
                // asked is applied.
                for state in rd.take_read_states() {
                    if let Some((_, done, asked)) = self.reads.remove(&state.request_ctx) {
                        group.renew_lease(asked);
                        let term = group.raw.raft.raft_log.term(state.index).unwrap_or(0);
                        group.waiting.push_back((state.index, term, done));
                    }
                }
                if !rd.snapshot().is_empty() {
                    let snap = rd.snapshot().clone();
                    snapshot::install(&*self.copy, shard, txn, &snap)?;
                    let meta = snap.get_metadata();
                    group.spec_index = meta.index;
                    group.spec_term = meta.term;
                    group.members_index = meta.index;
                    group.undo.clear();
                    group.late.clear();
                    group.deferred.retain(|e| e.index > meta.index);
                    if group.deferred.is_empty() {
                        group.deferred_since = None;
                    }
                    group.state_dirty = true;
                    group
                        .raw
                        .store()
                        .mem
                        .wl()
                        .apply_snapshot(snap)
                        .map_err(raft_err(shard))?;
                    self.installed.insert(shard);
                }
                // A leader sends its appends while it persists them.
                for message in rd.take_messages() {
                    push(&mut self.outbox, shard, message);
                }
                let committed = rd.take_committed_entries();
                group.take_committed(shard, &self.dbs, txn, &committed, (now, defer_max))?;
                let entries: Vec<LogEntry> = rd.entries().iter().map(to_log_entry).collect();
                let hs = rd.hs().map(hard_state);
                if !rd.entries().is_empty() {
                    group
                        .raw
                        .store()
                        .mem
                        .wl()
                        .append(rd.entries())
                        .map_err(raft_err(shard))?;
                }
                if let Some(pb) = rd.hs() {
                    group.raw.store().mem.wl().set_hardstate(pb.clone());
                    // This pass's log record holds the new hard state, and
                    // a checkpoint's carry holds that of every group with
                    // other members (see `carry`): LMDB's copy of theirs
                    // waits for the next change of what they applied.
                    if group.alone() || !self.logged {
                        group.state_dirty = true;
                    }
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

    /// Answers the callers whose entry is committed (and in LMDB's
    /// committed state), as soon as the members' acknowledgements stepped
    /// in a pass say so, before that pass's own writes.
    pub fn answer_committed(&mut self) {
        for (&shard, group) in self.groups.iter_mut() {
            if !group.waiting.is_empty() {
                group.answer(shard);
            }
        }
    }

    /// After the record of `pending` is durable: the groups advance and
    /// the messages of the pass go out (a follower's acknowledgements say
    /// only that the log holds the entries). Callers are answered by
    /// [`Groups::settle`], once LMDB committed.
    pub fn persisted(&mut self, pending: Unpersisted) {
        for (shard, mut rd) in pending.readies {
            let Some(group) = self.groups.get_mut(&shard) else {
                continue;
            };
            // A follower acknowledges what is now durable; a group whose
            // snapshot waits for a checkpoint says nothing yet.
            let outbox = if self.installed.contains(&shard) {
                &mut self.held
            } else {
                &mut self.outbox
            };
            for message in rd.take_persisted_messages() {
                push(outbox, shard, message);
            }
            let mut light = group.raw.advance(rd);
            for message in light.take_messages() {
                push(outbox, shard, message);
            }
            // Entries committed by this very persist are usually this
            // leader's own, already in LMDB; others are applied next pass.
            for e in light.take_committed_entries() {
                if e.index > group.spec_index || is_members(&e) {
                    group.late.push(e);
                } else {
                    group.undo.retain(|(i, _)| *i > e.index);
                }
            }
            group.raw.advance_apply();
        }
        self.flush();
    }

    /// After LMDB committed the pass: callers whose entry is committed are
    /// answered, logs are compacted and the groups' status published.
    pub fn settle(&mut self) {
        self.answer_committed();
        for group in self.groups.values_mut() {
            if group.touched {
                group.compact(self.log_window);
            }
        }
        self.publish();
    }

    /// A pass failed after proposing: every caller waiting on a group is
    /// answered with `e`, and no change is accepted any more.
    pub fn stop(&mut self, e: &FsError) {
        self.stopped = Some(e.to_string());
        for (_, (_, done, _)) in self.reads.drain() {
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
    pub fn carry(&self) -> FsResult<LogRecord> {
        let mut record = LogRecord::default();
        for (&shard, group) in &self.groups {
            let hs = hard_state(&group.raw.raft.hard_state());
            let applied = group.spec_index.min(group.raw.raft.raft_log.committed);
            let last = group.raw.raft.raft_log.last_index();
            if group.alone() && last <= applied {
                // Its state in LMDB says everything.
                continue;
            }
            let entries = if last > applied {
                // The log must still hold every entry LMDB lacks: a carry
                // without one would make the checkpoint drop it.
                group
                    .raw
                    .raft
                    .raft_log
                    .entries(applied + 1, u64::MAX, raft::GetEntriesContext::empty(false))
                    .map(|es| es.iter().map(to_log_entry).collect())
                    .map_err(|e| {
                        FsError::Io(format!(
                            "shard {shard}: the entries after {applied}, which LMDB has not applied, are not in the log ({e}); no checkpoint is taken"
                        ))
                    })?
            } else {
                Vec::new()
            };
            record.groups.push(GroupWrite {
                group: shard,
                entries,
                hard_state: Some(hs),
            });
        }
        Ok(record)
    }

    /// Sends what the groups have for other members now (a leader's
    /// appends may go out before it makes them durable itself: Raft counts
    /// the leader's own copy only once it is persisted).
    pub fn flush(&mut self) {
        let outbox = std::mem::take(&mut self.outbox);
        let mut snapshots = Vec::new();
        if let Some(transport) = &self.transport {
            for (to, messages) in outbox {
                for m in &messages {
                    if m.message.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot {
                        snapshots.push((m.group, to));
                    }
                }
                transport.send(to, messages);
            }
        }
        // The transport does not say when a member has a snapshot: the
        // leader probes it with appends once sent (and sends another
        // snapshot if that one was lost).
        for (shard, to) in snapshots {
            if let Some(group) = self.groups.get_mut(&shard) {
                group.raw.report_snapshot(to, SnapshotStatus::Finish);
            }
        }
    }

    /// After a commit that made everything before it durable (a
    /// checkpoint, or LMDB's own synced commit): the groups that installed
    /// snapshots say so, and what they held goes out.
    pub fn durable(&mut self) {
        if self.installed.is_empty() {
            return;
        }
        self.installed.clear();
        for (to, mut messages) in std::mem::take(&mut self.held) {
            self.outbox.entry(to).or_default().append(&mut messages);
        }
        self.flush();
    }

    /// Whether a group installed a snapshot that only a checkpoint makes
    /// durable.
    pub fn installing(&self) -> bool {
        !self.installed.is_empty()
    }
}

fn push(outbox: &mut BTreeMap<u64, Vec<GroupMessage>>, group: GroupId, message: Message) {
    outbox
        .entry(message.to)
        .or_default()
        .push(GroupMessage { group, message });
}

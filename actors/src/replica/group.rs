//! One shard's Raft group as its environment's writer drives it: what
//! this node applied, who waits for a commit, how a deposed leader takes
//! back what it did not commit, and how committed entries are applied.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use heed::RwTxn;
use raft::eraftpb::{ConfChangeV2, Entry, EntryType};
use raft::{ProgressState, RawNode, StateRole};

use curvine_messages::wal::{GroupId, GroupState};
use curvine_messages::{FsError, FsResult};

use super::snapshot::GroupStore;
use super::state::decode_changes;
use super::{hard_state, Done};
use crate::txn::{lmdb_err, Db, Undo};

pub(super) struct Group {
    pub(super) raw: RawNode<GroupStore>,
    /// The last entry whose changes are in LMDB (applied, or proposed by
    /// this leader ahead of its commit), and its term.
    pub(super) spec_index: u64,
    pub(super) spec_term: u64,
    /// Whether LMDB's [`GroupState`] is behind.
    pub(super) state_dirty: bool,
    /// Callers answered once the group commits the entry (index, term)
    /// they wait for.
    pub(super) waiting: VecDeque<(u64, u64, Done)>,
    /// How to take back this leader's entries past the commit.
    pub(super) undo: VecDeque<(u64, Vec<Undo>)>,
    /// Whether this node led the group at the end of the last pass, and
    /// the first index of its term as leader.
    pub(super) leading: bool,
    pub(super) term_start: u64,
    /// The term this node leads in (while `leading`), and the entry its
    /// LMDB state ended with before the first entry of that term: what it
    /// goes back to if no entry of its term survives its leadership.
    pub(super) lead_term: u64,
    pub(super) before_term: (u64, u64),
    /// Committed entries learnt after a pass persisted: applied first in
    /// the next pass.
    pub(super) late: Vec<Entry>,
    /// Committed entries this follower has not applied yet, and when the
    /// first of them came (see [`APPLY_DELAY`]).
    pub(super) deferred: Vec<Entry>,
    pub(super) deferred_since: Option<Instant>,
    /// Whether the group did anything since its status was published.
    pub(super) touched: bool,
    /// The last member change applied.
    pub(super) members_index: u64,
    /// While this node leads: until when no other member can have been
    /// elected (see [`super::LEASE`]).
    pub(super) lease_until: Option<std::time::Instant>,
    /// A term in which this leader handed its leadership on (a member
    /// told to campaign at once ignores leases): no lease in it.
    pub(super) no_lease_term: u64,
    /// When this leader last proposed a change of members: a quorum that
    /// confirmed it before then may not be one of the new members.
    pub(super) members_at: Option<std::time::Instant>,
    /// Since when a member has waited for a snapshot this leader could not
    /// make, and its commit then (see `Groups::make_snapshots`).
    pub(super) snapshot_stuck: Option<(Instant, u64)>,
}

/// How long a follower of a replicated group may hold committed entries
/// before it applies them to LMDB. A follower's LMDB state serves no reads
/// (the leader's does) and its log already holds the entries durably, so
/// applying those of many passes in one transaction costs it one write of
/// each B-tree page they touch instead of one per pass. It applies at once
/// what it holds when it becomes leader and when a member change comes; a
/// snapshot drops what it covers.
pub(super) const APPLY_DELAY: Duration = Duration::from_millis(20);

/// Committed entries a follower holds at most before it applies them (well
/// inside the window of entries its log keeps for the others, so a
/// checkpoint can always write them again).
pub(super) const DEFER_MAX: usize = 1024;

/// Entries a member keeps in memory below what it applied, for members
/// that are behind: a leader's members further behind, and a follower's
/// once it leads, get a snapshot instead.
pub(super) const LOG_WINDOW: u64 = 4096;

pub(super) fn is_members(e: &Entry) -> bool {
    e.get_entry_type() != EntryType::EntryNormal
}

impl Group {
    /// A group around `raw` that has applied up to `applied` (index, term),
    /// following whatever role raft-rs gave it.
    pub(super) fn new(shard: GroupId, raw: RawNode<GroupStore>, applied: (u64, u64)) -> Group {
        let mut group = Group {
            raw,
            spec_index: applied.0,
            spec_term: applied.1,
            state_dirty: false,
            waiting: VecDeque::new(),
            undo: VecDeque::new(),
            leading: false,
            term_start: 0,
            lead_term: 0,
            before_term: applied,
            late: Vec::new(),
            deferred: Vec::new(),
            deferred_since: None,
            touched: true,
            members_index: applied.0,
            lease_until: None,
            no_lease_term: 0,
            members_at: None,
            snapshot_stuck: None,
        };
        group.follow_role(shard);
        group
    }

    /// Whether the group has no member but this node.
    pub(super) fn alone(&self) -> bool {
        let conf = self.raw.raft.prs().conf();
        conf.voters().ids().len() <= 1 && conf.learners().is_empty()
    }

    pub(super) fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Notes a change of role. A new leader that has applied everything
    /// before the entry it appended for its term counts that entry (which
    /// changes nothing) as applied, so it serves at once.
    pub(super) fn follow_role(&mut self, shard: GroupId) {
        let leader = self.is_leader();
        if leader && !self.leading {
            let last = self.raw.raft.raft_log.last_index();
            self.term_start = last;
            self.lead_term = self.raw.raft.term;
            let before = last.saturating_sub(1);
            self.before_term = (
                before,
                self.raw
                    .raft
                    .raft_log
                    .term(before)
                    .unwrap_or(self.spec_term),
            );
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
        if !leader {
            self.lease_until = None;
        }
        self.leading = leader;
    }

    /// A quorum confirmed this leader for a read asked at `asked`: no
    /// other member can be elected before `asked + LEASE`, unless this
    /// leader handed its leadership on or changed its members since.
    pub(super) fn renew_lease(&mut self, asked: std::time::Instant) {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader
            || raft.lead_transferee.is_some()
            || raft.term == self.no_lease_term
            || self.members_at.is_some_and(|at| at >= asked)
        {
            return;
        }
        let until = asked + super::LEASE;
        if self.lease_until.is_none_or(|t| t < until) {
            self.lease_until = Some(until);
        }
    }

    /// Whether this node no longer leads the term it led in (it may lead
    /// a later one already).
    pub(super) fn deposed(&self) -> bool {
        self.leading && (!self.is_leader() || self.raw.raft.term != self.lead_term)
    }

    /// Whether the log holds entry `index` of term `term` (an entry
    /// compacted away was committed, and stays).
    fn holds(&self, index: u64, term: u64) -> bool {
        let log = &self.raw.raft.raft_log;
        match log.term(index) {
            Ok(t) => t == term,
            Err(_) => index <= log.committed,
        }
    }

    /// This node no longer leads: what it changed that is not committed is
    /// taken back (the entries may still commit under the new leader, and
    /// are then applied from the log), and its callers waiting on them
    /// learn that their operation may or may not happen.
    ///
    /// An entry of its term counts as committed only where the log holds
    /// it at that index with that term: by the time this runs, the new
    /// leader's appends may have replaced it and its commit index passed
    /// it. Comparing indexes alone kept such a replaced change in LMDB and
    /// skipped the new leader's entry at that index as "already applied".
    pub(super) fn step_down(
        &mut self,
        shard: GroupId,
        dbs: &[Db],
        txn: &mut RwTxn,
    ) -> FsResult<()> {
        let committed = self.raw.raft.raft_log.committed;
        if self.spec_index >= self.term_start && self.lead_term > 0 {
            // The last entry of this leadership that the log holds as
            // committed (by Raft's log matching, every entry before it
            // of the term is kept too).
            let mut top = self.spec_index.min(committed);
            while top >= self.term_start && !self.holds(top, self.lead_term) {
                top -= 1;
            }
            let kept = (top >= self.term_start).then_some(top);
            let floor = kept.unwrap_or(self.before_term.0);
            while let Some((index, undo)) = self.undo.pop_back() {
                if index <= floor {
                    self.undo.clear();
                    break;
                }
                crate::txn::undo(txn, dbs, &undo).map_err(lmdb_err)?;
            }
            let spec = kept.map_or(self.before_term, |k| (k, self.lead_term));
            if spec != (self.spec_index, self.spec_term) {
                (self.spec_index, self.spec_term) = spec;
                self.state_dirty = true;
            }
        } else if self.spec_index > committed {
            // Still applying earlier terms' entries: those it applied are
            // committed, and it proposed nothing.
            self.spec_index = committed;
            self.spec_term = self.raw.raft.raft_log.term(committed).unwrap_or(0);
            self.state_dirty = true;
        }
        let leader = self.raw.raft.leader_id;
        for (index, term, done) in std::mem::take(&mut self.waiting) {
            if index <= committed.min(self.spec_index) && (index == 0 || self.holds(index, term)) {
                done(Ok(()));
            } else {
                done(Err(FsError::Unavailable(format!(
                    "shard {shard}: leadership moved (to member {leader}) before the operation was committed; it may or may not have been applied"
                ))));
            }
        }
        self.leading = false;
        tracing::info!(
            shard,
            leader,
            committed,
            "this node no longer leads the shard's group"
        );
        Ok(())
    }

    /// Takes committed entries: a follower of shard `shard` (other than
    /// the cluster map's) holds them up to [`APPLY_DELAY`] and applies them
    /// with those that follow; anything else applies what it holds and
    /// `entries` now.
    pub(super) fn take_committed(
        &mut self,
        shard: GroupId,
        dbs: &[Db],
        txn: &mut RwTxn,
        entries: &[Entry],
        (now, defer_max): (Instant, usize),
    ) -> FsResult<()> {
        if entries.is_empty() && !self.deferral_due(now, defer_max) {
            return Ok(());
        }
        let defer = shard != 0
            && !self.is_leader()
            && self.waiting.is_empty()
            && self.raw.raft.prs().conf().voters().ids().len() > 1
            && !entries.iter().any(is_members);
        if !defer && self.deferred.is_empty() {
            return self.apply_committed(shard, dbs, txn, entries);
        }
        if self.deferred.is_empty() && !entries.is_empty() {
            self.deferred_since = Some(now);
        }
        self.deferred.extend_from_slice(entries);
        if defer && !self.deferral_due(now, defer_max) {
            return Ok(());
        }
        self.apply_deferred(shard, dbs, txn)
    }

    /// Applies the committed entries this follower held back.
    pub(super) fn apply_deferred(
        &mut self,
        shard: GroupId,
        dbs: &[Db],
        txn: &mut RwTxn,
    ) -> FsResult<()> {
        self.deferred_since = None;
        let entries = std::mem::take(&mut self.deferred);
        self.apply_committed(shard, dbs, txn, &entries)
    }

    /// Whether the entries held back must be applied by `now`.
    pub(super) fn deferral_due(&self, now: Instant, defer_max: usize) -> bool {
        self.deferred.len() >= defer_max
            || self
                .deferred_since
                .is_some_and(|since| now >= since + APPLY_DELAY)
    }

    /// Applies committed entries past what LMDB holds (a follower's, or a
    /// new leader's from earlier terms), and membership changes.
    pub(super) fn apply_committed(
        &mut self,
        shard: GroupId,
        dbs: &[Db],
        txn: &mut RwTxn,
        entries: &[Entry],
    ) -> FsResult<()> {
        for e in entries {
            if is_members(e) {
                // Never in LMDB before it commits, even on the leader that
                // proposed it.
                if e.index > self.members_index {
                    self.apply_members(shard, e)?;
                    self.members_index = e.index;
                }
                if e.index > self.spec_index {
                    self.spec_index = e.index;
                    self.spec_term = e.term;
                }
                self.state_dirty = true;
                continue;
            }
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
                _ => {}
            }
            self.spec_index = e.index;
            self.spec_term = e.term;
            self.state_dirty = true;
        }
        Ok(())
    }

    pub(super) fn apply_members(&mut self, shard: GroupId, e: &Entry) -> FsResult<()> {
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
                self.raw.store().mem.wl().set_conf_state(conf);
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
    pub(super) fn answer(&mut self, shard: GroupId) {
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

    /// The committed entry whose state LMDB holds now, if it holds one: a
    /// snapshot for members is made of it. Past the commit a leader's LMDB
    /// state holds its own proposals, but entries that change nothing (the
    /// empty entry a new leader appends for its term, member changes,
    /// applied only once committed) leave it the state of the commit. A
    /// new leader whose followers all need a snapshot therefore still makes
    /// one: refusing it until its term's entry commits, which needs those
    /// followers, left the group without a serving leader for good.
    pub(super) fn snapshot_point(&self) -> Option<(u64, u64)> {
        let log = &self.raw.raft.raft_log;
        let committed = log.committed;
        if self.spec_index <= committed {
            return Some((self.spec_index, self.spec_term));
        }
        let ahead = log
            .entries(committed + 1, None, raft::GetEntriesContext::empty(false))
            .ok()?;
        let inert = ahead
            .iter()
            .take_while(|e| e.index <= self.spec_index)
            .all(|e| is_members(e) || e.data.is_empty());
        if !inert {
            return None;
        }
        Some((committed, log.term(committed).ok()?))
    }

    /// Drops log entries no member needs any more; `window`: the entries
    /// kept below what was applied ([`LOG_WINDOW`] but in simulations).
    pub(super) fn compact(&mut self, window: u64) {
        // What LMDB holds: raft-rs counts as applied the entries this pass
        // learnt committed (`late`), which only the next pass applies;
        // until then a checkpoint's carry must still find them here.
        let applied = self.raw.raft.raft_log.applied.min(self.spec_index);
        let first = raft::Storage::first_index(self.raw.store()).unwrap_or(applied);
        let mut upto = applied;
        if self.is_leader() {
            let mut lagging = false;
            for (id, progress) in self.raw.raft.prs().iter() {
                if *id == self.raw.raft.id {
                    continue;
                }
                if applied.saturating_sub(progress.matched) > window {
                    // A member this far behind (down, or cut off) catches
                    // up by snapshot: the leader does not keep every entry
                    // in memory for it for as long as it is away.
                    lagging = true;
                    continue;
                }
                upto = upto.min(progress.matched);
                lagging |= progress.state == ProgressState::Snapshot;
            }
            if !lagging {
                self.raw.store().drop_snapshot_below(upto);
            }
        } else if self.raw.raft.prs().conf().voters().ids().len() > 1 {
            // A follower may lead later: it keeps a window for the others.
            upto = applied.saturating_sub(window);
        }
        if upto > first + 64.min(window) {
            let _ = self.raw.store().mem.wl().compact(upto);
        }
    }

    pub(super) fn state(&self) -> GroupState {
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

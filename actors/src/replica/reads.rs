//! Reads of a replicated shard: the leader's ReadIndex rounds, its lease,
//! and the wait of a read for what it saw to be committed.

use heed::{RoTxn, WithoutTls};
use raft::StateRole;

use curvine_messages::wal::GroupId;
use curvine_messages::{FsError, FsResult};

use super::group::Group;
use super::{Done, Groups, StatusBoard};

/// How long after a leader asked a quorum to confirm it (a ReadIndex
/// round) it may serve reads without asking again: half the shortest
/// election timeout (10 ticks). A member that heard from its leader
/// within an election timeout refuses to vote for another (raft-rs with
/// `check_quorum`), and a member's ticks are never closer than one tick,
/// so no other leader can be elected before the confirmation plus 9 ticks;
/// the other half is margin for the members' clocks running at different
/// rates. Leader transfers (whose target campaigns regardless of leases)
/// and member changes end the lease.
pub const LEASE: std::time::Duration = std::time::Duration::from_millis(500);

impl Groups {
    /// Ends `group`'s lease, on the status board too (readers trust it
    /// before this pass's messages go out).
    pub(super) fn end_lease(status: &StatusBoard, shard: GroupId, group: &mut Group) {
        group.lease_until = None;
        if let Some(s) = status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&shard)
        {
            s.lease_until = None;
        }
    }

    /// Answers `done` once `shard`'s entry at `index` of term `term` is
    /// committed here, or with an error if another entry took its place.
    /// A leader's LMDB state holds its changes from the moment it proposes
    /// them: a read that saw the state up to that entry (the group's
    /// applied index in the state it read) waits for it, so no answer
    /// shows a change that a new leader could take back.
    pub fn wait_for(&mut self, shard: GroupId, index: u64, term: u64, done: Done) {
        let Some(group) = self.groups.get_mut(&shard) else {
            // Never loaded: nothing of it is speculative.
            done(Ok(()));
            return;
        };
        let raft = &group.raw.raft;
        // The entry in this node's log at `index` (none once compacted, or
        // if the log is shorter now).
        let logged = index == 0 || raft.raft_log.term(index).ok() == Some(term);
        if index <= raft.raft_log.committed.min(group.spec_index) {
            done(if logged {
                Ok(())
            } else {
                Err(FsError::Unavailable(format!(
                    "shard {shard}: what the read saw was replaced by another leader's entries; read again"
                )))
            });
        } else if raft.state != StateRole::Leader || !logged {
            // Only this node's own term can still commit it here: a
            // follower (or a log that lost it) would wait forever.
            done(Err(FsError::Unavailable(format!(
                "shard {shard}: what the read saw is not committed and this node no longer leads; read again"
            ))));
        } else {
            let at = group.waiting.partition_point(|(i, _, _)| *i <= index);
            group.waiting.insert(at, (index, term, done));
        }
    }

    /// Answers `done` once this node has confirmed with a quorum of
    /// `shard`'s group that it still leads (Raft's ReadIndex) and has
    /// applied everything committed at that moment: what it then reads is
    /// linearizable. Reads asked of a group in one pass share one quorum
    /// round. Refused when this node does not lead; a leader that
    /// loses its leadership before the quorum answers refuses it then.
    pub fn read_barrier(&mut self, txn: &RoTxn<WithoutTls>, shard: GroupId, done: Done) {
        if let Err(e) = self.check_leader(txn, shard) {
            done(Err(e));
            return;
        }
        let group = self.groups.get_mut(&shard).expect("loaded by check_leader");
        let raft = &group.raw.raft;
        // Raft drops (without a word) a read asked of a leader that has
        // not committed an entry of its own term yet.
        if raft.raft_log.term(raft.raft_log.committed).unwrap_or(0) != raft.term {
            done(Err(FsError::Unavailable(format!(
                "shard {shard}: the new leader has not committed an entry of its term yet"
            ))));
            return;
        }
        if let Some(entry) = self
            .open_reads
            .get(&shard)
            .and_then(|ctx| self.reads.get_mut(ctx))
        {
            let first = std::mem::replace(&mut entry.1, Box::new(|_| {}));
            entry.1 = Box::new(move |r: FsResult<()>| {
                first(r.clone());
                done(r);
            });
            return;
        }
        let ctx = self.next_read.to_le_bytes().to_vec();
        self.next_read += 1;
        self.open_reads.insert(shard, ctx.clone());
        group.raw.read_index(ctx.clone());
        group.touched = true;
        self.reads.insert(ctx, (shard, done, self.clock.now()));
    }
}

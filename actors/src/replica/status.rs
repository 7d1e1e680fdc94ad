//! What other threads may know of an environment's groups: each group's
//! status, published by the writer after every pass that touched it.

use raft::StateRole;

use super::Groups;

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
    /// While this node leads: how far each other member's log matches
    /// this one's (member id, index).
    pub progress: Vec<(u64, u64)>,
    /// While this node leads: the other members it heard from within the
    /// last election timeout.
    pub active: Vec<u64>,
    /// The first entry this node's log still holds in memory (a member
    /// that lacks an earlier one gets a snapshot).
    pub log_first: u64,
    /// The group is between two sets of voters (joint consensus): a change
    /// of several members at once is half made.
    pub joint: bool,
    /// While this node leads: until when it may serve reads without a
    /// quorum round ([`super::LEASE`]).
    pub lease_until: Option<std::time::Instant>,
}

impl Groups {
    /// Publishes the status of the groups that did something this pass.
    pub(super) fn publish(&mut self) {
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
                    joint: !conf.voters_outgoing.is_empty(),
                    lease_until: group.lease_until,
                    log_first: raft::Storage::first_index(group.raw.store()).unwrap_or(0),
                    voters: conf.voters.clone(),
                    learners: conf.learners.clone(),
                    progress: if raft.state == StateRole::Leader {
                        raft.prs()
                            .iter()
                            .filter(|(id, _)| **id != raft.id)
                            .map(|(id, p)| (*id, p.matched))
                            .collect()
                    } else {
                        Vec::new()
                    },
                    active: if raft.state == StateRole::Leader {
                        raft.prs()
                            .iter()
                            .filter(|(id, p)| **id != raft.id && p.recent_active)
                            .map(|(id, _)| *id)
                            .collect()
                    } else {
                        Vec::new()
                    },
                },
            );
        }
    }
}

//! Keeps each replicated shard's Raft group in step with the cluster map.
//!
//! The map says which nodes hold each shard (its node and its followers);
//! the map is the wish, the groups follow it:
//!
//! - **Planning** (on the node leading shard 0, which holds the map): each
//!   shard gets `meta.replicas` members on distinct nodes, as many as there
//!   are nodes; a node down longer than `cluster.rereplicate_after` loses
//!   its places to nodes that are up (a shard whose node is gone gets a new
//!   one among its followers, the one leading if it can). Members are
//!   spread over the nodes by how many places each already has. A new map
//!   is written with a compare-and-set on shard 0.
//! - **Keeping** (on the node leading each group): a node the map adds is
//!   asked to join and added as a learner (it takes a snapshot, then the
//!   log); the learners are promoted to voters once all of them caught up,
//!   one right after the other; a member the map no longer
//!   names is removed (a leader that is to go hands its leadership to a
//!   caught-up voter first). One change at a time per group, each through
//!   Raft. The map's owner of a shard is its preferred leader: leadership
//!   goes back to it once it is up and caught up.
//!
//! A node being decommissioned (draining) keeps no places: the planner
//! gives them to others, and the leaders remove it from their groups.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use curvine_actors::cluster::ClusterView;
use curvine_actors::membership::{announce, MembershipMsg};
use curvine_actors::namespace::Namespace;
use curvine_actors::replica::{member_id, GroupStatus, MemberChange};
use curvine_actors::supervisor::Slot;
use curvine_messages::cluster::{ClusterMap, MemberState, PeerMsg};
use curvine_messages::{now_ns, FsError, FsResult, ShardId};

use crate::raft_net::RaftInboxes;

/// How often the keeper looks.
const PERIOD: Duration = Duration::from_millis(500);

/// A learner this close to the leader's commit index is caught up.
const CAUGHT_UP: u64 = 16;

/// Drives the intents a shard recorded, in a task (a node that starts
/// serving a shard finishes the operations its last server left).
pub fn redrive(ns: Arc<Namespace>, shard: ShardId) {
    tokio::spawn(async move {
        match ns.redrive(shard).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(shard, intents = n, "recovered pending operations"),
            Err(e) => {
                tracing::error!(shard, error = %e, "recovering pending operations failed")
            }
        }
    });
}

/// How old an intent is before the leader of its shard drives it itself
/// (its coordinator's calls give up well before).
const STALE_INTENT: Duration = Duration::from_secs(20);

/// How often a leader looks for intents older than [`STALE_INTENT`].
const STALE_EVERY: u32 = 10;

/// Drives the intents of `shard` older than [`STALE_INTENT`], unless a
/// drive of that shard is still running.
fn redrive_stale(
    ns: Arc<Namespace>,
    shard: ShardId,
    running: Arc<std::sync::Mutex<std::collections::HashSet<ShardId>>>,
) {
    if !running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(shard)
    {
        return;
    }
    tokio::spawn(async move {
        match ns.redrive_older(shard, STALE_INTENT).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                shard,
                intents = n,
                "finished operations their coordinator left"
            ),
            Err(e) => tracing::debug!(shard, error = %e, "looking for left operations failed"),
        }
        running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&shard);
    });
}

pub struct ShardKeeper {
    pub view: Arc<ClusterView>,
    pub namespace: Arc<Namespace>,
    pub raft: Arc<RaftInboxes>,
    pub membership: Slot<MembershipMsg>,
    /// `meta.replicas`.
    pub replicas: u32,
    /// `cluster.rereplicate_after`.
    pub rereplicate_after: Duration,
    /// The hand-overs of leadership this node asked for (see
    /// [`HandOvers`]).
    pub handovers: std::sync::Mutex<HandOvers>,
}

/// First wait before a hand-over of a shard's leadership that did not take
/// is asked again, and the longest.
const HANDOVER_BACKOFF: Duration = Duration::from_secs(5);
const HANDOVER_MAX_BACKOFF: Duration = Duration::from_secs(300);

/// When this node may next hand each shard's leadership on.
///
/// While a hand-over runs the leader takes no change (raft-rs refuses
/// proposals until the target is elected or an election timeout passed),
/// so a hand-over that does not take (a target that cannot win, or whose
/// log never quite catches up) blocks writes for an election timeout each
/// time it is asked. Asked at every round of the keeper (500 ms), the
/// group took almost no write for as long as it lasted. A hand-over that
/// did not take waits, doubling from [`HANDOVER_BACKOFF`] up to
/// [`HANDOVER_MAX_BACKOFF`]; once this node no longer leads the shard it
/// is forgotten.
#[derive(Debug, Default)]
pub struct HandOvers {
    next: HashMap<ShardId, (std::time::Instant, Duration)>,
}

impl HandOvers {
    /// Whether a hand-over of `shard` may be asked at `now`; if so, the
    /// next one waits longer.
    pub fn try_start(&mut self, shard: ShardId, now: std::time::Instant) -> bool {
        match self.next.get_mut(&shard) {
            Some((at, _)) if now < *at => false,
            Some((at, backoff)) => {
                *backoff = (*backoff * 2).min(HANDOVER_MAX_BACKOFF);
                *at = now + *backoff;
                true
            }
            None => {
                self.next
                    .insert(shard, (now + HANDOVER_BACKOFF, HANDOVER_BACKOFF));
                true
            }
        }
    }

    /// This node leads only `led` now: the others' hand-overs are done.
    pub fn keep_only(&mut self, led: &std::collections::HashSet<ShardId>) {
        self.next.retain(|shard, _| led.contains(shard));
    }
}

/// The keeper's loop (a task of the node's supervision tree).
pub async fn run(keeper: Arc<ShardKeeper>) {
    // The replicated shards this node leads.
    let mut led = std::collections::HashSet::new();
    let stale_running = Arc::default();
    let mut pass: u32 = 0;
    loop {
        tokio::time::sleep(PERIOD).await;
        pass = pass.wrapping_add(1);
        // A new leader of a replicated shard finishes the operations the
        // last one left.
        let map = keeper.view.map();
        let now: Vec<ShardId> = keeper
            .view
            .served_shards()
            .into_iter()
            .filter(|s| map.replicated(*s))
            .collect();
        led.retain(|s| now.contains(s));
        for shard in now {
            if led.insert(shard) {
                redrive(keeper.namespace.clone(), shard);
            } else if pass.is_multiple_of(STALE_EVERY) {
                redrive_stale(keeper.namespace.clone(), shard, Arc::clone(&stale_running));
            }
        }
        if keeper.replicas > 1 {
            if let Err(e) = keeper.plan().await {
                tracing::debug!(error = %e, "shard placement not updated");
            }
        }
        keeper.keep().await;
    }
}

impl ShardKeeper {
    fn state(&self, node: &str) -> Option<(MemberState, i64)> {
        if node == self.view.node_id {
            return Some((MemberState::Up, 0));
        }
        self.view.member(node).map(|m| (m.state, m.since_ns))
    }

    fn up(&self, node: &str) -> bool {
        self.state(node).is_some_and(|(s, _)| s == MemberState::Up)
    }

    fn draining(&self, node: &str) -> bool {
        if node == self.view.node_id {
            return self.view.me().draining;
        }
        self.view.member(node).is_some_and(|m| m.info.draining)
    }

    /// Up, or down for less than `rereplicate_after`, and not being
    /// decommissioned: it keeps its places.
    fn kept(&self, node: &str, now: i64) -> bool {
        if self.draining(node) {
            return false;
        }
        match self.state(node) {
            Some((MemberState::Up, _)) => true,
            Some((MemberState::Down, since)) => {
                now - since < self.rereplicate_after.as_nanos() as i64
            }
            _ => false,
        }
    }

    /// The map the cluster should have: see the module's comment.
    pub fn planned(&self, map: &ClusterMap) -> ClusterMap {
        let now = now_ns();
        let members = self.view.members();
        let takers: Vec<String> = members
            .iter()
            .filter(|m| m.state == MemberState::Up && !m.info.draining)
            .map(|m| m.info.node_id.clone())
            .collect();
        let kept_nodes = members
            .iter()
            .filter(|m| !m.info.draining && self.kept(&m.info.node_id, now))
            .count();
        let want = (self.replicas as usize).min(kept_nodes).max(1);
        let mut next = map.clone();
        next.followers.resize(map.shards.len(), Vec::new());
        let mut load: HashMap<String, usize> = HashMap::new();
        for shard in 0..map.shards.len() {
            for node in map.members(shard as ShardId) {
                *load.entry(node.to_string()).or_default() += 1;
            }
        }
        for shard in 0..next.shards.len() {
            let mut owner = next.shards[shard].clone();
            let mut followers = std::mem::take(&mut next.followers[shard]);
            if !self.kept(&owner, now) {
                // Its node is gone: a follower that is up takes its place,
                // the one leading the group if it can.
                let leading = self
                    .view
                    .group_status(shard as ShardId)
                    .and_then(|s| self.view.node_of_member(s.leader));
                let pick = followers
                    .iter()
                    .position(|n| Some(n) == leading.as_ref() && self.up(n))
                    .or_else(|| followers.iter().position(|n| self.up(n)));
                if let Some(i) = pick {
                    owner = followers.remove(i);
                }
            }
            followers.retain(|n| *n != owner && self.kept(n, now));
            followers.dedup();
            while followers.len() + 1 < want {
                let pick = takers
                    .iter()
                    .filter(|n| **n != owner && !followers.contains(n))
                    .min_by_key(|n| (load.get(*n).copied().unwrap_or(0), (*n).clone()));
                let Some(node) = pick.cloned() else { break };
                *load.entry(node.clone()).or_default() += 1;
                followers.push(node);
            }
            while followers.len() + 1 > want {
                let i = followers
                    .iter()
                    .position(|n| !self.up(n))
                    .unwrap_or(followers.len() - 1);
                followers.remove(i);
            }
            next.shards[shard] = owner;
            next.followers[shard] = followers;
        }
        if next.followers.iter().all(Vec::is_empty) {
            next.followers.clear();
        }
        next
    }

    /// Writes the planned map, when it differs, on the node leading shard 0.
    async fn plan(&self) -> FsResult<()> {
        if !self.view.group_status(0).is_some_and(|s| s.serving) {
            return Ok(());
        }
        let map = self.view.map();
        let next = self.planned(&map);
        if next.shards == map.shards && next.followers == map.followers {
            return Ok(());
        }
        let mut next = next;
        next.version = map.version + 1;
        let stored = self.namespace.set_map(map.version, next.clone()).await?;
        if stored != next {
            return Err(FsError::Busy(format!(
                "the cluster map changed meanwhile (now version {})",
                stored.version
            )));
        }
        tracing::info!(version = next.version, "cluster map: shard members placed");
        self.view.adopt_map(&stored);
        announce(&self.membership);
        Ok(())
    }

    /// One round over the groups this node leads.
    async fn keep(&self) {
        let map = self.view.map();
        let leading: std::collections::HashSet<ShardId> = (0..map.shards.len() as ShardId)
            .filter(|s| {
                self.view
                    .group_status(*s)
                    .is_some_and(|st| st.leader == member_id(&self.view.node_id))
            })
            .collect();
        self.handovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keep_only(&leading);
        for shard in 0..map.shards.len() as ShardId {
            // The leader keeps the group, named in the map or not (a
            // leader the map dropped hands over first).
            let Some(status) = self.view.group_status(shard).filter(|s| s.serving) else {
                continue;
            };
            if !map.replicated(shard) && status.voters.len() + status.learners.len() <= 1 {
                continue;
            }
            if let Err(e) = self.keep_group(shard, &map, &status).await {
                tracing::debug!(shard, error = %e, "shard group not changed this round");
            }
        }
    }

    fn invite(&self, shard: ShardId, node: &str) {
        let leader = member_id(&self.view.node_id);
        match self.view.gateway(node) {
            Ok(gateway) => {
                let _ = gateway.cast(PeerMsg::JoinGroup { shard, leader });
            }
            Err(e) => tracing::debug!(shard, node, error = %e, "cannot ask a node to join"),
        }
    }

    async fn keep_group(&self, shard: ShardId, map: &ClusterMap, st: &GroupStatus) -> FsResult<()> {
        let me = member_id(&self.view.node_id);
        let wanted: Vec<(String, u64)> = map
            .members(shard)
            .into_iter()
            .map(|n| (n.to_string(), member_id(n)))
            .collect();
        let is_wanted = |id: u64| wanted.iter().any(|(_, w)| *w == id);
        let in_group = |id: u64| st.voters.contains(&id) || st.learners.contains(&id);
        let matched = |id: u64| {
            st.progress
                .iter()
                .find(|(p, _)| *p == id)
                .map_or(0, |(_, m)| *m)
        };
        // Caught up: it has taken a snapshot or entries from this leader,
        // and is close to its commit index.
        let caught_up =
            |id: u64| id == me || (matched(id) > 0 && matched(id) + CAUGHT_UP >= st.commit);
        // A joint configuration its leader did not leave (it lost the lead
        // before) is left first: no other change is taken meanwhile.
        if st.joint {
            return self.change_all(shard, &[]).await;
        }
        // Learners that have nothing yet may have missed (or forgotten,
        // restarting) the request to join.
        for &l in st.learners.iter().filter(|l| matched(**l) == 0) {
            if let Some(node) = self.view.node_of_member(l) {
                self.invite(shard, &node);
            }
        }
        // Every member the map wants comes in as a learner first ...
        if let Some((node, id)) = wanted.iter().find(|(n, id)| !in_group(*id) && self.up(n)) {
            self.invite(shard, node);
            return self.change(shard, MemberChange::AddLearner(*id)).await;
        }
        // ... and the learners vote once all of them (those up) have caught
        // up, promoted together (joint consensus): one at a time, a group
        // growing from one voter to three would pass through two, where
        // losing either stops it.
        let pending: Vec<u64> = st
            .learners
            .iter()
            .copied()
            .filter(|l| is_wanted(*l) && self.view.node_of_member(*l).is_some_and(|n| self.up(&n)))
            .collect();
        if !pending.is_empty() && pending.iter().all(|l| caught_up(*l)) {
            let changes: Vec<MemberChange> =
                pending.into_iter().map(MemberChange::AddVoter).collect();
            return self.change_all(shard, &changes).await;
        }
        let extra = st
            .voters
            .iter()
            .chain(&st.learners)
            .copied()
            .find(|id| !is_wanted(*id));
        if let Some(id) = extra {
            if id != me {
                return self.change(shard, MemberChange::Remove(id)).await;
            }
            // This node is to go: a caught-up voter the map wants leads
            // first, and removes it.
            if let Some(&to) = st
                .voters
                .iter()
                .find(|v| **v != me && is_wanted(**v) && caught_up(**v))
            {
                return self.transfer(shard, to).await;
            }
        }
        // The map's owner of the shard is its preferred leader: leadership
        // returns to it once it is back, answering and caught up (a leader
        // elected because the owner died has heard nothing from it).
        if let Some(owner) = map.owner(shard).filter(|o| self.up(o)) {
            let id = member_id(owner);
            let answering = st.active.contains(&id);
            // Fully caught up: raft-rs then hands over at once; any entry
            // the target lacks is sent first while the leader takes no
            // change.
            let level = matched(id) > 0 && matched(id) >= st.commit;
            if id != me && is_wanted(me) && st.voters.contains(&id) && answering && level {
                tracing::info!(
                    shard,
                    node = owner,
                    "handing leadership to the shard's owner"
                );
                return self.transfer(shard, id).await;
            }
        }
        Ok(())
    }

    async fn change(&self, shard: ShardId, change: MemberChange) -> FsResult<()> {
        self.change_all(shard, &[change]).await
    }

    /// Makes `changes` at once (several: through joint consensus, which
    /// Raft leaves by itself; none: leaves a joint configuration).
    async fn change_all(&self, shard: ShardId, changes: &[MemberChange]) -> FsResult<()> {
        let (done, rx) = answer();
        self.writer(shard)?.change_members(changes, done);
        let r = wait(rx).await;
        match &r {
            Ok(()) => tracing::info!(shard, ?changes, "shard group changed"),
            Err(e) => tracing::debug!(shard, ?changes, error = %e, "shard group change not made"),
        }
        r
    }

    async fn transfer(&self, shard: ShardId, to: u64) -> FsResult<()> {
        let may = self
            .handovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_start(shard, std::time::Instant::now());
        if !may {
            return Ok(());
        }
        let (done, rx) = answer();
        self.writer(shard)?.transfer_leader(to, done);
        wait(rx).await
    }

    fn writer(&self, shard: ShardId) -> FsResult<&curvine_actors::writer::Writer> {
        self.raft
            .writer(shard)
            .ok_or_else(|| FsError::InvalidArgument(format!("shard {shard} does not exist")))
    }
}

/// A writer's callback and where its answer arrives.
fn answer() -> (
    curvine_actors::replica::Done,
    tokio::sync::oneshot::Receiver<FsResult<()>>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    (
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        rx,
    )
}

/// A writer's answer, or `TimedOut` after 10 s.
async fn wait(rx: tokio::sync::oneshot::Receiver<FsResult<()>>) -> FsResult<()> {
    match tokio::time::timeout(Duration::from_secs(10), rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(FsError::Unavailable("the shard's writer stopped".into())),
        Err(_) => Err(FsError::TimedOut(
            "a shard group change took more than 10s".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_that_did_not_take_waits_longer_each_time() {
        let mut h = HandOvers::default();
        let t0 = std::time::Instant::now();
        assert!(h.try_start(3, t0));
        // Asked again at every round of the keeper: refused until the wait.
        for round in 1..10 {
            assert!(!h.try_start(3, t0 + PERIOD * round));
        }
        assert!(h.try_start(3, t0 + HANDOVER_BACKOFF));
        assert!(!h.try_start(3, t0 + HANDOVER_BACKOFF * 2));
        assert!(h.try_start(3, t0 + HANDOVER_BACKOFF * 3));
        // Other shards are not held back.
        assert!(h.try_start(4, t0 + HANDOVER_BACKOFF));
        // The wait is bounded ...
        let mut at = t0 + HANDOVER_BACKOFF * 3;
        for _ in 0..20 {
            at += HANDOVER_MAX_BACKOFF;
            assert!(h.try_start(3, at));
        }
        // ... and forgotten once this node no longer leads the shard.
        h.keep_only(&[4].into_iter().collect());
        assert!(h.try_start(3, at));
    }
}

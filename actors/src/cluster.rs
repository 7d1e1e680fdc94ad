//! What this node knows of the cluster: its members and their states, and
//! the cluster map. Shared by the namespace router, the client service and
//! the membership actor that keeps it current.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use ractor::ActorRef;

use curvine_messages::cluster::{
    gateway_group, ClusterMap, Heartbeat, MemberInfo, MemberState, MemberView, PeerMsg,
};
use curvine_messages::{now_ns, FsError, FsResult, ShardId};

use crate::host::{ShardDirectory, ShardRef};
use crate::replica::{member_id, GroupStatus, StatusBoard};
use crate::stats::Metrics;
use crate::trace::Tracer;

/// Where a shard's requests go.
pub enum Route {
    /// A shard actor of this node.
    Local(ShardRef),
    /// The gateway of the node serving the shard.
    Remote {
        node: String,
        gateway: ActorRef<PeerMsg>,
    },
}

/// What changed when a heartbeat arrived.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Heard {
    /// The node was unknown until now.
    pub new: bool,
    /// The node was down (or left) and is up again.
    pub back: bool,
    /// The heartbeat carried a newer map, now adopted.
    pub map_changed: bool,
}

pub struct ClusterView {
    pub node_id: String,
    pub cluster_id: String,
    pub shard_count: u32,
    local: ShardDirectory,
    map: RwLock<Arc<ClusterMap>>,
    members: RwLock<HashMap<String, MemberView>>,
    node_timeout: Duration,
    /// Bumped on every map or membership change, for waiters.
    changes: tokio::sync::watch::Sender<u64>,
    /// Who leads each replicated shard as other nodes said (term, node).
    leaders: RwLock<HashMap<ShardId, (u64, String)>>,
    /// The status of this node's Raft groups (one board per environment).
    boards: RwLock<Vec<StatusBoard>>,
    /// Where this node's actors record trace events.
    pub tracer: Tracer,
    /// The node's actor statistics and metrics.
    pub metrics: Metrics,
}

impl ClusterView {
    pub fn new(
        me: MemberInfo,
        cluster_id: String,
        local: ShardDirectory,
        map: ClusterMap,
        node_timeout: Duration,
        tracer: Tracer,
        metrics: Metrics,
    ) -> Arc<ClusterView> {
        let node_id = me.node_id.clone();
        let shard_count = local.shard_count();
        let now = now_ns();
        let mut members = HashMap::new();
        members.insert(
            node_id.clone(),
            MemberView {
                info: me,
                state: MemberState::Up,
                last_seen_ns: 0,
                since_ns: now,
            },
        );
        Arc::new(ClusterView {
            node_id,
            cluster_id,
            shard_count,
            local,
            map: RwLock::new(Arc::new(map)),
            members: RwLock::new(members),
            node_timeout,
            changes: tokio::sync::watch::channel(0).0,
            leaders: RwLock::new(HashMap::new()),
            boards: RwLock::new(Vec::new()),
            tracer,
            metrics,
        })
    }

    /// A single node serving every shard itself (tests, tools). Its node id
    /// is empty, which block checks read as "any node".
    pub fn standalone(local: ShardDirectory) -> Arc<ClusterView> {
        let me = MemberInfo::default();
        let map = ClusterMap::single("", local.shard_count());
        let tracer = Tracer::new("", 1_000, 0.0);
        Self::new(
            me,
            "local".into(),
            local,
            map,
            Duration::from_secs(3600),
            tracer,
            Metrics::new(),
        )
    }

    pub fn local(&self) -> &ShardDirectory {
        &self.local
    }

    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.read().clone()
    }

    /// Adopts `map` when it is newer than the cached one.
    pub fn adopt_map(&self, map: &ClusterMap) -> bool {
        if map.shards.len() != self.shard_count as usize {
            return false;
        }
        let mut current = self.map.write();
        if map.version <= current.version {
            return false;
        }
        *current = Arc::new(map.clone());
        drop(current);
        self.changes.send_modify(|v| *v += 1);
        true
    }

    /// Whether this node serves `shard` by the map it knows: it is the
    /// shard's node, or, for a replicated shard, one of its members (whose
    /// shard actor answers only while it leads).
    pub fn serves(&self, shard: ShardId) -> bool {
        let map = self.map.read();
        if map.replicated(shard) {
            map.holds(shard, &self.node_id)
        } else {
            map.owner(shard) == Some(self.node_id.as_str())
        }
    }

    /// Where the status of this node's groups is published (the writers'
    /// boards, given once they run).
    pub fn set_boards(&self, boards: Vec<StatusBoard>) {
        *self.boards.write() = boards;
    }

    /// The shards this node serves now: those the map gives it alone,
    /// and the replicated ones it leads. Each shard is served by one node,
    /// which runs its background work (sweeps, block replicas, reports).
    pub fn served_shards(&self) -> Vec<ShardId> {
        (0..self.map().shards.len() as ShardId)
            .filter(|&shard| self.serves_now(shard))
            .collect()
    }

    /// Whether this node serves `shard` now: the map gives it the shard
    /// alone, or the shard is replicated and this node leads its group.
    /// The one node doing a shard's background work (its sweeps, and for
    /// shard 0 the journal and load jobs) asks this.
    pub fn serves_now(&self, shard: ShardId) -> bool {
        let map = self.map();
        if map.replicated(shard) {
            self.group_status(shard).is_some_and(|s| s.serving)
        } else {
            map.owner(shard) == Some(self.node_id.as_str())
        }
    }

    /// This node's view of `shard`'s group, if it is a member.
    pub fn group_status(&self, shard: ShardId) -> Option<GroupStatus> {
        self.boards.read().iter().find_map(|b| {
            b.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&shard)
                .cloned()
        })
    }

    /// The replicated shards this node leads (and may serve), with the
    /// term: announced in heartbeats.
    pub fn leads(&self) -> Vec<(ShardId, u64)> {
        let mut out = Vec::new();
        for board in self.boards.read().iter() {
            let board = board.lock().unwrap_or_else(|p| p.into_inner());
            for (&shard, status) in board.iter() {
                if status.serving && status.voters.len() + status.learners.len() > 1 {
                    out.push((shard, status.term));
                }
            }
        }
        out
    }

    /// Notes that `node` leads `shard` in `term` (a later term wins).
    pub fn note_leader(&self, shard: ShardId, term: u64, node: &str) {
        let mut leaders = self.leaders.write();
        let newer = leaders.get(&shard).is_none_or(|(t, _)| *t <= term);
        if newer {
            leaders.insert(shard, (term, node.to_string()));
        }
    }

    /// The node whose member id in every group is `member`.
    pub fn node_of_member(&self, member: u64) -> Option<String> {
        if member == 0 {
            return None;
        }
        self.members
            .read()
            .keys()
            .find(|node| member_id(node) == member)
            .cloned()
    }

    /// The node leading replicated `shard`, as best this node knows: this
    /// node when it serves it, the leader its own member of the group
    /// follows, or the one other nodes announced (the later term).
    fn leader_of(&self, shard: ShardId) -> Option<String> {
        let local = self.group_status(shard);
        if let Some(status) = &local {
            if status.serving {
                return Some(self.node_id.clone());
            }
        }
        let announced = self.leaders.read().get(&shard).cloned();
        let followed = local
            .filter(|s| s.leader != 0)
            .and_then(|s| Some((s.term, self.node_of_member(s.leader)?)));
        match (followed, announced) {
            (Some((a, n)), Some((b, m))) => Some(if a >= b { n } else { m }),
            (Some((_, n)), None) | (None, Some((_, n))) => Some(n),
            (None, None) => None,
        }
    }

    /// Returns once `node` is no longer who this node believes leads
    /// replicated `shard` (a newer leader was announced or elected): a call
    /// waiting on a leader cut off by a partition stops waiting then,
    /// instead of at the node timeout.
    pub async fn wait_leader_moved(&self, shard: ShardId, node: &str) {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if self.leader_of(shard).is_some_and(|n| n != node) {
                return;
            }
        }
    }

    /// Where requests for replicated `shard` go: its leader, when it is a
    /// member that is up; `Unavailable` (retried) while none is known, as
    /// during an election.
    fn route_replicated(&self, shard: ShardId, map: &ClusterMap) -> FsResult<Route> {
        let leader = self
            .leader_of(shard)
            .filter(|n| map.holds(shard, n))
            .filter(|n| {
                *n == self.node_id
                    || self
                        .members
                        .read()
                        .get(n)
                        .is_some_and(|m| m.state == MemberState::Up)
            });
        let Some(node) = leader else {
            return Err(FsError::Unavailable(format!(
                "shard {shard} has no leader among its members {:?} yet",
                map.members(shard)
            )));
        };
        if node == self.node_id {
            return self.local.get(shard).map(Route::Local);
        }
        let gateway = self.gateway(&node)?;
        Ok(Route::Remote { node, gateway })
    }

    /// A receiver that wakes on every map or membership change.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub fn route(&self, shard: ShardId) -> FsResult<Route> {
        let owner = {
            let map = self.map.read();
            if map.replicated(shard) {
                let map = map.clone();
                return self.route_replicated(shard, &map);
            }
            match map.owner(shard) {
                Some(o) => o.to_string(),
                None => {
                    return Err(FsError::InvalidArgument(format!(
                        "shard {shard} does not exist"
                    )))
                }
            }
        };
        if owner == self.node_id {
            return self.local.get(shard).map(Route::Local);
        }
        let gateway = self.gateway(&owner).map_err(|e| match e {
            FsError::NodeDown(d) => FsError::NodeDown(format!("shard {shard} is served by {d}")),
            FsError::Unavailable(d) => {
                FsError::Unavailable(format!("shard {shard} is served by {d}"))
            }
            other => other,
        })?;
        Ok(Route::Remote {
            node: owner,
            gateway,
        })
    }

    /// The gateway of `node`: `NodeDown` when the node is down, `Unavailable`
    /// (retried) while this node is not connected to it yet.
    pub fn gateway(&self, node: &str) -> FsResult<ActorRef<PeerMsg>> {
        if let Some(m) = self.members.read().get(node) {
            if m.state != MemberState::Up {
                // Learned of (from the seeds or the data directory) but not
                // heard from yet: a node that has just started waits for
                // its first heartbeat before calling it down.
                let waited = now_ns() - m.since_ns;
                if m.state == MemberState::Down
                    && m.info.rpc_addr.is_empty()
                    && waited < self.node_timeout.as_nanos() as i64
                {
                    return Err(FsError::Unavailable(format!(
                        "node {node} ({}) not heard from yet",
                        m.info.cluster_addr
                    )));
                }
                return Err(FsError::NodeDown(describe(m)));
            }
        }
        match ractor::pg::get_members(&gateway_group(node))
            .into_iter()
            .next()
        {
            Some(cell) => Ok(cell.into()),
            None => Err(FsError::Unavailable(format!(
                "node {node} is not connected yet"
            ))),
        }
    }

    /// Returns once `node` is no longer up (never, while it stays up).
    pub async fn wait_down(&self, node: &str) -> FsError {
        let mut changes = self.subscribe();
        loop {
            if let Some(m) = self.member(node) {
                if m.state != MemberState::Up {
                    return FsError::NodeDown(describe(&m));
                }
            }
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// A member that is up, by id or unique id prefix.
    pub fn find_member(&self, node: &str) -> FsResult<MemberInfo> {
        let matches: Vec<_> = self
            .members()
            .into_iter()
            .filter(|m| m.info.node_id.starts_with(node))
            .collect();
        match matches.as_slice() {
            [one] if one.state == MemberState::Up => Ok(one.info.clone()),
            [one] => Err(FsError::NodeDown(describe(one))),
            [] => Err(FsError::InvalidArgument(format!(
                "no node {node:?} in the cluster (see `curvine-cli report`)"
            ))),
            _ => Err(FsError::InvalidArgument(format!(
                "{node:?} names more than one node; give more of the id"
            ))),
        }
    }

    pub fn members(&self) -> Vec<MemberView> {
        let mut all: Vec<MemberView> = self.members.read().values().cloned().collect();
        all.sort_by(|a, b| a.info.node_id.cmp(&b.info.node_id));
        all
    }

    pub fn member(&self, node: &str) -> Option<MemberView> {
        self.members.read().get(node).cloned()
    }

    /// Members that are up, this node included.
    pub fn live(&self) -> Vec<MemberInfo> {
        self.members()
            .into_iter()
            .filter(|m| m.state == MemberState::Up)
            .map(|m| m.info)
            .collect()
    }

    /// Updates this node's own entry (its tiers change as blocks come and go).
    pub fn update_me(&self, f: impl FnOnce(&mut MemberInfo)) {
        if let Some(m) = self.members.write().get_mut(&self.node_id) {
            f(&mut m.info);
        }
    }

    pub fn me(&self) -> MemberInfo {
        self.members
            .read()
            .get(&self.node_id)
            .map(|m| m.info.clone())
            .unwrap_or_default()
    }

    /// Records a heartbeat from another node of this cluster.
    pub fn heard(&self, hb: &Heartbeat, now: i64) -> Heard {
        let mut out = Heard::default();
        {
            let mut members = self.members.write();
            let state = if hb.leaving {
                MemberState::Left
            } else {
                MemberState::Up
            };
            match members.get_mut(&hb.member.node_id) {
                Some(m) => {
                    if m.state != state {
                        out.back = state == MemberState::Up;
                        m.state = state;
                        m.since_ns = now;
                    }
                    m.info = hb.member.clone();
                    m.last_seen_ns = now;
                }
                None => {
                    out.new = true;
                    members.insert(
                        hb.member.node_id.clone(),
                        MemberView {
                            info: hb.member.clone(),
                            state,
                            last_seen_ns: now,
                            since_ns: now,
                        },
                    );
                }
            }
        }
        out.map_changed = self.adopt_map(&hb.map);
        for &(shard, term) in &hb.leads {
            self.note_leader(shard, term, &hb.member.node_id);
        }
        if out.new || out.back {
            self.changes.send_modify(|v| *v += 1);
        }
        out
    }

    /// Learns of a node from the data directory or another node's list,
    /// before hearing from it. It counts as down until it speaks.
    pub fn know(&self, node_id: &str, cluster_addr: &str, now: i64) -> bool {
        if node_id == self.node_id {
            return false;
        }
        let mut members = self.members.write();
        if members.contains_key(node_id) {
            return false;
        }
        members.insert(
            node_id.to_string(),
            MemberView {
                info: MemberInfo {
                    node_id: node_id.to_string(),
                    cluster_addr: cluster_addr.to_string(),
                    ..Default::default()
                },
                state: MemberState::Down,
                last_seen_ns: now,
                since_ns: now,
            },
        );
        true
    }

    /// Marks up members silent for longer than the node timeout as down;
    /// returns them.
    pub fn expire(&self, now: i64) -> Vec<String> {
        let timeout = self.node_timeout.as_nanos() as i64;
        let mut down = Vec::new();
        {
            let mut members = self.members.write();
            for m in members.values_mut() {
                if m.info.node_id != self.node_id
                    && m.state == MemberState::Up
                    && now - m.last_seen_ns > timeout
                {
                    m.state = MemberState::Down;
                    m.since_ns = now;
                    down.push(m.info.node_id.clone());
                }
            }
        }
        if !down.is_empty() {
            self.changes.send_modify(|v| *v += 1);
        }
        down
    }

    /// Forgets a node that left the cluster.
    pub fn forget(&self, node: &str) {
        if node != self.node_id {
            self.members.write().remove(node);
            self.changes.send_modify(|v| *v += 1);
        }
    }
}

/// The gateway of `node` as this process sees it (its own, or a proxy of
/// another node's), whatever state the node is in.
pub fn gateway_of(node: &str) -> Option<ActorRef<PeerMsg>> {
    ractor::pg::get_members(&gateway_group(node))
        .into_iter()
        .next()
        .map(ActorRef::from)
}

/// "node X (addr), down for 12s", for errors.
pub fn describe(m: &MemberView) -> String {
    let for_s = (now_ns() - m.since_ns).max(0) / 1_000_000_000;
    let addr = if m.info.rpc_addr.is_empty() {
        m.info.cluster_addr.clone()
    } else {
        m.info.rpc_addr.clone()
    };
    format!("node {} ({addr}), {} for {for_s}s", m.info.node_id, m.state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(node: &str, map: ClusterMap) -> Heartbeat {
        Heartbeat {
            cluster_id: "c".into(),
            shard_count: 2,
            member: MemberInfo {
                node_id: node.into(),
                ..Default::default()
            },
            map,
            known: vec![],
            leaving: false,
            mounts_version: 0,
            leads: vec![],
        }
    }

    #[tokio::test]
    async fn members_go_down_after_the_timeout_and_come_back() {
        let me = MemberInfo {
            node_id: "a".into(),
            ..Default::default()
        };
        let view = ClusterView::new(
            me,
            "c".into(),
            ShardDirectory::new(2),
            ClusterMap::single("a", 2),
            Duration::from_secs(5),
            Tracer::new("a", 1_000, 0.0),
            Metrics::new(),
        );
        let t0 = 1_000_000_000_000;
        let h = view.heard(&hb("b", ClusterMap::single("a", 2)), t0);
        assert!(h.new && !h.map_changed);
        assert!(view.expire(t0 + 4_000_000_000).is_empty());
        assert_eq!(view.expire(t0 + 6_000_000_000), vec!["b".to_string()]);
        assert!(matches!(view.gateway("b"), Err(FsError::NodeDown(_))));
        let newer = ClusterMap::single("a", 2).with_owner(1, "b");
        let h = view.heard(&hb("b", newer), t0 + 7_000_000_000);
        assert!(h.back && h.map_changed);
        assert!(!view.serves(1) && view.serves(0));
        // Not connected through ractor_cluster: retried, not down.
        assert!(matches!(view.gateway("b"), Err(FsError::Unavailable(_))));
        // An older or foreign-sized map is ignored.
        assert!(!view.adopt_map(&ClusterMap::single("b", 2)));
        assert!(!view.adopt_map(&ClusterMap {
            version: 99,
            shards: vec!["b".into()],
            followers: vec![],
        }));
    }
}

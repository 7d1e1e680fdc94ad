//! Cluster administration run by the node a request reaches: moving shards,
//! rebalancing and decommissioning.
//!
//! A shard move: freeze the shard on its node (later requests get
//! `Unavailable` and retry; those accepted before are committed), copy its
//! records to the new node in chunks, switch the cluster map (a
//! compare-and-set on shard 0, so concurrent changes cannot both win), then
//! drop the old copy. Until the switch nothing has changed for anyone; a
//! failure before it unfreezes the shard where it was. The map of shard 0
//! travels with shard 0: moving it writes the new map into the new copy.
//!
//! A replicated shard (one with followers in the map) is never frozen:
//! moving, rebalancing and decommissioning write the members wanted into
//! the map, the shard keepers change the groups through Raft (a learner
//! takes a snapshot, catches up, votes; the member replaced is removed;
//! leadership goes to the owner), and the command waits until each group
//! has the members the map names.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;

use curvine_actors::cluster::ClusterView;
use curvine_actors::membership::{announce, MembershipMsg};
use curvine_actors::namespace::Namespace;
use curvine_actors::supervisor::Slot;
use curvine_messages::cluster::{ClusterMap, MemberInfo, PeerMsg};
use curvine_messages::rpc::{DecommissionReport, ShardMove};
use curvine_messages::shard::ShardMsg;
use curvine_messages::wal::member_id;
use curvine_messages::{FsError, FsResult, ShardId};

use super::replicas::Replicas;

/// Records copied per import step.
const EXPORT_CHUNK: u32 = 1 << 20;

/// How long a change of a replicated shard's members may take (a snapshot
/// to send, a learner to catch up, leadership to hand over).
const CONVERGE_WITHIN: Duration = Duration::from_secs(120);

pub struct Admin {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
    replicas: Arc<Replicas>,
    membership: Slot<MembershipMsg>,
    /// This node's data directory (where leaving is recorded).
    data_dir: PathBuf,
    /// Shard moves driven by this node run one at a time.
    moves: tokio::sync::Mutex<()>,
    /// `meta.replicas`: above 1, shards change members instead of moving.
    meta_replicas: u32,
}

impl Admin {
    pub fn new(
        namespace: Arc<Namespace>,
        view: Arc<ClusterView>,
        replicas: Arc<Replicas>,
        membership: Slot<MembershipMsg>,
        data_dir: PathBuf,
        meta_replicas: u32,
    ) -> Admin {
        Admin {
            namespace,
            view,
            replicas,
            membership,
            data_dir,
            moves: tokio::sync::Mutex::new(()),
            meta_replicas,
        }
    }

    /// With `meta.replicas` above 1 and several nodes, waits until the
    /// planner gave every shard its members (a cluster just formed, or a
    /// node just joined); the map then. `None`: shards have one member.
    async fn placed(&self) -> FsResult<Option<Arc<ClusterMap>>> {
        let deadline = tokio::time::Instant::now() + CONVERGE_WITHIN;
        let mut rx = self.view.subscribe();
        loop {
            let nodes = self.view.live().iter().filter(|m| !m.draining).count();
            let want = (self.meta_replicas as usize).min(nodes);
            let map = self.view.map();
            if want <= 1 && map.followers.is_empty() {
                return Ok(None);
            }
            let short = (0..map.shards.len() as ShardId).find(|s| map.members(*s).len() < want);
            match short {
                None => return Ok(Some(map)),
                Some(shard) if tokio::time::Instant::now() > deadline => {
                    return Err(FsError::TimedOut(format!(
                        "shard {shard} has {} of its {want} members after {}s",
                        map.members(shard).len(),
                        CONVERGE_WITHIN.as_secs()
                    )))
                }
                Some(_) => {
                    let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
                }
            }
        }
    }

    /// Moves `shard` to node `to`.
    pub async fn move_shard(&self, shard: ShardId, to: &str) -> FsResult<ShardMove> {
        let _one_at_a_time = self.moves.lock().await;
        if shard as u32 >= self.view.shard_count {
            return Err(FsError::InvalidArgument(format!(
                "shard {shard} does not exist (the cluster has {} shards)",
                self.view.shard_count
            )));
        }
        let target = self.view.find_member(to)?;
        if target.draining {
            return Err(FsError::InvalidArgument(format!(
                "node {} is being decommissioned and takes no shards",
                target.node_id
            )));
        }
        let to = target.node_id;
        let map = self.placed().await?.unwrap_or_else(|| self.view.map());
        let from = map.owner(shard).unwrap_or_default().to_string();
        if from == to {
            return Ok(ShardMove { shard, from, to });
        }
        if map.replicated(shard) {
            // The owner's place goes to `to` (a follower there swaps with
            // it); the group follows: learner, snapshot, voter, the old
            // member removed, leadership handed over. No freeze.
            let next = map.with_member_moved(shard, &from, &to);
            tracing::info!(shard, %from, %to, "moving a replicated shard's leader place");
            self.write_map(&map, next).await?;
            self.converged(&[shard]).await?;
            return Ok(ShardMove { shard, from, to });
        }
        self.view.find_member(&from)?;
        let ns = &self.namespace;
        tracing::info!(shard, %from, %to, "moving shard");
        ns.call_at(&from, shard, |reply| ShardMsg::Freeze { reply })
            .await?;
        match self.copy_and_switch(shard, &from, &to, &map).await {
            Ok(next) => {
                self.view.adopt_map(&next);
                announce(&self.membership);
                // The old copy stays frozen; it is only dropped.
                if let Err(e) = ns
                    .call_at(&from, shard, |reply| ShardMsg::DropAll { reply })
                    .await
                {
                    tracing::warn!(shard, node = %from, error = %e, "cannot drop the old copy of a moved shard; it is unused");
                }
                tracing::info!(shard, %from, %to, version = next.version, "shard moved");
                Ok(ShardMove { shard, from, to })
            }
            Err(e) => {
                tracing::warn!(shard, %from, %to, error = %e, "shard move failed; the shard stays where it was");
                let _ = ns
                    .call_at(&to, shard, |reply| ShardMsg::DropAll { reply })
                    .await;
                if let Err(u) = ns
                    .call_at(&from, shard, |reply| ShardMsg::Unfreeze { reply })
                    .await
                {
                    tracing::error!(shard, node = %from, error = %u, "cannot unfreeze a shard after a failed move; restart that node");
                }
                Err(e)
            }
        }
    }

    async fn copy_and_switch(
        &self,
        shard: ShardId,
        from: &str,
        to: &str,
        map: &ClusterMap,
    ) -> FsResult<ClusterMap> {
        let ns = &self.namespace;
        ns.call_at(to, shard, |reply| ShardMsg::DropAll { reply })
            .await?;
        let mut cursor = None;
        let mut records = 0usize;
        loop {
            let at = cursor.clone();
            let chunk = ns
                .call_at(from, shard, move |reply| ShardMsg::Export {
                    from: at.clone(),
                    max_bytes: EXPORT_CHUNK,
                    reply,
                })
                .await?;
            records += chunk.records.len();
            if !chunk.records.is_empty() {
                let part = chunk.records;
                ns.call_at(to, shard, move |reply| ShardMsg::Import {
                    records: part.clone(),
                    reply,
                })
                .await?;
            }
            match chunk.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        tracing::debug!(shard, records, "shard copied");
        ns.call_at(to, shard, |reply| ShardMsg::Unfreeze { reply })
            .await?;
        let next = map.with_owner(shard, to);
        let expect = map.version;
        let want = next.clone();
        let stored = if shard == 0 {
            ns.call_at(to, 0, move |reply| ShardMsg::SetMap {
                expect,
                map: want.clone(),
                reply,
            })
            .await?
        } else {
            ns.set_map(expect, want).await?
        };
        if stored != next {
            return Err(FsError::Busy(format!(
                "the cluster map changed during the move (now version {}); try again",
                stored.version
            )));
        }
        Ok(stored)
    }

    /// Writes `next` over `map` (a compare-and-set on shard 0) and tells
    /// the cluster.
    async fn write_map(&self, map: &ClusterMap, next: ClusterMap) -> FsResult<ClusterMap> {
        let stored = self.namespace.set_map(map.version, next.clone()).await?;
        if stored.shards != next.shards || stored.followers != next.followers {
            return Err(FsError::Busy(format!(
                "the cluster map changed meanwhile (now version {}); try again",
                stored.version
            )));
        }
        self.view.adopt_map(&stored);
        announce(&self.membership);
        Ok(stored)
    }

    /// Waits until each of `shards` has the group the map names: those
    /// members as voters, no learner, led by its owner.
    async fn converged(&self, shards: &[ShardId]) -> FsResult<()> {
        let deadline = tokio::time::Instant::now() + CONVERGE_WITHIN;
        for &shard in shards {
            let mut last = String::from("no answer from its leader");
            loop {
                let map = self.view.map();
                let mut want: Vec<u64> = map.members(shard).into_iter().map(member_id).collect();
                want.sort_unstable();
                let owner = map.owner(shard).map(member_id);
                let stats = self.namespace.stats_of(shard).await;
                match stats.map(|s| s.group) {
                    Ok(Some(mut g)) => {
                        g.voters.sort_unstable();
                        if g.voters == want && g.learners.is_empty() && Some(g.leader) == owner {
                            break;
                        }
                        last = format!(
                            "voters {:?}, learners {:?}, leader {} (the map wants voters {want:?} led by {owner:?})",
                            g.voters, g.learners, g.leader
                        );
                    }
                    Ok(None) => {}
                    Err(e) => last = e.to_string(),
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(FsError::TimedOut(format!(
                        "shard {shard} did not reach the members the cluster map names within {}s: {last}",
                        CONVERGE_WITHIN.as_secs()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// Moves shards so every live node serves an even share (of copies and
    /// of leaders, for replicated shards).
    pub async fn rebalance(&self) -> FsResult<Vec<ShardMove>> {
        let nodes: Vec<String> = self
            .view
            .live()
            .into_iter()
            .filter(|m| !m.draining)
            .map(|m| m.node_id)
            .collect();
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(map) = self.placed().await? {
            let _one_at_a_time = self.moves.lock().await;
            let (next, moves) = map.balanced(&nodes);
            if moves.is_empty() {
                return Ok(Vec::new());
            }
            self.write_map(&map, next).await?;
            let mut shards: Vec<ShardId> = moves.iter().map(|m| m.0).collect();
            shards.sort_unstable();
            shards.dedup();
            self.converged(&shards).await?;
            return Ok(moves
                .into_iter()
                .map(|(shard, from, to)| ShardMove { shard, from, to })
                .collect());
        }
        let mut moves = Vec::new();
        loop {
            let map = self.view.map();
            let mut load: HashMap<&str, Vec<ShardId>> =
                nodes.iter().map(|n| (n.as_str(), Vec::new())).collect();
            for (shard, owner) in map.shards.iter().enumerate() {
                if let Some(list) = load.get_mut(owner.as_str()) {
                    list.push(shard as ShardId);
                }
            }
            let movable: usize = load.values().map(Vec::len).sum();
            let high = movable.div_ceil(nodes.len());
            let low = movable / nodes.len();
            let most = load
                .iter()
                .max_by_key(|(n, l)| (l.len(), std::cmp::Reverse(*n)))
                .map(|(_, l)| l.clone())
                .unwrap_or_default();
            let (idlest, fewest) = load
                .iter()
                .min_by_key(|(n, l)| (l.len(), *n))
                .map(|(n, l)| (n.to_string(), l.len()))
                .unwrap_or_default();
            if most.len() <= high && fewest >= low || most.len() <= fewest + 1 {
                break;
            }
            // Shard 0 holds the map; leave it where it is while others can go.
            let shard = most
                .iter()
                .rev()
                .copied()
                .find(|s| *s != 0)
                .unwrap_or(most[0]);
            moves.push(self.move_shard(shard, &idlest).await?);
        }
        Ok(moves)
    }

    /// Empties node `node` (shards, then blocks) and lets it leave.
    pub async fn decommission(&self, node: &str) -> FsResult<DecommissionReport> {
        let leaving = self.view.find_member(node)?;
        let node = leaving.node_id.clone();
        let others: Vec<MemberInfo> = self
            .view
            .live()
            .into_iter()
            .filter(|m| m.node_id != node && !m.draining)
            .collect();
        if others.is_empty() {
            return Err(FsError::InvalidArgument(format!(
                "node {node} is the only node that can serve the cluster"
            )));
        }
        self.drain(&node, true, false).await?;
        let mut report = DecommissionReport::default();
        if self.placed().await?.is_some() {
            report.shards = self.empty_replicated(&node).await?;
        }
        for shard in self.view.map().shards_of(&node) {
            let map = self.view.map();
            let target = others
                .iter()
                .min_by_key(|m| map.shards_of(&m.node_id).len())
                .map(|m| m.node_id.clone())
                .unwrap_or_default();
            report.shards.push(self.move_shard(shard, &target).await?);
        }
        let (moved, failed) = self.replicas.move_blocks_off(&node).await?;
        report.blocks_moved = moved;
        report.blocks_failed = failed;
        if failed == 0 {
            self.drain(&node, true, true).await?;
        }
        Ok(report)
    }

    /// Waits while the cluster map gives a draining node's places to
    /// others (the shard keeper's planner does, on the node leading shard
    /// 0) and the groups follow; the moves made.
    async fn empty_replicated(&self, node: &str) -> FsResult<Vec<ShardMove>> {
        let before = self.view.map();
        let held: Vec<ShardId> = (0..before.shards.len() as ShardId)
            .filter(|s| before.holds(*s, node))
            .collect();
        let deadline = tokio::time::Instant::now() + CONVERGE_WITHIN;
        let mut rx = self.view.subscribe();
        while self.view.map().places(node) > 0 {
            if tokio::time::Instant::now() > deadline {
                return Err(FsError::TimedOut(format!(
                    "node {node} still holds {} shard copies after {}s: is meta.replicas set and another node up?",
                    self.view.map().places(node),
                    CONVERGE_WITHIN.as_secs()
                )));
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
        }
        self.converged(&held).await?;
        let after = self.view.map();
        Ok(held
            .into_iter()
            .map(|shard| {
                let to = after
                    .members(shard)
                    .into_iter()
                    .find(|n| !before.holds(shard, n))
                    .or(after.owner(shard))
                    .unwrap_or_default()
                    .to_string();
                ShardMove {
                    shard,
                    from: node.to_string(),
                    to,
                }
            })
            .collect())
    }

    async fn drain(&self, node: &str, draining: bool, leave: bool) -> FsResult<()> {
        if node == self.view.node_id {
            leave_or_drain(
                &self.view,
                &self.data_dir,
                &self.membership,
                draining,
                leave,
            )?;
            announce(&self.membership);
            return Ok(());
        }
        let gw = self.view.gateway(node)?;
        match gw
            .call(
                |reply| PeerMsg::Drain {
                    draining,
                    leave,
                    reply,
                },
                Some(Duration::from_secs(10)),
            )
            .await
        {
            Ok(CallResult::Success(r)) => r,
            _ => Err(FsError::Unavailable(format!("node {node} did not answer"))),
        }
    }
}

/// Marks this node draining, or gone for good: then it announces that it
/// left and records it in its data directory, so it does not start again.
pub fn leave_or_drain(
    view: &ClusterView,
    data_dir: &std::path::Path,
    membership: &Slot<MembershipMsg>,
    draining: bool,
    leave: bool,
) -> FsResult<()> {
    view.update_me(|me| me.draining = draining || leave);
    if leave {
        crate::identity::mark_left(data_dir, &view.cluster_id).map_err(|e| {
            FsError::Io(format!(
                "cannot record the decommission in {}: {e}",
                data_dir.display()
            ))
        })?;
        if let Some(m) = membership.current() {
            let _ = m.cast(MembershipMsg::Leave);
        }
        tracing::warn!("this node was decommissioned and has left the cluster; it can be stopped");
    } else if draining {
        tracing::info!("this node is draining: it takes no new shards or blocks");
    }
    Ok(())
}

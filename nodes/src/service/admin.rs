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
use curvine_messages::{FsError, FsResult, ShardId};

use super::replicas::Replicas;

/// Records copied per import step.
const EXPORT_CHUNK: u32 = 1 << 20;

pub struct Admin {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
    replicas: Arc<Replicas>,
    membership: Slot<MembershipMsg>,
    /// This node's data directory (where leaving is recorded).
    data_dir: PathBuf,
    /// Shard moves driven by this node run one at a time.
    moves: tokio::sync::Mutex<()>,
}

impl Admin {
    pub fn new(
        namespace: Arc<Namespace>,
        view: Arc<ClusterView>,
        replicas: Arc<Replicas>,
        membership: Slot<MembershipMsg>,
        data_dir: PathBuf,
    ) -> Admin {
        Admin {
            namespace,
            view,
            replicas,
            membership,
            data_dir,
            moves: tokio::sync::Mutex::new(()),
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
        if self.view.map().replicated(shard) {
            return Err(FsError::InvalidArgument(format!(
                "shard {shard} is replicated (meta.replicas > 1): its members follow the cluster map, \
                 and moving a replicated shard by hand is not supported yet"
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
        let map = self.view.map();
        let from = map.owner(shard).unwrap_or_default().to_string();
        if from == to {
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

    /// Moves shards so every live node serves an even share.
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

//! Cluster administration run by the node a request reaches: moving shards,
//! rebalancing, decommissioning, and block replicas (placement of copies,
//! re-replication, copying a block from another node).
//!
//! A shard move: freeze the shard on its node (later requests get
//! `Unavailable` and retry; those accepted before are committed), copy its
//! records to the new node in chunks, switch the cluster map (a
//! compare-and-set on shard 0, so concurrent changes cannot both win), then
//! drop the old copy. Until the switch nothing has changed for anyone; a
//! failure before it unfreezes the shard where it was. The map of shard 0
//! travels with shard 0: moving it writes the new map into the new copy.

use std::collections::HashMap;
use std::time::Duration;

use ractor::rpc::CallResult;

use curvine_messages::block::{Access, BlockInfo, BlockMsg};
use curvine_messages::cluster::{ClusterMap, MemberInfo, MemberState, PeerMsg, PullBlock};
use curvine_messages::rpc::{DecommissionReport, ShardMove};
use curvine_messages::shard::ShardMsg;
use curvine_messages::{FsError, FsResult, Ino, ShardId};

use crate::service::Service;

/// Records copied per import step.
const EXPORT_CHUNK: u32 = 1 << 20;

impl Service {
    /// A member by id (or unique id prefix).
    pub(crate) fn find_member(&self, node: &str) -> FsResult<MemberInfo> {
        let matches: Vec<_> = self
            .view
            .members()
            .into_iter()
            .filter(|m| m.info.node_id.starts_with(node))
            .collect();
        match matches.as_slice() {
            [one] if one.state == MemberState::Up => Ok(one.info.clone()),
            [one] => Err(FsError::NodeDown(curvine_actors::cluster::describe(one))),
            [] => Err(FsError::InvalidArgument(format!(
                "no node {node:?} in the cluster (see `curvine-cli report`)"
            ))),
            _ => Err(FsError::InvalidArgument(format!(
                "{node:?} names more than one node; give more of the id"
            ))),
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
        let target = self.find_member(to)?;
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
        self.find_member(&from)?;
        let ns = &self.namespace;
        tracing::info!(shard, %from, %to, "moving shard");
        ns.call_at(&from, shard, |reply| ShardMsg::Freeze { reply })
            .await?;
        match self.copy_and_switch(shard, &from, &to, &map).await {
            Ok(next) => {
                self.view.adopt_map(&next);
                self.announce();
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
        let leaving = self.find_member(node)?;
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
        let (moved, failed) = self.move_blocks_off(&node).await?;
        report.blocks_moved = moved;
        report.blocks_failed = failed;
        if failed == 0 {
            self.drain(&node, true, true).await?;
        }
        Ok(report)
    }

    async fn drain(&self, node: &str, draining: bool, leave: bool) -> FsResult<()> {
        if node == self.view.node_id {
            crate::gateway::leave_or_drain(
                &self.view,
                std::path::Path::new(&self.info.data_dir),
                &self.membership,
                draining,
                leave,
            )?;
            self.announce();
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

    /// Every committed block of every shard, page by page.
    async fn for_each_block(&self, shards: &[ShardId], mut f: impl AsyncBlockFn) -> FsResult<()> {
        for &shard in shards {
            let mut after = None;
            loop {
                let page = self.namespace.scan_blocks(shard, after, 1024).await?;
                let Some(last) = page.last() else { break };
                after = Some((last.0, last.2.index));
                let n = page.len();
                for (ino, replicas, info) in page {
                    f.call(self, ino, replicas, info).await;
                }
                if n < 1024 {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Copies every block that has a replica on `node` to another node and
    /// drops `node` from its list. Returns (moved, failed).
    async fn move_blocks_off(&self, node: &str) -> FsResult<(u64, u64)> {
        let shards: Vec<ShardId> = (0..self.view.shard_count as ShardId).collect();
        let mut mover = Replace {
            node: node.to_string(),
            moved: 0,
            failed: 0,
            remove: Vec::new(),
        };
        self.for_each_block(&shards, &mut mover).await?;
        if !mover.remove.is_empty() {
            self.remove_blocks_at(node, mover.remove.clone()).await;
        }
        Ok((mover.moved, mover.failed))
    }

    /// Asks `node` to remove blocks (best effort: a block left behind is an
    /// orphan there and removed after `data.orphan_grace`).
    pub async fn remove_blocks_at(&self, node: &str, ids: Vec<u64>) {
        if node == self.view.node_id {
            let _ = self
                .manager
                .call(move |reply| BlockMsg::Remove {
                    ids: ids.clone(),
                    reply: Some(reply),
                })
                .await;
            return;
        }
        if let Ok(gw) = self.view.gateway(node) {
            let _ = gw
                .call(
                    |reply| PeerMsg::RemoveBlocks { ids, reply },
                    Some(Duration::from_secs(30)),
                )
                .await;
        }
    }

    /// A node to hold a new copy of a block: up, not draining, not already
    /// holding it, with the most free space.
    fn replica_target(&self, block: &BlockInfo, avoid: &str) -> Option<MemberInfo> {
        self.view
            .live()
            .into_iter()
            .filter(|m| {
                !m.draining
                    && m.node_id != avoid
                    && !block.locs.contains(&m.node_id)
                    && m.free_bytes() >= block.stored
            })
            .max_by_key(|m| m.free_bytes())
    }

    /// Has `target` copy `block` from a live node that holds it.
    async fn copy_to(&self, block: &BlockInfo, target: &str) -> FsResult<()> {
        let source = block
            .locs
            .iter()
            .filter_map(|n| self.view.member(n))
            .find(|m| m.state == MemberState::Up)
            .ok_or_else(|| {
                FsError::NodeDown(format!(
                    "block {:#x}: no node holding it is up ({})",
                    block.id,
                    block.locs.join(", ")
                ))
            })?;
        let pull = PullBlock {
            id: block.id,
            len: block.stored,
            crc: block.crc,
            from: source.info.data_node(),
            token: self.tokens.issue(block.id, Access::Read),
        };
        if target == self.view.node_id {
            return self.pull_block(pull).await;
        }
        let gw = self.view.gateway(target)?;
        match gw
            .call(
                |reply| PeerMsg::Pull { pull, reply },
                Some(Duration::from_secs(300)),
            )
            .await
        {
            Ok(CallResult::Success(r)) => r,
            Ok(CallResult::Timeout) => Err(FsError::TimedOut(format!(
                "node {target} did not finish copying block {:#x}",
                block.id
            ))),
            _ => Err(FsError::Unavailable(format!(
                "node {target} went away while copying block {:#x}",
                block.id
            ))),
        }
    }

    /// Gives a file's blocks the replicas it asks for (after a write).
    pub async fn replicate_file(&self, ino: Ino) -> FsResult<()> {
        let (attr, blocks) = self.namespace.file_blocks_ino(ino).await?;
        let wanted = attr.replicas.max(1) as usize;
        // A few blocks at a time: copies of one file go to several nodes.
        for group in blocks.chunks(4) {
            let copies = group
                .iter()
                .map(|block| Box::pin(self.replicate_block(ino, block, wanted)));
            for result in join_all(copies.collect()).await {
                result?;
            }
        }
        Ok(())
    }

    async fn replicate_block(&self, ino: Ino, block: &BlockInfo, wanted: usize) -> FsResult<()> {
        let mut locs = block.locs.clone();
        while locs.len() < wanted {
            let mut probe = block.clone();
            probe.locs = locs.clone();
            let Some(target) = self.replica_target(&probe, "") else {
                tracing::warn!(
                    block = format!("{:#x}", block.id),
                    have = locs.len(),
                    wanted,
                    "not enough live nodes with room for the replicas asked"
                );
                break;
            };
            self.copy_to(&probe, &target.node_id).await?;
            locs.push(target.node_id);
        }
        if locs != block.locs {
            self.namespace
                .set_locs(ino, block.index, block.id, locs)
                .await?;
        }
        Ok(())
    }

    /// Gives blocks of the shards this node serves the replicas their file
    /// asks for, replacing copies on nodes down for longer than `after` with
    /// copies of a survivor. Returns the blocks changed.
    pub async fn rereplicate(&self, after: Duration) -> FsResult<u64> {
        let now = curvine_messages::now_ns();
        let dead: Vec<String> = self
            .view
            .members()
            .into_iter()
            .filter(|m| m.state == MemberState::Down && now - m.since_ns > after.as_nanos() as i64)
            .map(|m| m.info.node_id)
            .collect();
        let shards = self.view.map().shards_of(&self.view.node_id);
        let mut fixer = Rereplicate { dead, fixed: 0 };
        self.for_each_block(&shards, &mut fixer).await?;
        Ok(fixer.fixed)
    }

    /// Copies a block from another node into this node's store (a replica).
    pub async fn pull_block(&self, pull: PullBlock) -> FsResult<()> {
        let id = pull.id;
        if self.blocks.locate(id).is_ok() {
            return Ok(()); // already here (a retried pull)
        }
        let reservation = self
            .manager
            .call(move |reply| BlockMsg::Reserve {
                block: id,
                tier: None,
                size: pull.len.max(1),
                reply,
            })
            .await?;
        let path = std::path::PathBuf::from(&reservation.path);
        let copied =
            curvine_wire::data::copy_block(&self.pool, &pull.from, &pull.token, pull.len, &path)
                .await
                .and_then(|crcs| {
                    if curvine_messages::block::block_crc(&crcs) == pull.crc {
                        Ok(crcs)
                    } else {
                        Err(FsError::Corrupt(format!(
                            "block {id:#x} copied from node {} does not match its checksum",
                            pull.from.node_id
                        )))
                    }
                });
        let crcs = match copied {
            Ok(c) => c,
            Err(e) => {
                self.manager.cast(BlockMsg::Abort { block: id });
                return Err(e);
            }
        };
        let len = pull.len;
        self.manager
            .call(move |reply| BlockMsg::Commit {
                block: id,
                len,
                crcs: crcs.clone(),
                reply,
            })
            .await?;
        Ok(())
    }
}

/// An async callback over blocks (a trait so it can borrow its state).
trait AsyncBlockFn {
    async fn call(&mut self, service: &Service, ino: Ino, replicas: u16, block: BlockInfo);
}

impl<T: AsyncBlockFn> AsyncBlockFn for &mut T {
    async fn call(&mut self, service: &Service, ino: Ino, replicas: u16, block: BlockInfo) {
        (**self).call(service, ino, replicas, block).await
    }
}

/// Moves each block off one node.
struct Replace {
    node: String,
    moved: u64,
    failed: u64,
    remove: Vec<u64>,
}

impl AsyncBlockFn for Replace {
    async fn call(&mut self, service: &Service, ino: Ino, _replicas: u16, block: BlockInfo) {
        if !block.locs.contains(&self.node) {
            return;
        }
        let others: Vec<String> = block
            .locs
            .iter()
            .filter(|n| **n != self.node)
            .cloned()
            .collect();
        let result = async {
            let mut locs = others.clone();
            if let Some(target) = service.replica_target(&block, &self.node) {
                service.copy_to(&block, &target.node_id).await?;
                locs.push(target.node_id);
            } else if others.is_empty() {
                return Err(FsError::NoSpace(format!(
                    "no other node has room for block {:#x}",
                    block.id
                )));
            }
            service
                .namespace
                .set_locs(ino, block.index, block.id, locs)
                .await
        }
        .await;
        match result {
            Ok(_) => {
                self.moved += 1;
                self.remove.push(block.id);
            }
            Err(e) => {
                self.failed += 1;
                tracing::warn!(block = format!("{:#x}", block.id), error = %e, "cannot move block off the node");
            }
        }
    }
}

/// Replaces copies on dead nodes with new ones.
struct Rereplicate {
    dead: Vec<String>,
    fixed: u64,
}

impl AsyncBlockFn for Rereplicate {
    async fn call(&mut self, service: &Service, ino: Ino, replicas: u16, block: BlockInfo) {
        let wanted = replicas.max(1) as usize;
        let mut locs: Vec<String> = block
            .locs
            .iter()
            .filter(|n| !self.dead.contains(n))
            .cloned()
            .collect();
        let lost = locs.len() < block.locs.len();
        if locs.is_empty() || (!lost && locs.len() >= wanted) {
            return; // no survivor to copy from, or nothing to do
        }
        while locs.len() < wanted {
            let mut from = block.clone();
            from.locs = locs.clone();
            let Some(target) = service.replica_target(&from, "") else {
                break;
            };
            if let Err(e) = service.copy_to(&from, &target.node_id).await {
                tracing::warn!(block = format!("{:#x}", block.id), error = %e, "re-replication failed");
                return;
            }
            locs.push(target.node_id);
        }
        if locs == block.locs || (!lost && locs.len() == block.locs.len()) {
            return;
        }
        match service
            .namespace
            .set_locs(ino, block.index, block.id, locs)
            .await
        {
            Ok(true) => {
                self.fixed += 1;
                tracing::info!(
                    block = format!("{:#x}", block.id),
                    "gave a block the replicas it asks for"
                );
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(block = format!("{:#x}", block.id), error = %e, "recording a new replica failed")
            }
        }
    }
}

/// Runs futures concurrently and returns their outputs in order.
async fn join_all<F: std::future::Future + Unpin>(futures: Vec<F>) -> Vec<F::Output> {
    let mut slots: Vec<(F, Option<F::Output>)> = futures.into_iter().map(|f| (f, None)).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in slots.iter_mut() {
            if out.is_none() {
                match std::pin::Pin::new(f).poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    slots.into_iter().filter_map(|(_, out)| out).collect()
}

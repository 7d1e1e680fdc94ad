//! Block replicas: where a new copy goes, copying a block between nodes,
//! giving a written file the copies it asks for, re-replicating blocks that
//! lost a copy with a node, and moving blocks off a leaving node.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::cluster::ClusterView;
use curvine_actors::namespace::Namespace;
use curvine_actors::token::TokenKey;
use curvine_messages::block::{Access, BlockInfo, BlockMsg};
use curvine_messages::cluster::{MemberInfo, MemberState, PeerMsg, PullBlock};
use curvine_messages::{Attr, FsError, FsResult, Ino, ShardId};
use curvine_wire::data::DataPool;

pub struct Replicas {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
    blocks: Arc<BlockStore>,
    manager: BlockManagerRef,
    tokens: TokenKey,
    /// Connections to other nodes' data ports.
    pool: DataPool,
    /// Copies of each block of an fs_mode file not yet persisted
    /// (`ufs.pending_replicas`).
    pending_replicas: u16,
}

/// Whether a file's content exists only in the cluster (written under an
/// fs_mode mount and not yet persisted).
pub fn only_in_cluster(attr: &Attr) -> bool {
    attr.ufs
        .as_ref()
        .is_some_and(|u| u.persist.since_ns().is_some())
}

impl Replicas {
    pub fn new(
        namespace: Arc<Namespace>,
        view: Arc<ClusterView>,
        blocks: Arc<BlockStore>,
        manager: BlockManagerRef,
        tokens: TokenKey,
        pool: DataPool,
        pending_replicas: u16,
    ) -> Replicas {
        Replicas {
            namespace,
            view,
            blocks,
            manager,
            tokens,
            pool,
            pending_replicas,
        }
    }

    /// The copies each block of a file needs now: its own replicas, and
    /// `ufs.pending_replicas` while its content is only in the cluster.
    pub fn wanted(&self, attr: &Attr) -> usize {
        let own = attr.replicas.max(1);
        if only_in_cluster(attr) {
            // Capped by the cluster's members (not by those up: a member
            // down is a copy missing, and said so), so a cluster of one
            // node does not warn at every close.
            let members = self
                .view
                .members()
                .iter()
                .filter(|m| m.state != MemberState::Left)
                .count()
                .clamp(1, usize::from(u16::MAX)) as u16;
            own.max(self.pending_replicas.min(members)) as usize
        } else {
            own as usize
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
    pub async fn move_blocks_off(&self, node: &str) -> FsResult<(u64, u64)> {
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

    /// Gives a file's blocks the replicas it needs (after a write): those
    /// it asks for, more while its content is only in the cluster.
    pub async fn replicate_file(&self, ino: Ino) -> FsResult<()> {
        let (attr, blocks) = self.namespace.file_blocks_ino(ino).await?;
        let wanted = self.wanted(&attr);
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
        let shards = self.view.served_shards();
        let mut fixer = Rereplicate { dead, fixed: 0 };
        self.for_each_block(&shards, &mut fixer).await?;
        Ok(fixer.fixed)
    }

    /// Copies a block from another node into this node's store (a replica);
    /// done when a copy of it is committed here, by this pull or another.
    pub async fn pull_block(&self, pull: PullBlock) -> FsResult<()> {
        let id = pull.id;
        if self.blocks.locate(id).is_ok() {
            return Ok(()); // already here (a retried pull)
        }
        // Another pull of this block may be under way here (the one of a
        // file's close and one of the re-replication): its copy is this
        // one's, once committed; if it fails, this one copies.
        let waited = std::time::Instant::now();
        let reservation = loop {
            match self
                .manager
                .reserve(id, None, pull.len.max(1), false, None)
                .await
            {
                Ok(r) => break r,
                Err(FsError::Unavailable(why)) if waited.elapsed() < PULL_WAIT => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    if self.blocks.locate(id).is_ok() {
                        return Ok(());
                    }
                    tracing::trace!(block = id, why, "waiting for another copy of the block");
                }
                Err(e) => return Err(e),
            }
        };
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

/// How long a pull waits for another pull of the same block here.
const PULL_WAIT: Duration = Duration::from_secs(30);

/// An async callback over blocks (a trait so it can borrow its state).
trait AsyncBlockFn {
    async fn call(&mut self, this: &Replicas, ino: Ino, replicas: u16, block: BlockInfo);
}

impl<T: AsyncBlockFn> AsyncBlockFn for &mut T {
    async fn call(&mut self, this: &Replicas, ino: Ino, replicas: u16, block: BlockInfo) {
        (**self).call(this, ino, replicas, block).await
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
    async fn call(&mut self, this: &Replicas, ino: Ino, _replicas: u16, block: BlockInfo) {
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
            if let Some(target) = this.replica_target(&block, &self.node) {
                this.copy_to(&block, &target.node_id).await?;
                locs.push(target.node_id);
            } else if others.is_empty() {
                return Err(FsError::NoSpace(format!(
                    "no other node has room for block {:#x}",
                    block.id
                )));
            }
            this.namespace
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
    async fn call(&mut self, this: &Replicas, ino: Ino, replicas: u16, block: BlockInfo) {
        let mut wanted = replicas.max(1) as usize;
        let mut locs: Vec<String> = block
            .locs
            .iter()
            .filter(|n| !self.dead.contains(n))
            .cloned()
            .collect();
        let lost = locs.len() < block.locs.len();
        if lost && wanted < this.pending_replicas as usize {
            // A file not yet persisted keeps more copies than it asks for.
            if let Ok(attr) = this.namespace.getattr(ino).await {
                wanted = this.wanted(&attr);
            }
        }
        if locs.is_empty() || (!lost && locs.len() >= wanted) {
            return; // no survivor to copy from, or nothing to do
        }
        while locs.len() < wanted {
            let mut from = block.clone();
            from.locs = locs.clone();
            let Some(target) = this.replica_target(&from, "") else {
                break;
            };
            if let Err(e) = this.copy_to(&from, &target.node_id).await {
                tracing::warn!(block = format!("{:#x}", block.id), error = %e, "re-replication failed");
                return;
            }
            locs.push(target.node_id);
        }
        if locs == block.locs || (!lost && locs.len() == block.locs.len()) {
            return;
        }
        match this
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

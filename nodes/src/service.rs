//! Answers client requests with the node's actors.

use std::sync::Arc;

use std::time::Duration;

use ractor::rpc::CallResult;

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::cluster::ClusterView;
use curvine_actors::membership::MembershipMsg;
use curvine_actors::mounts::NewMount;
use curvine_actors::namespace::Namespace;
use curvine_actors::token::TokenKey;
use curvine_messages::block::{Access, BlockId, BlockMsg, DataNode, FreeSummary};
use curvine_messages::cluster::{MemberState, PeerMsg};
use curvine_messages::mount::MountInfo;
use curvine_messages::rpc::{
    BlockDetail, BlockGrant, BlockReplica, ClusterReport, FileBlocks, NodeReport, NodeScrub,
    NodeTrace, Request, Response, TraceEvents, WriteOpen,
};
use curvine_messages::stats::NodeActors;
use curvine_messages::{FileKind, FsError, FsResult};

/// What the node tells about itself in reports.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub cluster_id: String,
    pub node_id: String,
    pub rpc_addr: String,
    pub cluster_addr: String,
    pub data_dir: String,
    pub started_ns: i64,
}

pub struct Service {
    pub namespace: Arc<Namespace>,
    pub view: Arc<ClusterView>,
    pub info: NodeInfo,
    pub blocks: Arc<BlockStore>,
    pub manager: BlockManagerRef,
    pub tokens: TokenKey,
    /// Checks that clients know the cluster cookie.
    pub clients: curvine_wire::cookie::ClientKey,
    /// This node's data port, as clients reach it.
    pub data: DataNode,
    /// Connections to other nodes' data ports (replication).
    pub pool: curvine_wire::data::DataPool,
    pub membership: Arc<parking_lot::RwLock<Option<ractor::ActorRef<MembershipMsg>>>>,
    /// Shard moves driven by this node run one at a time.
    pub moves: tokio::sync::Mutex<()>,
    /// The mount table and a UFS client per mount.
    pub mounts: Arc<curvine_actors::mounts::Mounts>,
    /// The node's trace recorder.
    pub recorder: curvine_actors::trace::RecorderRef,
    /// The root of the node's supervision tree.
    pub root: ractor::ActorCell,
}

impl Service {
    pub fn cluster_id(&self) -> &str {
        &self.info.cluster_id
    }

    pub fn node_id(&self) -> &str {
        &self.info.node_id
    }

    /// The data ports of the nodes that are up. A block whose nodes are all
    /// missing here is on nodes that are down.
    pub(crate) fn live_nodes(&self) -> Vec<DataNode> {
        self.view
            .live()
            .into_iter()
            .filter(|m| !m.data_addr.is_empty())
            .map(|m| m.data_node())
            .collect()
    }

    /// Where a new block goes: this node while it has room for a block,
    /// else the live node with the most free space.
    pub(crate) fn place(&self, block_size: u64) -> DataNode {
        let me = self.view.me();
        if !me.draining && me.free_bytes() >= block_size {
            return self.data.clone();
        }
        self.view
            .live()
            .into_iter()
            .filter(|m| !m.draining && !m.data_addr.is_empty())
            .max_by_key(|m| m.free_bytes())
            .map(|m| m.data_node())
            .unwrap_or_else(|| self.data.clone())
    }

    /// A new block to write.
    fn grant(&self, id: BlockId, index: u32, block_size: u64) -> BlockGrant {
        BlockGrant {
            id,
            index,
            token: self.tokens.issue(id, Access::Write),
            node: self.place(block_size),
        }
    }

    /// Tells the other nodes at once (a heartbeat) that something they
    /// cache changed: the cluster map or the mount table.
    pub fn announce(&self) {
        if let Some(m) = self.membership.read().as_ref() {
            let _ = m.cast(MembershipMsg::Tick);
        }
    }

    async fn mount(&self, r: curvine_messages::rpc::Mount) -> FsResult<MountInfo> {
        if let Some(bs) = r.info.block_size {
            if bs == 0 || bs % (64 << 10) != 0 {
                return Err(FsError::InvalidArgument(format!(
                    "block size {bs}: expected a multiple of 64KiB"
                )));
            }
        }
        if r.info.replicas == Some(0) {
            return Err(FsError::InvalidArgument(
                "replicas must be at least 1".into(),
            ));
        }
        let m = self
            .mounts
            .mount(
                &self.namespace,
                NewMount {
                    info: r.info,
                    uid: r.uid,
                    gid: r.gid,
                },
            )
            .await?;
        self.announce();
        Ok(m)
    }

    /// This node's part of the cluster report.
    pub async fn node_report(&self) -> FsResult<NodeReport> {
        Ok(NodeReport {
            node_id: self.info.node_id.clone(),
            rpc_addr: self.info.rpc_addr.clone(),
            cluster_addr: self.info.cluster_addr.clone(),
            started_ns: self.info.started_ns,
            data_dir: self.info.data_dir.clone(),
            data_addr: self.data.data_addr.clone(),
            shards: self.namespace.shard_stats().await?,
            tiers: self.blocks.stats(),
            checksum_errors: self
                .blocks
                .checksum_errors
                .load(std::sync::atomic::Ordering::Relaxed),
            state: MemberState::Up.to_string(),
            state_since_ns: self.info.started_ns,
        })
    }

    /// Every node's report; nodes that do not answer are listed with their state.
    async fn cluster_report(&self) -> FsResult<ClusterReport> {
        let mut nodes = Vec::new();
        for m in self.view.members() {
            if m.info.node_id == self.info.node_id {
                nodes.push(self.node_report().await?);
                continue;
            }
            let asked = match self.view.gateway(&m.info.node_id) {
                Ok(gw) => match gw.call(PeerMsg::Report, Some(Duration::from_secs(5))).await {
                    Ok(CallResult::Success(Ok(r))) => Some(r),
                    _ => None,
                },
                Err(_) => None,
            };
            nodes.push(asked.unwrap_or_else(|| NodeReport {
                node_id: m.info.node_id.clone(),
                rpc_addr: m.info.rpc_addr.clone(),
                cluster_addr: m.info.cluster_addr.clone(),
                started_ns: m.info.started_ns,
                data_dir: String::new(),
                data_addr: m.info.data_addr.clone(),
                shards: Vec::new(),
                tiers: m.info.tiers.clone(),
                checksum_errors: 0,
                state: if m.state == MemberState::Up {
                    "unreachable".into()
                } else {
                    m.state.to_string()
                },
                state_since_ns: m.since_ns,
            }));
        }
        Ok(ClusterReport {
            cluster_id: self.info.cluster_id.clone(),
            shard_count: self.namespace.shard_count(),
            nodes,
            map: (*self.view.map()).clone(),
        })
    }

    /// Asks every node (or `only`) in parallel: this node with `here`, the
    /// others through their gateways with the message `peer` builds. Each
    /// node's answer, or why it could not give one; `what` names the
    /// request in errors.
    async fn ask_nodes<T, H, HF, P>(
        &self,
        only: Option<&str>,
        what: &str,
        timeout: Duration,
        here: H,
        peer: P,
    ) -> FsResult<Vec<(String, FsResult<T>)>>
    where
        T: Send + 'static,
        H: Fn() -> HF,
        HF: std::future::Future<Output = FsResult<T>>,
        P: Fn(&str, ractor::RpcReplyPort<FsResult<T>>) -> PeerMsg,
    {
        let members = self.view.members();
        if let Some(node) = only {
            if !members.iter().any(|m| m.info.node_id == node) {
                return Err(FsError::NotFound(format!(
                    "{what} --node {node}: no such node in this cluster"
                )));
            }
        }
        let (here, peer) = (&here, &peer);
        let asks = members
            .into_iter()
            .filter(|m| only.is_none_or(|n| n == m.info.node_id))
            .map(|m| async move {
                let node = m.info.node_id;
                let result = if node == self.info.node_id {
                    here().await
                } else {
                    match self.view.gateway(&node) {
                        Ok(gw) => match gw.call(|reply| peer(&node, reply), Some(timeout)).await {
                            Ok(CallResult::Success(r)) => r,
                            Ok(CallResult::Timeout) => Err(FsError::TimedOut(format!(
                                "node {node} did not answer in {}s",
                                timeout.as_secs()
                            ))),
                            _ => Err(FsError::Unavailable(format!("node {node} is gone"))),
                        },
                        Err(e) => Err(e),
                    }
                };
                (node, result)
            });
        Ok(futures::future::join_all(asks).await)
    }

    /// Trace events of every node (or of `query.node`), asked in parallel;
    /// a node that cannot answer is listed with the reason.
    pub async fn trace_events(&self, req: TraceEvents) -> FsResult<Vec<NodeTrace>> {
        req.query.validate()?;
        let query_of = |node: &str| {
            let mut query = req.query.clone();
            if let Some((_, seq)) = req.cursors.iter().find(|(n, _)| n == node) {
                query.from_seq = Some(*seq);
            }
            query
        };
        let here = self.info.node_id.clone();
        let answers = self
            .ask_nodes(
                req.query.node.as_deref(),
                "trace query",
                Duration::from_secs(10),
                || self.recorder.query(query_of(&here)),
                |node, reply| PeerMsg::Trace {
                    query: query_of(node),
                    reply,
                },
            )
            .await?;
        Ok(answers
            .into_iter()
            .map(|(node, result)| match result {
                Ok(batch) => NodeTrace {
                    node,
                    batch,
                    error: None,
                },
                Err(e) => NodeTrace {
                    node,
                    batch: Default::default(),
                    error: Some(e.to_string()),
                },
            })
            .collect())
    }

    /// The supervision tree of every node (or of `node`), asked in parallel.
    pub async fn actors(&self, node: Option<&str>) -> FsResult<Vec<NodeActors>> {
        let answers = self
            .ask_nodes(
                node,
                "actors",
                Duration::from_secs(10),
                || async { Ok(self.view.metrics.tree(&self.root)) },
                |_, reply| PeerMsg::Actors(reply),
            )
            .await?;
        let mut trees: Vec<NodeActors> = answers
            .into_iter()
            .map(|(node, result)| match result {
                Ok(root) => NodeActors {
                    node,
                    root: Some(root),
                    error: None,
                },
                Err(e) => NodeActors {
                    node,
                    root: None,
                    error: Some(e.to_string()),
                },
            })
            .collect();
        trees.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(trees)
    }

    /// Verifies the blocks of every node (or of `req.node`), in parallel.
    pub async fn scrub(&self, req: curvine_messages::rpc::Scrub) -> FsResult<Vec<NodeScrub>> {
        let repair = req.repair;
        let node = match &req.node {
            Some(n) => Some(self.find_member(n)?.node_id),
            None => None,
        };
        let answers = self
            .ask_nodes(
                node.as_deref(),
                "admin scrub",
                Duration::from_secs(24 * 3600),
                || self.scrub_local(repair),
                |_, reply| PeerMsg::Scrub { repair, reply },
            )
            .await?;
        let mut out: Vec<NodeScrub> = answers
            .into_iter()
            .map(|(node, result)| {
                result.unwrap_or_else(|e| NodeScrub {
                    node,
                    blocks: 0,
                    bytes: 0,
                    seconds: 0.0,
                    problems: Vec::new(),
                    error: Some(e.to_string()),
                })
            })
            .collect();
        out.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(out)
    }

    async fn free_path(&self, path: &str) -> FsResult<FreeSummary> {
        let mut ids: Vec<BlockId> = Vec::new();
        let mut stack = vec![path.to_string()];
        // Files whose content is in their UFS lose every cached block.
        let mut from_ufs = FreeSummary::default();
        while let Some(p) = stack.pop() {
            let attr = self.namespace.stat(&p, false).await?;
            match attr.kind {
                FileKind::File => {
                    let (_, blocks) = self.namespace.file_blocks_ino(attr.ino).await?;
                    let in_ufs = attr.writing.is_none()
                        && attr
                            .ufs
                            .as_ref()
                            .is_some_and(|u| u.persist == curvine_messages::mount::Persist::Synced);
                    if in_ufs {
                        let ino = attr.ino;
                        let n = self
                            .namespace
                            .call_shard(curvine_messages::shard_of(ino), move |reply| {
                                curvine_messages::shard::ShardMsg::UfsEvict { ino, reply }
                            })
                            .await?;
                        from_ufs.freed += n as u64;
                        from_ufs.freed_bytes += blocks.iter().map(|b| b.stored).sum::<u64>();
                        continue;
                    }
                    ids.extend(blocks.iter().map(|b| b.id));
                }
                FileKind::Dir => {
                    let mut after = None;
                    loop {
                        let page = self.namespace.list(&p, after.clone(), 1024).await?;
                        for e in &page.entries {
                            stack.push(format!("{}/{}", p.trim_end_matches('/'), e.name));
                        }
                        if !page.more {
                            break;
                        }
                        after = page.entries.last().map(|e| e.name.clone());
                    }
                }
                FileKind::Symlink => {}
            }
        }
        let mut summary = self
            .manager
            .call(move |reply| BlockMsg::Free {
                ids: ids.clone(),
                reply,
            })
            .await?;
        summary.freed += from_ufs.freed;
        summary.freed_bytes += from_ufs.freed_bytes;
        Ok(summary)
    }

    async fn file_blocks(&self, path: &str) -> FsResult<FileBlocks> {
        let (attr, blocks) = self.namespace.file_blocks(path).await?;
        let mut out = Vec::with_capacity(blocks.len());
        for info in blocks {
            let replicas = info
                .locs
                .iter()
                .map(|node| {
                    let here = (node == &self.info.node_id)
                        .then(|| self.blocks.locate(info.id).ok())
                        .flatten();
                    BlockReplica {
                        node_id: node.clone(),
                        tier: here.as_ref().map(|(r, _)| r.kind),
                        path: here.map(|(_, p)| p.display().to_string()),
                    }
                })
                .collect();
            out.push(BlockDetail { info, replicas });
        }
        Ok(FileBlocks { attr, blocks: out })
    }

    pub async fn handle(self: &Arc<Self>, request: Request) -> FsResult<Response> {
        let ns = &self.namespace;
        Ok(match request {
            Request::Stat(r) => Response::Attr(self.ufs_stat(&r.path).await?),
            Request::Mkdir(r) => Response::Attr(self.ufs_mkdir(&r).await?),
            Request::List(r) => Response::Listing(self.ufs_list(&r.path, r.after, r.limit).await?),
            Request::Touch(r) => Response::Attr(self.ufs_touch(&r).await?),
            Request::Symlink(r) => {
                Response::Attr(self.ufs_symlink(&r.target, &r.link, r.uid, r.gid).await?)
            }
            Request::Readlink(r) => Response::Target(ns.readlink(&r.path).await?),
            Request::Rename(r) => Response::Done(self.ufs_rename(&r.src, &r.dst).await?),
            Request::Remove(r) => {
                Response::Removed(self.ufs_remove(&r.path, r.recursive, r.dir).await?)
            }
            Request::SetAttrs(r) => {
                Response::Attr(self.ufs_setattr(&r.path, r.set, r.follow).await?)
            }
            Request::SetXattr(r) => Response::Done(
                self.through_ufs(&r.path, || {
                    ns.set_xattr(&r.path, &r.name, r.value.clone(), r.mode)
                })
                .await?,
            ),
            Request::GetXattr(r) => Response::Bytes(
                self.through_ufs(&r.path, || ns.get_xattr(&r.path, &r.name))
                    .await?,
            ),
            Request::ListXattr(r) => {
                Response::Names(self.through_ufs(&r.path, || ns.list_xattr(&r.path)).await?)
            }
            Request::RemoveXattr(r) => Response::Done(
                self.through_ufs(&r.path, || ns.remove_xattr(&r.path, &r.name))
                    .await?,
            ),
            Request::Report(_) => Response::Report(self.cluster_report().await?),
            Request::Fsck(_) => Response::Fsck(ns.fsck().await?),
            Request::OpenFile(r) => {
                let opened = self.ufs_open_write(&r).await?;
                Response::WriteOpen(WriteOpen {
                    first: opened
                        .first
                        .map(|(index, id)| self.grant(id, index, opened.attr.block_size)),
                    attr: opened.attr,
                    handle: opened.handle,
                    blocks: opened.blocks,
                })
            }
            Request::AddBlock(r) => {
                let id = ns.add_block(r.ino, r.handle, r.index).await?;
                Response::Grant(self.grant(id, r.index, self.namespace.default_block_size()))
            }
            Request::CompleteFile(r) => {
                let attr = self.ufs_complete(r).await?;
                if attr.replicas > 1 {
                    // Close returns once the replicas exist; a failure leaves
                    // the file whole with fewer copies (topped up later).
                    if let Err(e) = self.replicate_file(attr.ino).await {
                        tracing::warn!(ino = attr.ino, error = %e, "replicating a written file failed");
                    }
                }
                Response::Attr(attr)
            }
            Request::OpenRead(r) => Response::ReadOpen(self.ufs_open_read(&r.path).await?),
            Request::FreePath(r) => Response::Freed(self.free_path(&r.path).await?),
            Request::Blocks(r) => Response::FileBlocks(self.file_blocks(&r.path).await?),
            Request::Members(_) => Response::Members(self.view.members()),
            Request::MoveShard(r) => Response::Moved(self.move_shard(r.shard, &r.to).await?),
            Request::Rebalance(_) => Response::Moves(self.rebalance().await?),
            Request::Decommission(r) => Response::Decommissioned(self.decommission(&r.node).await?),
            Request::Mount(r) => Response::Mounted(self.mount(r).await?.redacted()),
            Request::Umount(r) => {
                self.check_umount(&r.path).await?;
                let m = self.mounts.umount(&self.namespace, &r.path).await?;
                self.announce();
                Response::Mounted(m.redacted())
            }
            Request::Load(r) => Response::Job(self.start_load(&r.path, r.no_overwrite).await?),
            Request::LoadStatus(r) => Response::Job(self.load_job(&r.id).await?),
            Request::CancelLoad(r) => Response::Job(self.cancel_load(&r.id).await?),
            Request::ListLoads(_) => Response::Jobs(self.load_jobs().await?),
            Request::TraceEvents(r) => Response::Traces(self.trace_events(r).await?),
            Request::Actors(r) => Response::ActorTrees(self.actors(r.node.as_deref()).await?),
            Request::Scrub(r) => Response::Scrubbed(self.scrub(r).await?),
            Request::RecordTrace(r) => {
                if r.events.len() > curvine_messages::rpc::MAX_RECORDED_EVENTS {
                    return Err(FsError::InvalidArgument(format!(
                        "{} trace events in one request; at most {}",
                        r.events.len(),
                        curvine_messages::rpc::MAX_RECORDED_EVENTS
                    )));
                }
                self.view.tracer.record_all(r.events);
                Response::Done(())
            }
            Request::ListMounts(_) => Response::MountList(
                self.mounts
                    .refresh(&self.namespace)
                    .await?
                    .mounts
                    .iter()
                    .map(|m| m.redacted())
                    .collect(),
            ),
        })
    }
}

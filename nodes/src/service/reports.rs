//! What the cluster reports about itself: the report of every node, trace
//! events, actor trees and scrub results, asked of every node (or one) in
//! parallel through their gateways.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;

use curvine_actors::blocks::BlockStore;
use curvine_actors::cluster::ClusterView;
use curvine_actors::namespace::Namespace;
use curvine_actors::trace::RecorderRef;
use curvine_messages::cluster::{MemberState, PeerMsg};
use curvine_messages::rpc::{ClusterReport, NodeReport, NodeScrub, NodeTrace, TraceEvents};
use curvine_messages::stats::NodeActors;
use curvine_messages::{FsError, FsResult};

use super::loads::Loads;
use super::scrub::Scrub;

/// What the node tells about itself in reports.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub cluster_id: String,
    pub node_id: String,
    pub rpc_addr: String,
    pub cluster_addr: String,
    pub data_addr: String,
    pub data_dir: String,
    pub started_ns: i64,
}

pub struct Reports {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
    blocks: Arc<BlockStore>,
    info: NodeInfo,
    recorder: RecorderRef,
    scrub: Arc<Scrub>,
    loads: Arc<Loads>,
    persist: Arc<super::persist::Persistence>,
    /// The registered name of the root of the node's supervision tree.
    root: String,
}

/// What reports are made from.
pub struct ReportsArgs {
    pub namespace: Arc<Namespace>,
    pub view: Arc<ClusterView>,
    pub blocks: Arc<BlockStore>,
    pub info: NodeInfo,
    pub recorder: RecorderRef,
    pub scrub: Arc<Scrub>,
    pub loads: Arc<Loads>,
    pub persist: Arc<super::persist::Persistence>,
    pub root: String,
}

impl Reports {
    pub fn new(a: ReportsArgs) -> Reports {
        Reports {
            namespace: a.namespace,
            view: a.view,
            blocks: a.blocks,
            info: a.info,
            recorder: a.recorder,
            scrub: a.scrub,
            loads: a.loads,
            persist: a.persist,
            root: a.root,
        }
    }

    /// This node's metrics in the Prometheus text format.
    pub async fn metrics_text(&self) -> String {
        super::metrics::node_metrics(&self.view, &self.blocks, &self.loads, self.persist.lag())
            .await
    }

    /// The actor tree of this node.
    pub fn actor_tree(&self) -> FsResult<curvine_messages::stats::ActorInfo> {
        match ractor::registry::where_is(self.root.clone()) {
            Some(root) => Ok(self.view.metrics.tree(&root)),
            None => Err(FsError::Unavailable("the node is stopping".into())),
        }
    }

    /// This node's part of the cluster report.
    pub async fn node_report(&self) -> FsResult<NodeReport> {
        Ok(NodeReport {
            node_id: self.info.node_id.clone(),
            rpc_addr: self.info.rpc_addr.clone(),
            cluster_addr: self.info.cluster_addr.clone(),
            started_ns: self.info.started_ns,
            data_dir: self.info.data_dir.clone(),
            data_addr: self.info.data_addr.clone(),
            shards: self.namespace.shard_stats().await?,
            tiers: self.blocks.stats(),
            checksum_errors: self
                .blocks
                .checksum_errors
                .load(std::sync::atomic::Ordering::Relaxed),
            state: MemberState::Up.to_string(),
            state_since_ns: self.info.started_ns,
            persist: self.persist.lag(),
        })
    }

    /// Every node's report; nodes that do not answer are listed with their state.
    pub async fn cluster_report(&self) -> FsResult<ClusterReport> {
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
                persist: Default::default(),
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
                || async { self.actor_tree() },
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
            Some(n) => Some(self.view.find_member(n)?.node_id),
            None => None,
        };
        let answers = self
            .ask_nodes(
                node.as_deref(),
                "admin scrub",
                Duration::from_secs(24 * 3600),
                || self.scrub.scrub_local(repair),
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
}

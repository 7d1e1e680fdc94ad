//! Calling shards: a message to the shard's actor on this node or, through
//! its node's gateway, on another; retried while the shard is busy or
//! restarting, up to a deadline (or, for intent steps, until a definite
//! answer).

use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::RpcReplyPort;

use curvine_messages::cluster::PeerMsg;
use curvine_messages::shard::{ShardMsg, Step, StepResult};
use curvine_messages::{now_ns, shard_of, FsError, FsResult, OpId, ReqId, ShardId};

use super::Namespace;
use crate::cluster::Route;

/// A new call id: when the call began, and a number unique to this node
/// process (random start, then counting).
fn next_call() -> ReqId {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static NEXT: OnceLock<AtomicU64> = OnceLock::new();
    let next = NEXT.get_or_init(|| AtomicU64::new(rand::random::<u64>()));
    ReqId {
        at_ns: now_ns(),
        nonce: next.fetch_add(1, Ordering::Relaxed),
    }
}

impl Namespace {
    /// Sends a message nobody waits for to a shard, wherever it is served.
    pub(super) fn cast(&self, shard: ShardId, msg: ShardMsg) {
        match self.cluster.route(shard) {
            Ok(Route::Local(actor)) => {
                self.cluster.metrics.shard_sent(shard);
                if actor.cast(crate::trace::traced(msg)).is_err() {
                    self.cluster.metrics.shard(shard).unsent();
                }
            }
            Ok(Route::Remote { gateway, .. }) => {
                let _ = gateway.cast(PeerMsg::Shard {
                    shard,
                    direct: false,
                    msg,
                    trace: crate::trace::current().map(|c| (c, now_ns())),
                    req: None,
                });
            }
            Err(_) => {}
        }
    }

    /// Where a call goes: the node serving `shard` by the map, or the copy
    /// of the shard on node `at` whatever the map says (`direct`).
    pub(super) fn target(&self, shard: ShardId, at: Option<&str>) -> FsResult<(Route, bool)> {
        match at {
            None => Ok((self.cluster.route(shard)?, false)),
            Some(node) if node == self.cluster.node_id => {
                Ok((Route::Local(self.cluster.local().get(shard)?), true))
            }
            Some(node) => Ok((
                Route::Remote {
                    node: node.to_string(),
                    gateway: self.cluster.gateway(node)?,
                },
                true,
            )),
        }
    }

    pub(super) async fn call_once<T: Send + 'static>(
        &self,
        shard: ShardId,
        (at, req): (Option<&str>, ReqId),
        build: &(impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync),
        wait: Duration,
    ) -> FsResult<T> {
        let (route, direct) = self.target(shard, at)?;
        let result = match route {
            Route::Local(actor) => {
                let stats = self.cluster.metrics.shard(shard);
                stats.sent();
                let r = actor
                    .call(
                        |reply| crate::trace::traced(build(reply)).of_call(Some(req)),
                        Some(wait),
                    )
                    .await;
                if matches!(r, Err(ractor::MessagingErr::SendErr(_))) {
                    stats.unsent();
                }
                r.map_err(drop)
            }
            // A node that goes down while it holds the request (a partition
            // stalls its connection) fails the request then, not at the timeout.
            Route::Remote { gateway, node } => tokio::select! {
                r = gateway.call(
                    |reply| PeerMsg::Shard {
                        shard,
                        direct,
                        msg: build(reply),
                        trace: crate::trace::current().map(|c| (c, now_ns())),
                        req: Some(req),
                    },
                    Some(wait),
                ) => r.map_err(drop),
                () = async {
                    if direct || !self.cluster.map().replicated(shard) {
                        std::future::pending::<()>().await;
                    }
                    self.cluster.wait_leader_moved(shard, &node).await
                } => {
                    return Err(FsError::Unavailable(format!(
                        "shard {shard}: its leadership moved from node {node} during the call; it may or may not have been applied"
                    )));
                }
                e = self.cluster.wait_down(&node) => {
                    // Another member of a replicated shard takes over: the
                    // call is made again there.
                    if !direct && self.cluster.map().replicated(shard) {
                        return Err(FsError::Unavailable(format!(
                            "shard {shard}: its leader's node went down; waiting for the next leader"
                        )));
                    }
                    return Err(match e {
                        FsError::NodeDown(d) => {
                            FsError::NodeDown(format!("shard {shard} is served by {d}"))
                        }
                        other => other,
                    })
                }
            },
        };
        match result {
            Ok(CallResult::Success(result)) => result,
            Ok(CallResult::Timeout) => Err(FsError::TimedOut(format!(
                "shard {shard} did not answer in {wait:?}"
            ))),
            Ok(CallResult::SenderError) | Err(_) => Err(FsError::Unavailable(format!(
                "shard {shard} stopped while handling the request"
            ))),
        }
    }

    /// Calls a shard (see [`Self::target`] for `at`), retrying while it is
    /// busy or restarting, up to `deadline`. Every attempt carries the same
    /// call id, so a mutation an earlier attempt applied is answered from
    /// the shard's record, not applied again.
    pub(super) async fn call_until<T: Send + 'static>(
        &self,
        shard: ShardId,
        at: Option<&str>,
        deadline: Option<Instant>,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        self.call_waiting(shard, at, (deadline, None), build).await
    }

    /// [`Self::call_until`] that also gives up on `Busy` once `busy_until`
    /// has passed (`deadline`, `busy_until`).
    async fn call_waiting<T: Send + 'static>(
        &self,
        shard: ShardId,
        at: Option<&str>,
        (deadline, busy_until): (Option<Instant>, Option<Instant>),
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        let req = next_call();
        let mut delay = Duration::from_micros(500);
        loop {
            let wait = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
                None => self.timeout,
            };
            match self.call_once(shard, (at, req), &build, wait).await {
                // Without a deadline (intent steps) a node that is down is
                // waited for: the step may still be applied there.
                Err(e)
                    if e.is_retryable()
                        || matches!(e, FsError::TimedOut(_))
                        || (deadline.is_none() && matches!(e, FsError::NodeDown(_))) =>
                {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d)
                        || (matches!(e, FsError::Busy(_)) && busy_until.is_some_and(|b| now >= b))
                    {
                        return Err(e);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    /// Calls the node serving `shard` (retrying until the request timeout).
    pub async fn call_shard<T: Send + 'static>(
        &self,
        shard: ShardId,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        self.call(shard, build).await
    }

    /// Asks block `id`'s shard to forget `node`'s copy of it where the data
    /// is whole elsewhere (only says what it would do without `apply`).
    pub async fn drop_copy(
        &self,
        id: curvine_messages::block::BlockId,
        node: &str,
        apply: bool,
    ) -> FsResult<curvine_messages::block::CopyDrop> {
        let node = node.to_string();
        self.call(shard_of(id), move |reply| ShardMsg::DropCopy {
            id,
            node: node.clone(),
            apply,
            reply,
        })
        .await
    }

    /// A request-scoped call: retries until the request timeout.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        shard: ShardId,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        self.call_until(shard, None, Some(Instant::now() + self.timeout), build)
            .await
    }

    /// Calls `node`'s own copy of `shard`, whatever the map says (the steps
    /// of a shard move). Retries while the copy restarts, up to the request
    /// timeout.
    pub async fn call_at<T: Send + 'static>(
        &self,
        node: &str,
        shard: ShardId,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        self.call_until(
            shard,
            Some(node),
            Some(Instant::now() + self.timeout),
            build,
        )
        .await
    }

    /// Compare-and-set of the cluster map held by shard 0.
    pub async fn set_map(
        &self,
        expect: u64,
        map: curvine_messages::cluster::ClusterMap,
    ) -> FsResult<curvine_messages::cluster::ClusterMap> {
        self.call(0, move |reply| ShardMsg::SetMap {
            expect,
            map: map.clone(),
            reply,
        })
        .await
    }

    /// An intent step: retried until it gets a definite answer. Steps run in
    /// a task of their own, so a request that times out does not stop them.
    pub(super) async fn step(
        &self,
        shard: ShardId,
        op: OpId,
        step_no: u8,
        step: Step,
    ) -> FsResult<StepResult> {
        self.step_waiting(shard, op, step_no, step, None).await
    }

    /// [`Self::step`], but a step that waits while another operation holds
    /// what it locks answers `Busy` once `busy_until` has passed. (Two
    /// operations that each hold a name and ask for the other's, as
    /// `x -> y` and `y -> x` do, would otherwise wait for each other
    /// forever; the one that gives up first rolls back.)
    pub(super) async fn step_waiting(
        &self,
        shard: ShardId,
        op: OpId,
        step_no: u8,
        step: Step,
        busy_until: Option<Instant>,
    ) -> FsResult<StepResult> {
        let build = move |reply| ShardMsg::ApplyStep {
            op,
            step_no,
            step: step.clone(),
            reply,
        };
        self.call_waiting(shard, None, (None, busy_until), build)
            .await
    }

    pub(super) async fn end_intent(&self, op: OpId) -> FsResult<()> {
        self.call_until(shard_of(op), None, None, |reply| ShardMsg::EndIntent {
            op,
            reply,
        })
        .await
    }

    pub(super) async fn abort_intent(&self, op: OpId) -> FsResult<()> {
        self.call_until(shard_of(op), None, None, |reply| ShardMsg::AbortIntent {
            op,
            reply,
        })
        .await
    }
}

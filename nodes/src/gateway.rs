//! `Gateway`: the one remotable actor of a node. Other nodes reach this
//! node's shards, blocks and reports through it (see
//! `curvine_messages::cluster`). It never waits: shard requests are handed
//! to the shard actor with their reply port, slow work runs in tasks.

use std::future::Future;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use curvine_actors::blocks::BlockManagerRef;
use curvine_actors::cluster::ClusterView;
use curvine_actors::membership::MembershipMsg;
use curvine_actors::supervisor::Slot;
use curvine_actors::trace::RecorderRef;
use curvine_actors::trace::Span;
use curvine_messages::block::BlockMsg;
use curvine_messages::cluster::{gateway_group, JoinInfo, PeerMsg};
use curvine_messages::shard::ShardMsg;
use curvine_messages::trace::Outcome;
use curvine_messages::trace::Traced;
use curvine_messages::{FsError, FsResult};

use crate::raft_net::RaftInboxes;
use crate::service::loads::Loads;
use crate::service::replicas::Replicas;
use crate::service::reports::Reports;
use crate::service::scrub::Scrub;

pub struct Gateway;

#[derive(Clone)]
pub struct GatewayArgs {
    pub view: Arc<ClusterView>,
    pub membership: Slot<MembershipMsg>,
    pub join: JoinInfo,
    pub data_dir: std::path::PathBuf,
    pub recorder: RecorderRef,
    pub manager: BlockManagerRef,
    /// What this node's readers hold (`HeldBlocks`).
    pub read_holds: Arc<curvine_actors::blocks::ReadHolds>,
    pub reports: Arc<Reports>,
    pub replicas: Arc<Replicas>,
    pub loads: Arc<Loads>,
    pub scrub: Arc<Scrub>,
    pub raft: Arc<RaftInboxes>,
}

/// Answers `reply` with what `work` gives, in a task of its own: the
/// gateway never waits.
fn answer_later<T: Send + 'static>(
    reply: RpcReplyPort<FsResult<T>>,
    work: impl Future<Output = FsResult<T>> + Send + 'static,
) {
    tokio::spawn(async move {
        let _ = reply.send(work.await);
    });
}

impl Actor for Gateway {
    type Msg = PeerMsg;
    type State = GatewayArgs;
    type Arguments = GatewayArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<PeerMsg>,
        args: GatewayArgs,
    ) -> Result<GatewayArgs, ActorProcessingErr> {
        let stats = args.view.metrics.actor("gateway", false);
        args.view.metrics.started(myself.get_id(), &stats);
        ractor::pg::join(gateway_group(&args.view.node_id), vec![myself.get_cell()]);
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<PeerMsg>,
        message: PeerMsg,
        state: &mut GatewayArgs,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.view.metrics.actor("gateway", false);
        let _handling = stats.handling(message.kind_name());
        match message {
            PeerMsg::Actors(reply) => {
                let _ = reply.send(state.reports.actor_tree());
            }
            PeerMsg::Heartbeat(hb) => {
                if let Some(m) = state.membership.current() {
                    let _ = m.cast(MembershipMsg::Heard(hb));
                }
            }
            PeerMsg::Raft(part) => state.raft.receive(part),
            PeerMsg::JoinGroup { shard, leader } => state.raft.join(shard, leader),
            PeerMsg::Join(reply) => {
                let mut info = state.join.clone();
                info.map = (*state.view.map()).clone();
                let _ = reply.send(Ok(info));
            }
            PeerMsg::Shard {
                shard,
                direct,
                msg,
                trace,
                req,
            } => forward_to_shard(&myself, state, shard, direct, msg, (trace, req)),
            PeerMsg::Trace { query, reply } => {
                let recorder = state.recorder.clone();
                answer_later(reply, async move { recorder.query(query).await });
            }
            PeerMsg::Report(reply) => {
                let reports = state.reports.clone();
                answer_later(reply, async move { reports.node_report().await });
            }
            PeerMsg::RemoveBlocks { ids, reply } => {
                let manager = state.manager.clone();
                answer_later(reply, async move {
                    manager
                        .call(move |r| BlockMsg::Remove {
                            ids: ids.clone(),
                            reply: Some(r),
                        })
                        .await
                        .map(drop)
                });
            }
            PeerMsg::HeldBlocks { ids, reply } => {
                let _ = reply.send(Ok(state.read_holds.held(&ids)));
            }
            PeerMsg::Pull { pull, reply } => {
                let replicas = state.replicas.clone();
                answer_later(reply, async move { replicas.pull_block(pull).await });
            }
            PeerMsg::Load { part, trace, reply } => {
                // In a traced job the part is a span of this gateway's, and
                // what it asks of shards and the UFS joins it.
                let span = trace.and_then(|(ctx, sent_ns)| {
                    state.view.tracer.start(
                        Some(ctx),
                        sent_ns,
                        "gateway",
                        myself.get_id(),
                        "PeerMsg::Load",
                    )
                });
                let ctx = span.as_ref().map(|s| s.ctx());
                let loads = state.loads.clone();
                tokio::spawn(curvine_actors::trace::scope(ctx, async move {
                    let result = loads.load_part(&part).await;
                    if let Some(span) = span {
                        span.end(curvine_actors::trace::outcome_of(&result));
                    }
                    let _ = reply.send(result);
                }));
            }
            PeerMsg::Scrub { repair, reply } => {
                let scrub = state.scrub.clone();
                answer_later(reply, async move { scrub.scrub_local(repair).await });
            }
            PeerMsg::Drain {
                draining,
                leave,
                reply,
            } => {
                let _ = reply.send(crate::service::admin::leave_or_drain(
                    &state.view,
                    &state.data_dir,
                    &state.membership,
                    draining,
                    leave,
                ));
            }
            PeerMsg::Invalid { reason, reply } => {
                tracing::warn!(reason, "refused a message from another node");
                PeerMsg::refuse(&reason, reply);
            }
        }
        Ok(())
    }
}

/// Hands a shard request from another node to the shard's actor here,
/// with its reply port (the gateway never waits on it), as a span of the
/// sender's trace; refuses it when this node does not serve the shard
/// (unless `direct`: a request for this node's copy, as a shard move makes).
fn forward_to_shard(
    myself: &ActorRef<PeerMsg>,
    state: &GatewayArgs,
    shard: curvine_messages::ShardId,
    direct: bool,
    msg: ShardMsg,
    (trace, req): (
        Option<(curvine_messages::trace::TraceCtx, i64)>,
        Option<curvine_messages::ReqId>,
    ),
) {
    let view = &state.view;
    let span = trace.and_then(|(ctx, sent_ns)| {
        view.tracer.start(
            Some(ctx),
            sent_ns,
            "gateway",
            myself.get_id(),
            "PeerMsg::Shard",
        )
    });
    let fail = |msg: ShardMsg, e: FsError, span: Option<Span>| {
        if let Some(span) = span {
            span.end(Outcome::Error(e.kind_name().to_string()));
        }
        msg.fail(e);
    };
    if !direct && !view.serves(shard) {
        let owner = view.map().owner(shard).unwrap_or("nobody").to_string();
        let e = FsError::Unavailable(format!(
            "shard {shard} is not served by node {} (its map, version {}, names {owner})",
            view.node_id,
            view.map().version
        ));
        fail(msg, e, span);
        return;
    }
    match view.local().get(shard) {
        Ok(actor) => {
            // The gateway's span ends when it has handed the
            // request to the shard, which continues the trace.
            let ctx = span.as_ref().map(|s| s.ctx());
            view.metrics.shard_sent(shard);
            match actor.send_message(Traced::new(msg, ctx).of_call(req)) {
                Ok(()) => {
                    if let Some(span) = span {
                        span.end(Outcome::Ok);
                    }
                }
                Err(ractor::MessagingErr::SendErr(m)) => {
                    view.metrics.shard(shard).unsent();
                    let e = FsError::Unavailable(format!("shard {shard} is restarting"));
                    fail(m.msg, e, span);
                }
                Err(_) => {}
            }
        }
        Err(e) => fail(msg, e, span),
    }
}

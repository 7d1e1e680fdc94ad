//! `Gateway`: the one remotable actor of a node. Other nodes reach this
//! node's shards, blocks and reports through it (see
//! `curvine_messages::cluster`). It never waits: shard requests are handed
//! to the shard actor with their reply port, slow work runs in tasks.

use std::sync::{Arc, OnceLock, Weak};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use curvine_actors::cluster::ClusterView;
use curvine_actors::membership::MembershipMsg;
use curvine_actors::trace::RecorderRef;
use curvine_actors::trace::Span;
use curvine_messages::block::BlockMsg;
use curvine_messages::cluster::{gateway_group, JoinInfo, PeerMsg};
use curvine_messages::shard::ShardMsg;
use curvine_messages::trace::Outcome;
use curvine_messages::trace::Traced;
use curvine_messages::{FsError, FsResult};

use crate::service::Service;

pub struct Gateway;

#[derive(Clone)]
pub struct GatewayArgs {
    pub view: Arc<ClusterView>,
    /// Filled once the node's service exists (it is built after the actors).
    pub service: Arc<OnceLock<Weak<Service>>>,
    pub membership: Arc<parking_lot::RwLock<Option<ActorRef<MembershipMsg>>>>,
    pub join: JoinInfo,
    pub data_dir: std::path::PathBuf,
    pub recorder: RecorderRef,
}

impl GatewayArgs {
    fn service(&self) -> Result<Arc<Service>, FsError> {
        self.service
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| FsError::Unavailable("the node is starting".into()))
    }
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
                let tree = match myself.try_get_supervisor() {
                    Some(root) => Ok(state.view.metrics.tree(&root)),
                    None => Err(FsError::Unavailable("the node is stopping".into())),
                };
                let _ = reply.send(tree);
            }
            PeerMsg::Heartbeat(hb) => {
                if let Some(m) = state.membership.read().as_ref() {
                    let _ = m.cast(MembershipMsg::Heard(hb));
                }
            }
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
            } => {
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
                    return Ok(());
                }
                match view.local().get(shard) {
                    Ok(actor) => {
                        // The gateway's span ends when it has handed the
                        // request to the shard, which continues the trace.
                        let ctx = span.as_ref().map(|s| s.ctx());
                        view.metrics.shard_sent(shard);
                        match actor.send_message(Traced::new(msg, ctx)) {
                            Ok(()) => {
                                if let Some(span) = span {
                                    span.end(Outcome::Ok);
                                }
                            }
                            Err(ractor::MessagingErr::SendErr(m)) => {
                                view.metrics.shard(shard).unsent();
                                let e =
                                    FsError::Unavailable(format!("shard {shard} is restarting"));
                                fail(m.msg, e, span);
                            }
                            Err(_) => {}
                        }
                    }
                    Err(e) => fail(msg, e, span),
                }
            }
            PeerMsg::Trace { query, reply } => {
                let recorder = state.recorder.clone();
                tokio::spawn(async move {
                    let _ = reply.send(recorder.query(query).await);
                });
            }
            PeerMsg::Report(reply) => {
                let service = state.service();
                tokio::spawn(async move {
                    let result = match service {
                        Ok(s) => s.node_report().await,
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(result);
                });
            }
            PeerMsg::RemoveBlocks { ids, reply } => {
                let service = state.service();
                tokio::spawn(async move {
                    let result = match service {
                        Ok(s) => s
                            .manager
                            .call(move |r| BlockMsg::Remove {
                                ids: ids.clone(),
                                reply: Some(r),
                            })
                            .await
                            .map(drop),
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(result);
                });
            }
            PeerMsg::Pull { pull, reply } => {
                let service = state.service();
                tokio::spawn(async move {
                    let result = match service {
                        Ok(s) => s.pull_block(pull).await,
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(result);
                });
            }
            PeerMsg::Load { part, trace, reply } => {
                let service = state.service();
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
                tokio::spawn(curvine_actors::trace::scope(ctx, async move {
                    let result = match service {
                        Ok(s) => s.load_part(&part).await,
                        Err(e) => Err(e),
                    };
                    if let Some(span) = span {
                        span.end(curvine_actors::trace::outcome_of(&result));
                    }
                    let _ = reply.send(result);
                }));
            }
            PeerMsg::Scrub { repair, reply } => {
                let service = state.service();
                tokio::spawn(async move {
                    let result = match service {
                        Ok(s) => s.scrub_local(repair).await,
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(result);
                });
            }
            PeerMsg::Drain {
                draining,
                leave,
                reply,
            } => {
                let _ = reply.send(leave_or_drain(
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

/// Marks this node draining, or gone for good: then it announces that it
/// left and records it in its data directory, so it does not start again.
pub fn leave_or_drain(
    view: &ClusterView,
    data_dir: &std::path::Path,
    membership: &parking_lot::RwLock<Option<ActorRef<MembershipMsg>>>,
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
        if let Some(m) = membership.read().as_ref() {
            let _ = m.cast(MembershipMsg::Leave);
        }
        tracing::warn!("this node was decommissioned and has left the cluster; it can be stopped");
    } else if draining {
        tracing::info!("this node is draining: it takes no new shards or blocks");
    }
    Ok(())
}

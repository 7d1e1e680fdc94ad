//! The node's supervision tree: every actor and long-running task of the
//! node under one generic supervisor (`curvine_runtime::supervisor`), in
//! start order. Each child is reached through a stable handle (a slot the
//! supervisor fills), so nothing is patched by hand after a restart.
//!
//! ```text
//! node
//!  ├─ trace-recorder
//!  ├─ shard-host ─ shard-{N}
//!  ├─ block-manager ─ tier-evictors ─ evictor-{tier}
//!  ├─ data-server        the data port's accept loop (task)
//!  ├─ gateway
//!  ├─ membership
//!  ├─ ufs-loader
//!  ├─ cluster-port       with TLS: the cluster port's accept loop (task)
//!  ├─ client-port        the client port's accept loop (task)
//!  ├─ s3-gateway         with s3.listen: the S3 gateway's accept loop (task)
//!  ├─ re-replicator      re-replication passes (task)
//!  ├─ shard-keeper       shard groups in step with the map (task)
//!  └─ metrics-history    samples the metrics for the dashboard's charts (task)
//! ```

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;

use curvine_actors::blocks::{BlockArgs, BlockManager, BlockManagerRef};
use curvine_actors::host::{HostArgs, ShardHost};
use curvine_actors::membership::{Membership, MembershipArgs, MembershipMsg};
use curvine_actors::stats::Metrics;
use curvine_actors::supervisor::{
    ActorChild, RestartPolicy, Slot, Supervisor, SupervisorArgs, TaskChild,
};
use curvine_actors::trace::{RecorderRef, TraceRecorder, Tracer};
use curvine_wire::tls::Tls;

use crate::data_port::DataContext;
use crate::gateway::{Gateway, GatewayArgs};
use crate::keeper::ShardKeeper;
use crate::ports::accept_loop;
use crate::service::loader::{UfsLoader, UfsLoaderArgs};
use crate::service::replicas::Replicas;
use crate::service::Service;

/// What the node's children are made from.
pub struct TreeParts {
    pub policy: RestartPolicy,
    pub metrics: Metrics,
    pub tracer: Tracer,
    pub recorder: RecorderRef,
    pub host: HostArgs,
    pub blocks: BlockArgs,
    pub block_ref: BlockManagerRef,
    pub data: (Arc<std::net::TcpListener>, DataContext),
    pub gateway: GatewayArgs,
    pub membership: (MembershipArgs, Slot<MembershipMsg>),
    pub loader: UfsLoaderArgs,
    /// With TLS: the cluster port's public listener, served for the node server.
    pub cluster_tls: Option<(
        Arc<std::net::TcpListener>,
        Arc<Tls>,
        ActorRef<ractor_cluster::NodeServerMessage>,
    )>,
    /// The client port's socket, the service, TLS, and `node.max_connections`.
    pub client: (
        Arc<std::net::TcpListener>,
        Arc<Service>,
        Option<Arc<Tls>>,
        u32,
    ),
    pub replicas: (Arc<Replicas>, Duration),
    pub keeper: Arc<ShardKeeper>,
    /// The metrics history and what it samples.
    pub history: (
        Arc<crate::service::history::History>,
        Arc<crate::service::reports::Reports>,
    ),
    /// With `s3.listen`: the S3 gateway's socket and the gateway.
    pub s3: Option<(Arc<std::net::TcpListener>, curvine_s3::Gateway)>,
}

/// The arguments of the node's root supervisor.
pub fn node_supervisor(p: TreeParts) -> SupervisorArgs {
    let shard_host = ShardHost::supervisor(p.host);
    let recorder = (p.tracer.clone(), p.metrics.clone());
    let blocks = p.blocks;
    let (data_listener, data_ctx) = p.data;
    let gateway = p.gateway;
    let (membership, membership_slot) = p.membership;
    let loader = p.loader;
    let mut sup = SupervisorArgs::new("node", p.policy, p.metrics)
        .stop_timeout(Duration::from_secs(60))
        .child(
            ActorChild::new("trace-recorder", move || (TraceRecorder, recorder.clone()))
                .with_slot(p.recorder.slot())
                .boxed(),
        )
        .child(ActorChild::new("shard-host", move || (Supervisor, shard_host.clone())).boxed())
        .child(
            ActorChild::new("block-manager", move || (BlockManager, blocks.clone()))
                .with_slot(p.block_ref.slot())
                .boxed(),
        )
        .child(
            accept_loop("data-server", data_listener, move |listener| {
                crate::data_port::serve(listener, data_ctx.clone())
            })
            .boxed(),
        )
        .child(ActorChild::new("gateway", move || (Gateway, gateway.clone())).boxed())
        .child(
            ActorChild::new("membership", move || (Membership, membership.clone()))
                .with_slot(membership_slot)
                .boxed(),
        )
        .child(ActorChild::new("ufs-loader", move || (UfsLoader, loader.clone())).boxed());
    if let Some((listener, tls, server)) = p.cluster_tls {
        sup = sup.child(
            accept_loop("cluster-port", listener, move |listener| {
                crate::cluster_port::serve_cluster(listener, tls.clone(), server.clone())
            })
            .boxed(),
        );
    }
    let (client_listener, service, tls, max_connections) = p.client;
    let limit = crate::client_port::ConnectionLimit::new(max_connections);
    let (replicas, after) = p.replicas;
    let keeper = p.keeper;
    let (history, reports) = p.history;
    sup = sup.child(
        accept_loop("client-port", client_listener, move |listener| {
            crate::client_port::serve(listener, service.clone(), tls.clone(), limit.clone())
        })
        .boxed(),
    );
    if let Some((listener, gateway)) = p.s3 {
        sup = sup.child(
            accept_loop("s3-gateway", listener, move |listener| {
                curvine_s3::serve(listener, gateway.clone())
            })
            .boxed(),
        );
    }
    sup.child(
        TaskChild::new("re-replicator", move || {
            replicate_loop(replicas.clone(), after)
        })
        .boxed(),
    )
    .child(TaskChild::new("shard-keeper", move || crate::keeper::run(keeper.clone())).boxed())
    .child(
        TaskChild::new("metrics-history", move || {
            crate::service::history::run(history.clone(), reports.clone())
        })
        .boxed(),
    )
}

/// Periodically gives blocks of the shards this node serves their replicas
/// back (see `Replicas::rereplicate`).
async fn replicate_loop(replicas: Arc<Replicas>, after: Duration) {
    let period = (after / 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        tokio::time::sleep(period).await;
        match replicas.rereplicate(after).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(blocks = n, "replicas restored"),
            Err(e) => tracing::debug!(error = %e, "re-replication pass stopped early"),
        }
    }
}

//! Node assembly: the root supervisor, the client port and the cluster port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::net::TcpListener;

use curvine_actors::blocks::{
    BlockArgs, BlockConf, BlockManager, BlockManagerRef, BlockStore, TierInfo,
};
use curvine_actors::host::{HostArgs, ShardDirectory, ShardHost};
use curvine_actors::namespace::{FileDefaults, Namespace};
use curvine_actors::shard::ShardArgs;
use curvine_actors::stats::Metrics;
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_actors::supervisor::{RestartPolicy, RestartTracker};
use curvine_actors::token::TokenKey;
use curvine_actors::trace::{RecorderRef, TraceRecorder, Tracer};
use curvine_conf::Config;
use curvine_messages::block::{DataNode, TierKind};
use curvine_messages::{now_ns, ShardId};

use std::sync::{OnceLock, Weak};

use curvine_actors::cluster::ClusterView;
use curvine_actors::membership::{read_members_file, Membership, MembershipArgs, MembershipMsg};
use curvine_actors::mounts::Mounts;
use curvine_messages::cluster::{ClusterMap, JoinInfo, MemberInfo};

use crate::data::{DataContext, DataServer, DataServerArgs};
use crate::gateway::{Gateway, GatewayArgs};
use crate::identity::DataDir;
use crate::service::{NodeInfo, Service};
use curvine_wire::tls::Tls;

/// Root of the node's supervision tree. Restarts a failed child with backoff;
/// when a child fails too often it fails itself, which stops the node.
pub struct NodeSupervisor;

/// The children of the node supervisor, in start order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    ShardHost,
    BlockManager,
    DataServer,
    Gateway,
    Membership,
    UfsLoader,
    TraceRecorder,
}

impl Child {
    const ALL: [Child; 7] = [
        Child::TraceRecorder,
        Child::ShardHost,
        Child::BlockManager,
        Child::DataServer,
        Child::Gateway,
        Child::Membership,
        Child::UfsLoader,
    ];

    fn name(self) -> &'static str {
        match self {
            Child::ShardHost => "shard-host",
            Child::BlockManager => "block-manager",
            Child::DataServer => "data-server",
            Child::Gateway => "gateway",
            Child::Membership => "membership",
            Child::UfsLoader => "ufs-loader",
            Child::TraceRecorder => "trace-recorder",
        }
    }
}

pub struct NodeArgs {
    pub make_host_args: Arc<dyn Fn() -> HostArgs + Send + Sync>,
    pub block_args: BlockArgs,
    pub block_ref: BlockManagerRef,
    pub data_args: Arc<dyn Fn() -> DataServerArgs + Send + Sync>,
    pub gateway_args: GatewayArgs,
    pub membership_args: MembershipArgs,
    pub loader_args: crate::persist::UfsLoaderArgs,
    pub tracer: Tracer,
    pub recorder: RecorderRef,
    pub policy: RestartPolicy,
    pub metrics: Metrics,
}

pub enum NodeMsg {
    Restart(Child),
}

impl ractor::Message for NodeMsg {}

pub struct NodeState {
    args: NodeArgs,
    children: Vec<(Child, ractor::ActorCell)>,
    trackers: Vec<(Child, RestartTracker)>,
}

impl NodeSupervisor {
    async fn start_child(
        myself: &ActorRef<NodeMsg>,
        state: &mut NodeState,
        child: Child,
    ) -> Result<(), ActorProcessingErr> {
        let cell = match child {
            Child::ShardHost => Actor::spawn_linked(
                Some(format!(
                    "{}/{}",
                    myself.get_name().unwrap_or_default(),
                    child.name()
                )),
                ShardHost,
                (state.args.make_host_args)(),
                myself.get_cell(),
            )
            .await?
            .0
            .get_cell(),
            Child::BlockManager => {
                let (actor, _) = Actor::spawn_linked(
                    None,
                    BlockManager,
                    state.args.block_args.clone(),
                    myself.get_cell(),
                )
                .await?;
                state.args.block_ref.set(Some(actor.clone()));
                actor.get_cell()
            }
            Child::DataServer => Actor::spawn_linked(
                None,
                DataServer,
                (state.args.data_args)(),
                myself.get_cell(),
            )
            .await?
            .0
            .get_cell(),
            Child::Gateway => Actor::spawn_linked(
                None,
                Gateway,
                state.args.gateway_args.clone(),
                myself.get_cell(),
            )
            .await?
            .0
            .get_cell(),
            Child::Membership => {
                let (actor, _) = Actor::spawn_linked(
                    None,
                    Membership,
                    state.args.membership_args.clone(),
                    myself.get_cell(),
                )
                .await?;
                *state.args.gateway_args.membership.write() = Some(actor.clone());
                actor.get_cell()
            }
            Child::TraceRecorder => {
                let (actor, _) = Actor::spawn_linked(
                    None,
                    TraceRecorder,
                    (state.args.tracer.clone(), state.args.metrics.clone()),
                    myself.get_cell(),
                )
                .await?;
                state.args.recorder.set(Some(actor.clone()));
                actor.get_cell()
            }
            Child::UfsLoader => Actor::spawn_linked(
                None,
                crate::persist::UfsLoader,
                state.args.loader_args.clone(),
                myself.get_cell(),
            )
            .await?
            .0
            .get_cell(),
        };
        state.children.retain(|(c, _)| *c != child);
        state.children.push((child, cell));
        Ok(())
    }
}

impl Actor for NodeSupervisor {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<NodeMsg>,
        args: NodeArgs,
    ) -> Result<NodeState, ActorProcessingErr> {
        let stats = args.metrics.actor("node", false);
        args.metrics.started(myself.get_id(), &stats);
        let mut state = NodeState {
            args,
            children: Vec::new(),
            trackers: Child::ALL
                .iter()
                .map(|c| (*c, RestartTracker::default()))
                .collect(),
        };
        for child in Child::ALL {
            Self::start_child(&myself, &mut state, child).await?;
        }
        Ok(state)
    }

    async fn post_stop(
        &self,
        myself: ActorRef<NodeMsg>,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        state.args.block_ref.set(None);
        state.args.recorder.set(None);
        myself
            .stop_children_and_wait(Some("node stopping".into()), Some(Duration::from_secs(60)))
            .await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<NodeMsg>,
        message: NodeMsg,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.args.metrics.actor("node", false);
        let _handling = stats.handling("restart");
        match message {
            NodeMsg::Restart(child) => Self::start_child(&myself, state, child).await?,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<NodeMsg>,
        event: SupervisionEvent,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, error) = match &event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, error.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.clone().unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        let Some(pos) = state
            .children
            .iter()
            .position(|(_, c)| c.get_id() == cell.get_id())
        else {
            return Ok(());
        };
        let (child, _) = state.children.remove(pos);
        if child == Child::BlockManager {
            state.args.block_ref.set(None);
        }
        if child == Child::Membership {
            *state.args.gateway_args.membership.write() = None;
        }
        if child == Child::TraceRecorder {
            state.args.recorder.set(None);
        }
        tracing::error!(child = child.name(), error = %error, "node actor failed");
        let child_stats = state.args.metrics.actor(child.name(), false);
        child_stats.failed();
        let policy = state.args.policy.clone();
        let tracker = state
            .trackers
            .iter_mut()
            .find(|(c, _)| *c == child)
            .map(|(_, t)| t);
        match tracker.and_then(|t| t.on_failure(&policy, Instant::now())) {
            Some(delay) => {
                child_stats.restarted();
                myself.send_after(delay, move || NodeMsg::Restart(child));
            }
            None => {
                return Err(format!("{} keeps failing; last error: {error}", child.name()).into())
            }
        }
        Ok(())
    }
}

/// A running node.
pub struct RunningNode {
    pub data_dir: DataDir,
    pub supervisor: ActorRef<NodeMsg>,
    pub supervisor_done: tokio::task::JoinHandle<()>,
    pub service: Arc<Service>,
    pub rpc_addr: String,
    pub cluster_addr: String,
    pub data_addr: String,
    /// The HTTP port (dashboard, API, metrics), unless `http.listen = "off"`.
    pub http: Option<crate::http::HttpHandle>,
    server: tokio::task::JoinHandle<()>,
    replicator: tokio::task::JoinHandle<()>,
    cluster_server: Option<ActorRef<ractor_cluster::NodeServerMessage>>,
    /// The cluster port's accept task when TLS is on.
    _cluster_accept: Option<AbortOnDrop>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    DataDir(#[from] crate::identity::IdentityError),
    #[error("cannot listen for clients on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("cannot start the cluster port on {addr}: {reason}")]
    Cluster { addr: String, reason: String },
    #[error("cannot open the metadata store: {0}")]
    Store(String),
    #[error("cannot start the actors: {0}")]
    Actors(String),
    #[error("cannot join the cluster: {0}")]
    Join(String),
    #[error("TLS settings: {0}")]
    Tls(String),
}

/// Starts a node with `config`: opens (or formats) the data directory, joins
/// the cluster of its seeds when the directory is new, starts the
/// supervision tree, the client port and the cluster port.
pub async fn start(config: &Config) -> Result<RunningNode, StartError> {
    let tls = Tls::from_conf(&config.tls, true).map_err(|e| StartError::Tls(e.to_string()))?;
    let mut data_dir = DataDir::open(&config.data_dir(), config)?;

    // The cluster port first: a new node learns its cluster through it.
    // With port 0 a free one is picked, again if another process takes it
    // between the probe and the bind. Plain, ractor_cluster's listener
    // serves it, on every interface. With TLS this node accepts it on the
    // configured address (`tls::serve_cluster`: each handshake in a task of
    // its own with a timeout, where ractor_cluster's listener would wait on
    // one handshake before it accepts the next connection) and hands
    // finished sessions to the node server, whose own listener is then
    // bound to a loopback port (TLS too) and announces the public port.
    let configured = config.cluster_listen();
    let any_port = split_addr(&configured).1 == 0;
    let mut attempt = 0;
    let (cluster_server, cluster_addr, cluster_accept) = loop {
        attempt += 1;
        let cluster_addr = resolve_port(&configured)?;
        let (cluster_host, cluster_port) = split_addr(&cluster_addr);
        let cluster_error = |e: &dyn std::fmt::Display| StartError::Cluster {
            addr: cluster_addr.clone(),
            reason: e.to_string(),
        };
        let public = match &tls {
            Some(_) => match TcpListener::bind(cluster_addr.as_str()).await {
                Ok(l) => Some(l),
                Err(_) if any_port && attempt < 5 => continue,
                Err(e) => return Err(cluster_error(&e)),
            },
            None => None,
        };
        let server = match tls.as_ref().and_then(|t| t.cluster_acceptor()) {
            Some(acceptor) => ractor_cluster::NodeServer::new(
                0,
                data_dir.identity.cookie.clone(),
                data_dir.identity.node_id.clone(),
                cluster_host,
                Some(ractor_cluster::IncomingEncryptionMode::Tls(
                    acceptor.clone(),
                )),
                Some(ractor_cluster::node::NodeConnectionMode::Isolated),
            )
            .with_listen_addr(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            None => ractor_cluster::NodeServer::new(
                cluster_port,
                data_dir.identity.cookie.clone(),
                data_dir.identity.node_id.clone(),
                cluster_host,
                None,
                Some(ractor_cluster::node::NodeConnectionMode::Transitive),
            ),
        };
        let server = match Actor::spawn(None, server, ()).await {
            Ok((server, _)) => server,
            Err(_) if any_port && attempt < 5 => continue,
            Err(e) => return Err(cluster_error(&e)),
        };
        let accept = match (public, &tls) {
            (Some(listener), Some(tls)) => {
                // Queued after the listener's own port report.
                let _ = server
                    .cast(ractor_cluster::NodeServerMessage::PortChanged { port: cluster_port });
                Some(AbortOnDrop(tokio::spawn(
                    crate::cluster_tls::serve_cluster(listener, tls.clone(), server.clone()),
                )))
            }
            _ => None,
        };
        break (server, cluster_addr, accept);
    };
    let dial = crate::cluster_tls::cluster_dialer(tls.clone(), config.client.connect_timeout.0);
    let joined = if data_dir.joining {
        let info = crate::join::join(
            &cluster_server,
            &config.node.seeds,
            config.cluster.join_timeout.0,
            &dial,
        )
        .await
        .map_err(|e| {
            cluster_server.stop(None);
            StartError::Join(e)
        })?;
        data_dir.adopt(&info)?;
        tracing::info!(cluster = %info.cluster_id, through = %info.node_id, "joined the cluster");
        if let Some(addr) =
            curvine_actors::membership::session_addr(&cluster_server, &info.node_id).await
        {
            if let Err(e) = curvine_actors::membership::remember_join(
                &data_dir.members_file(),
                &info.node_id,
                &addr,
                &info.map,
            ) {
                tracing::warn!(error = %e, "cannot save the node table");
            }
        }
        Some(info)
    } else {
        None
    };
    let cluster = ClusterPort {
        server: cluster_server.clone(),
        addr: cluster_addr,
        accept: cluster_accept,
        dial,
    };
    match start_with(config, data_dir, cluster, joined, tls).await {
        Ok(node) => Ok(node),
        Err(e) => {
            cluster_server.stop(None);
            Err(e)
        }
    }
}

/// Aborts a task when dropped (a listener that must not outlive its node).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The node's cluster port: its ractor_cluster node server, the address
/// it is reached at, the TLS accept task, and how to dial other nodes.
struct ClusterPort {
    server: ActorRef<ractor_cluster::NodeServerMessage>,
    addr: String,
    accept: Option<AbortOnDrop>,
    dial: curvine_actors::membership::Dialer,
}

/// `host:port` with port 0 replaced by a free port (ractor_cluster
/// announces the port it was given, so it must be the real one).
fn resolve_port(addr: &str) -> Result<String, StartError> {
    let (host, port) = split_addr(addr);
    if port != 0 {
        return Ok(addr.to_string());
    }
    // Free on every interface, as the listener binds them all.
    let probe = std::net::TcpListener::bind(("0.0.0.0", 0)).map_err(|e| StartError::Cluster {
        addr: addr.to_string(),
        reason: e.to_string(),
    })?;
    let port = probe
        .local_addr()
        .map_err(|e| StartError::Cluster {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?
        .port();
    Ok(format!("{host}:{port}"))
}

fn split_addr(addr: &str) -> (String, u16) {
    let (host, port) = addr.rsplit_once(':').unwrap_or(("127.0.0.1", "0"));
    (host.to_string(), port.parse().unwrap_or(0))
}

async fn start_with(
    config: &Config,
    data_dir: DataDir,
    cluster: ClusterPort,
    joined: Option<JoinInfo>,
    tls: Option<Arc<Tls>>,
) -> Result<RunningNode, StartError> {
    let ClusterPort {
        server: cluster_server,
        addr: cluster_addr,
        accept: cluster_accept,
        dial,
    } = cluster;
    let identity = data_dir.identity.clone();
    let directory = ShardDirectory::new(identity.shard_count);

    let options = StoreOptions {
        map_size: config.meta.map_size.0,
        max_readers: config.meta.max_readers,
        sync_commit: config.meta.sync_commit,
        wal: config.meta.wal,
        wal_size: config.meta.wal_size.0,
        checkpoint_interval: config.meta.checkpoint_interval.0,
    };
    let identities: Vec<ShardIdentity> = (0..identity.shard_count as ShardId)
        .map(|shard| ShardIdentity {
            cluster_id: identity.cluster_id.clone(),
            shard,
            shard_count: identity.shard_count,
        })
        .collect();
    let paths: Vec<_> = identities
        .iter()
        .map(|i| data_dir.shard_env_path(i.shard))
        .collect();
    // The cluster map: the newest of shard 0's record (when this node holds
    // shard 0), the copy kept with the node table, and what the cluster told
    // a new node. The founder writes the first map.
    let (_, saved_map) = read_members_file(&data_dir.members_file());
    let founder_map = (identity.founder && saved_map.is_none())
        .then(|| ClusterMap::single(&identity.node_id, identity.shard_count));
    let (stores, stored_map) = tokio::task::spawn_blocking(move || {
        let stores = identities
            .iter()
            .zip(paths)
            .map(|(id, path)| ShardStore::open(&path, id, &options).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let stored = stores[0].init_cluster_map(founder_map.as_ref())?;
        Ok::<_, curvine_messages::FsError>((stores, stored))
    })
    .await
    .map_err(|e| StartError::Actors(e.to_string()))?
    .map_err(|e| StartError::Store(e.to_string()))?;
    let map = [stored_map, saved_map, joined.map(|j| j.map)]
        .into_iter()
        .flatten()
        .filter(|m| m.shards.len() == identity.shard_count as usize)
        .max_by_key(|m| m.version)
        .unwrap_or_else(|| ClusterMap {
            version: 0,
            shards: vec![String::new(); identity.shard_count as usize],
        });
    let tracer = Tracer::new(
        identity.node_id.clone(),
        config.trace.ring_events as usize,
        config.trace.sample_rate,
    );
    let metrics = Metrics::new();
    let shard_args: Vec<ShardArgs> = stores
        .into_iter()
        .map(|store| ShardArgs {
            store,
            group_commit_max: config.meta.group_commit_max as usize,
            commit_delay: config.meta.commit_delay.0,
            op_record_ttl: config.meta.op_record_ttl.0,
            write_lease: config.data.write_lease.0,
            tracer: tracer.clone(),
            metrics: metrics.clone(),
        })
        .collect();
    let tiers = node_tiers(config, &data_dir.path, &identity.node_id);
    for t in &tiers {
        tracing::info!(tier = %t.kind, path = %t.root.display(), capacity = %curvine_actors::blocks::human(t.capacity), "storage tier");
    }
    let index_dir = data_dir.path.join("blocks");
    let sync_blocks = config.data.sync_blocks;
    let (block_store, reconciled) =
        tokio::task::spawn_blocking(move || BlockStore::open(&index_dir, tiers, sync_blocks))
            .await
            .map_err(|e| StartError::Actors(e.to_string()))?
            .map_err(|e| StartError::Store(e.to_string()))?;
    tracing::info!(
        blocks = reconciled.blocks,
        missing = reconciled.missing,
        finished = reconciled.finished,
        temporary = reconciled.temporary,
        unindexed = reconciled.unindexed,
        "block store opened"
    );
    let block_store = Arc::new(block_store);

    let data_listen = config.data_listen();
    let data_listener =
        std::net::TcpListener::bind(&data_listen).map_err(|e| StartError::Listen {
            addr: data_listen.clone(),
            reason: e.to_string(),
        })?;
    let data_addr = data_listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or(data_listen);
    let listener =
        TcpListener::bind(&config.node.listen)
            .await
            .map_err(|e| StartError::Listen {
                addr: config.node.listen.clone(),
                reason: e.to_string(),
            })?;
    let rpc_addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| config.node.listen.clone());
    let http_listener = match config.http_listen() {
        Some(addr) => Some(
            std::net::TcpListener::bind(&addr).map_err(|e| StartError::Listen {
                addr: format!("{addr} (http.listen)"),
                reason: e.to_string(),
            })?,
        ),
        None => None,
    };
    let http_addr = http_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string())
        .unwrap_or_default();
    let host_key = curvine_wire::host::host_key();
    let started_ns = now_ns();

    let me = MemberInfo {
        node_id: identity.node_id.clone(),
        cluster_addr: cluster_addr.clone(),
        rpc_addr: rpc_addr.clone(),
        data_addr: data_addr.clone(),
        http_addr,
        host_key: host_key.clone(),
        tiers: block_store.stats(),
        started_ns,
        draining: false,
    };
    let view = ClusterView::new(
        me,
        identity.cluster_id.clone(),
        directory.clone(),
        map,
        config.cluster.node_timeout.0,
        tracer.clone(),
        metrics.clone(),
    );
    let namespace = Namespace::with_cluster(
        view.clone(),
        config.client.request_timeout.0,
        FileDefaults {
            block_size: config.data.block_size.0,
            replicas: config.data.replicas as u16,
            lease_timeout: config.data.write_lease.0,
        },
    );

    let block_ref = BlockManagerRef::default();
    let _ = block_ref.tracer.set(tracer.clone());
    let block_args = BlockArgs {
        store: block_store.clone(),
        namespace: namespace.clone(),
        conf: BlockConf {
            high_watermark: config.data.high_watermark,
            low_watermark: config.data.low_watermark,
            evict_interval: config.data.evict_interval.0,
            orphan_grace: config.data.orphan_grace.0,
            tick: Duration::from_secs(1),
        },
    };
    let data_listener = Arc::new(data_listener);
    let tokens = TokenKey::new(&identity.cookie, config.data.token_ttl.0);
    let data_node = DataNode {
        node_id: identity.node_id.clone(),
        data_addr: data_addr.clone(),
        host_key: host_key.clone(),
    };
    let service_slot: Arc<OnceLock<Weak<Service>>> = Arc::new(OnceLock::new());
    let data_ctx = DataContext {
        store: block_store.clone(),
        manager: block_ref.clone(),
        tokens: tokens.clone(),
        node_id: identity.node_id.clone(),
        host_key,
        service: service_slot.clone(),
        metrics: metrics.clone(),
        tracer: tracer.clone(),
        tls: curvine_wire::tls::for_data_port(&tls),
    };
    let data_args = Arc::new(move || DataServerArgs {
        listener: data_listener.clone(),
        ctx: data_ctx.clone(),
    });

    let policy = RestartPolicy::from(&config.supervisor);
    let recovery_ns = namespace.clone();
    let host_policy = policy.clone();
    let host_view = view.clone();
    let host_metrics = metrics.clone();
    let make_host_args = Arc::new(move || {
        let ns = recovery_ns.clone();
        let view = host_view.clone();
        HostArgs {
            shards: shard_args.clone(),
            directory: directory.clone(),
            policy: host_policy.clone(),
            metrics: host_metrics.clone(),
            on_started: Arc::new(move |shard| {
                // Intents are driven by the node that serves the shard.
                if view.serves(shard) {
                    redrive(ns.clone(), shard);
                }
            }),
        }
    });
    let membership_slot: Arc<parking_lot::RwLock<Option<ActorRef<MembershipMsg>>>> =
        Default::default();
    let recorder = RecorderRef::default();
    let gateway_args = GatewayArgs {
        view: view.clone(),
        service: service_slot.clone(),
        membership: membership_slot.clone(),
        join: JoinInfo {
            cluster_id: identity.cluster_id.clone(),
            cluster_name: identity.cluster_name.clone(),
            shard_count: identity.shard_count,
            meta_layout: identity.meta_layout.clone(),
            map: ClusterMap::default(),
            node_id: identity.node_id.clone(),
        },
        data_dir: data_dir.path.clone(),
        recorder: recorder.clone(),
    };
    let tier_store = block_store.clone();
    let map_ns = namespace.clone();
    let mounts = Mounts::new(&config.ufs, Some(tracer.clone()));
    let mounts_seen = mounts.clone();
    let mounts_behind = (mounts.clone(), namespace.clone());
    let me_id = identity.node_id.clone();
    let membership_args = MembershipArgs {
        view: view.clone(),
        server: cluster_server.clone(),
        dial,
        seeds: config.node.seeds.clone(),
        heartbeat: config.cluster.heartbeat.0,
        members_file: data_dir.members_file(),
        tiers: Arc::new(move || tier_store.stats()),
        on_map_change: Arc::new(move |old, new| {
            for shard in new.shards_of(&me_id) {
                if old.owner(shard) != Some(me_id.as_str()) {
                    tracing::info!(shard, version = new.version, "now serving shard");
                    redrive(map_ns.clone(), shard);
                }
            }
        }),
        mounts_version: Arc::new(move || mounts_seen.version()),
        on_mounts_behind: Arc::new(move |_| {
            refresh_mounts(mounts_behind.0.clone(), mounts_behind.1.clone());
        }),
    };
    // Names carry the node id: several nodes may share a process (tests).
    let (supervisor, supervisor_done) = Actor::spawn(
        Some(format!("node-{}", identity.node_id)),
        NodeSupervisor,
        NodeArgs {
            make_host_args,
            block_args,
            block_ref: block_ref.clone(),
            data_args,
            gateway_args,
            membership_args,
            loader_args: crate::persist::UfsLoaderArgs {
                service: service_slot.clone(),
                tick: Duration::from_millis(500),
                sweep: config.ufs.persist_sweep.0,
                loaders: config.ufs.loaders as usize,
                retry_delay: config.ufs.persist_retry_delay.0,
                retry_max: config.ufs.persist_max_delay.0,
                metrics: metrics.clone(),
            },
            tracer: tracer.clone(),
            recorder: recorder.clone(),
            policy,
            metrics: metrics.clone(),
        },
    )
    .await
    .map_err(|e| StartError::Actors(e.to_string()))?;

    let service = Arc::new(Service {
        namespace,
        view,
        info: NodeInfo {
            cluster_id: identity.cluster_id.clone(),
            node_id: identity.node_id.clone(),
            rpc_addr: rpc_addr.clone(),
            cluster_addr: cluster_addr.clone(),
            data_dir: data_dir.path.display().to_string(),
            started_ns,
        },
        blocks: block_store,
        manager: block_ref,
        clients: curvine_wire::cookie::ClientKey::new(&identity.cookie),
        tokens,
        data: data_node,
        pool: curvine_wire::data::DataPool::new(
            config.client.connect_timeout.0,
            config.client.request_timeout.0,
            curvine_wire::tls::for_data_port(&tls),
        ),
        membership: membership_slot,
        moves: tokio::sync::Mutex::new(()),
        mounts: mounts.clone(),
        recorder,
        root: supervisor.get_cell(),
    });
    refresh_mounts(mounts, service.namespace.clone());
    let _ = service_slot.set(Arc::downgrade(&service));
    let http = match http_listener {
        Some(l) => Some(
            crate::http::serve_node(l, service.clone(), &config.http.token).map_err(|e| {
                StartError::Listen {
                    addr: "http.listen".into(),
                    reason: e.to_string(),
                }
            })?,
        ),
        None => None,
    };
    let server = tokio::spawn(crate::server::serve(listener, service.clone(), tls.clone()));
    let replicator = tokio::spawn(replicate_loop(
        Arc::downgrade(&service),
        config.cluster.rereplicate_after.0,
    ));
    Ok(RunningNode {
        data_dir,
        supervisor,
        supervisor_done,
        service,
        rpc_addr,
        cluster_addr,
        data_addr,
        http,
        server,
        replicator,
        cluster_server: Some(cluster_server),
        _cluster_accept: cluster_accept,
    })
}

/// Periodically gives blocks of the shards this node serves their replicas
/// back (see `Service::rereplicate`).
async fn replicate_loop(service: Weak<Service>, after: Duration) {
    let period = (after / 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        tokio::time::sleep(period).await;
        let Some(service) = service.upgrade() else {
            return;
        };
        match service.rereplicate(after).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(blocks = n, "replicas restored"),
            Err(e) => tracing::debug!(error = %e, "re-replication pass stopped early"),
        }
    }
}

/// Fetches the mount table from shard 0 in a task (retrying while shard
/// 0 cannot be reached yet); one refresh runs at a time.
fn refresh_mounts(mounts: Arc<Mounts>, ns: Arc<Namespace>) {
    if !mounts.begin_refresh() {
        return;
    }
    tokio::spawn(async move {
        let mut delay = Duration::from_millis(100);
        for _ in 0..30 {
            match mounts.refresh(&ns).await {
                Ok(t) => {
                    tracing::debug!(
                        version = t.version,
                        mounts = t.mounts.len(),
                        "mount table loaded"
                    );
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "loading the mount table; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        mounts.end_refresh();
    });
}

/// Drives the intents a shard recorded, in a task.
fn redrive(ns: Arc<Namespace>, shard: ShardId) {
    tokio::spawn(async move {
        match ns.redrive(shard).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(shard, intents = n, "recovered pending operations"),
            Err(e) => {
                tracing::error!(shard, error = %e, "recovering pending operations failed")
            }
        }
    });
}

impl RunningNode {
    /// Stops accepting requests, stops the actors (every queued mutation is
    /// committed first) and releases the data directory.
    pub async fn stop(self) {
        self.server.abort();
        self.replicator.abort();
        if let Some(http) = &self.http {
            http.stop();
        }
        if let Some(server) = &self.cluster_server {
            server.stop(None);
        }
        let _ = self
            .supervisor
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
            .await;
        // A clean stop leaves no metadata log to apply at the next start.
        let _ = tokio::task::spawn_blocking(curvine_actors::wal::checkpoint_all).await;
    }
}

/// The configured tiers, or the default: a MEM tier in /dev/shm sized to a
/// quarter of memory (at most half of /dev/shm); an HDD tier in the data
/// directory where there is no /dev/shm.
pub fn node_tiers(config: &Config, data_dir: &std::path::Path, node_id: &str) -> Vec<TierInfo> {
    let configured = config.tiers();
    if !configured.is_empty() {
        return configured
            .into_iter()
            .map(|t| TierInfo {
                kind: TierKind::parse(&t.kind).unwrap_or(TierKind::Hdd),
                root: t.path,
                capacity: t.capacity,
            })
            .collect();
    }
    let shm = std::path::Path::new("/dev/shm");
    match fs_size(shm) {
        Some((total, _)) => {
            // SAFETY: sysconf has no preconditions.
            let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) }.max(0) as u64;
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
            let memory = pages * page;
            let capacity = (memory / 4).min(total / 2).max(64 << 20);
            vec![TierInfo {
                kind: TierKind::Mem,
                root: shm.join("curvine").join(node_id),
                capacity,
            }]
        }
        None => {
            let root = data_dir.join("tier-hdd");
            let free = fs_size(data_dir).map(|(_, free)| free).unwrap_or(1 << 30);
            vec![TierInfo {
                kind: TierKind::Hdd,
                root,
                capacity: (free / 2).max(64 << 20),
            }]
        }
    }
}

/// Total and free bytes of the file system holding `path`.
pub fn fs_size(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

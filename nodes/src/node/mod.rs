//! Starting and stopping a node, in this order, each step built from what
//! the steps before it made (nothing refers back to a later step):
//!
//! 1. the data directory and the cluster port ([`cluster`]); a new node
//!    with seeds joins their cluster;
//! 2. the metadata and block stores ([`stores`]) and the ports' sockets;
//! 3. the stable handles of the actors (empty until they start), the
//!    cluster view, the namespace router and the mount table;
//! 4. the service's subsystems (`crate::service`);
//! 5. the supervision tree ([`tree`]), which starts every actor and task;
//! 6. the HTTP port, and the ready file ([`ready`]).

pub mod cluster;
pub mod error;
pub mod ready;
pub mod stores;
pub mod tree;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};

use curvine_actors::blocks::{BlockArgs, BlockConf, BlockManagerRef, BlockStore};
use curvine_actors::cluster::ClusterView;
use curvine_actors::host::{HostArgs, ShardDirectory};
use curvine_actors::membership::{MembershipArgs, MembershipMsg};
use curvine_actors::mounts::Mounts;
use curvine_actors::namespace::{FileDefaults, Namespace};
use curvine_actors::shard::ShardArgs;
use curvine_actors::stats::Metrics;
use curvine_actors::supervisor::{RestartPolicy, Slot, Supervisor, SupervisorMsg};
use curvine_actors::token::TokenKey;
use curvine_actors::trace::{RecorderRef, Tracer};
use curvine_conf::Config;
use curvine_messages::block::DataNode;
use curvine_messages::cluster::{ClusterMap, JoinInfo, MemberInfo};
use curvine_messages::now_ns;
use curvine_wire::cookie::ClientKey;
use curvine_wire::data::DataPool;
use curvine_wire::tls::{for_data_port, Tls};

use crate::data_port::DataContext;
use crate::gateway::GatewayArgs;
use crate::http::HttpHandle;
use crate::identity::DataDir;
use crate::keeper::{redrive, ShardKeeper};
use crate::raft_net::{RaftInboxes, RaftNet};
use crate::service::loader::UfsLoaderArgs;
use crate::service::{Core, NodeInfo, Service, Subsystems};
use cluster::ClusterPort;
pub use error::StartError;
use ready::Ready;
use stores::MetaStores;
pub use stores::{fs_size, node_tiers};
use tree::TreeParts;

/// A running node.
pub struct RunningNode {
    pub data_dir: DataDir,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub supervisor_done: tokio::task::JoinHandle<()>,
    /// What this node knows of the cluster.
    pub view: Arc<ClusterView>,
    pub blocks: Arc<BlockStore>,
    pub rpc_addr: String,
    pub cluster_addr: String,
    pub data_addr: String,
    /// The HTTP port (dashboard, API, metrics), unless `http.listen = "off"`.
    pub http: Option<HttpHandle>,
    /// The S3 gateway's address; empty when `s3.listen = "off"`.
    pub s3_addr: String,
    cluster_server: ActorRef<ractor_cluster::NodeServerMessage>,
    /// The metadata environments, closed with a checkpoint at a clean stop.
    engines: Vec<Arc<curvine_actors::engine::Engine>>,
}

/// Starts a node with `config`: opens (or formats) the data directory, joins
/// the cluster of its seeds when the directory is new, starts the
/// supervision tree (actors, ports, background tasks) and the HTTP port,
/// and writes the ready file.
pub async fn start(config: &Config) -> Result<RunningNode, StartError> {
    crate::ports::raise_open_files(config.node.max_connections);
    let tls = Tls::from_conf(&config.tls, true).map_err(|e| StartError::Tls(e.to_string()))?;
    let mut data_dir = DataDir::open(&config.data_dir(), config)?;
    let cluster_port = cluster::open(config, &data_dir, &tls).await?;
    let server = cluster_port.server.clone();
    let started = async {
        let joined = match data_dir.joining {
            true => Some(cluster::join(config, &cluster_port, &mut data_dir).await?),
            false => None,
        };
        start_with(config, data_dir, cluster_port, joined, tls).await
    };
    match started.await {
        Ok(node) => Ok(node),
        Err(e) => {
            server.stop(None);
            Err(e)
        }
    }
}

/// The sockets of the client, data and HTTP ports.
struct Listeners {
    client: Arc<TcpListener>,
    client_addr: String,
    data: Arc<TcpListener>,
    data_addr: String,
    http: Option<TcpListener>,
    http_addr: String,
    /// The S3 gateway's socket, when `s3.listen` is set.
    s3: Option<Arc<TcpListener>>,
    s3_addr: String,
}

fn bind(addr: &str, what: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).map_err(|e| StartError::Listen {
        addr: format!("{addr}{what}"),
        reason: e.to_string(),
    })
}

fn bind_ports(config: &Config) -> Result<Listeners, StartError> {
    let local = |l: &TcpListener, or: &str| {
        l.local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| or.to_string())
    };
    let data_listen = config.data_listen();
    let data = bind(&data_listen, "")?;
    let client = bind(&config.node.listen, "")?;
    let http = match config.http_listen() {
        Some(addr) => Some(bind(&addr, " (http.listen)")?),
        None => None,
    };
    let s3 = match config.s3.listen.as_str() {
        "off" => None,
        addr => Some(Arc::new(bind(addr, " (s3.listen)")?)),
    };
    Ok(Listeners {
        s3_addr: s3.as_ref().map(|l| local(l, "")).unwrap_or_default(),
        s3,
        client_addr: local(&client, &config.node.listen),
        data_addr: local(&data, &data_listen),
        http_addr: http.as_ref().map(|l| local(l, "")).unwrap_or_default(),
        client: Arc::new(client),
        data: Arc::new(data),
        http,
    })
}

/// The stable handles of the node's actors: empty until the supervision
/// tree starts them, pointed at each new incarnation after a restart.
struct Handles {
    directory: ShardDirectory,
    block_ref: BlockManagerRef,
    membership: Slot<MembershipMsg>,
    recorder: RecorderRef,
}

async fn start_with(
    config: &Config,
    data_dir: DataDir,
    cluster: ClusterPort,
    joined: Option<JoinInfo>,
    tls: Option<Arc<Tls>>,
) -> Result<RunningNode, StartError> {
    let identity = data_dir.identity.clone();
    let meta = stores::open_meta(config, &data_dir, joined).await?;
    let blocks = stores::open_blocks(config, &data_dir).await?;
    let ports = bind_ports(config)?;
    let metrics = Metrics::new();
    let tracer = Tracer::new(
        identity.node_id.clone(),
        config.trace.ring_events as usize,
        config.trace.sample_rate,
    );
    let handles = Handles {
        directory: ShardDirectory::new(identity.shard_count),
        block_ref: BlockManagerRef::default(),
        membership: Slot::new("membership"),
        recorder: RecorderRef::default(),
    };
    let _ = handles.block_ref.tracer.set(tracer.clone());
    let started_ns = now_ns();
    let host_key = curvine_wire::host::host_key();
    let me = MemberInfo {
        node_id: identity.node_id.clone(),
        cluster_addr: cluster.addr.clone(),
        rpc_addr: ports.client_addr.clone(),
        data_addr: ports.data_addr.clone(),
        http_addr: ports.http_addr.clone(),
        host_key: host_key.clone(),
        tiers: blocks.stats(),
        started_ns,
        draining: false,
    };
    let view = ClusterView::new(
        me,
        identity.cluster_id.clone(),
        handles.directory.clone(),
        meta.map.clone(),
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
    let core = Core {
        info: NodeInfo {
            cluster_id: identity.cluster_id.clone(),
            node_id: identity.node_id.clone(),
            rpc_addr: ports.client_addr.clone(),
            cluster_addr: cluster.addr.clone(),
            data_addr: ports.data_addr.clone(),
            data_dir: data_dir.path.display().to_string(),
            started_ns,
        },
        namespace,
        view,
        mounts: Mounts::new(&config.ufs, Some(tracer.clone())),
        blocks: blocks.clone(),
        manager: handles.block_ref.clone(),
        membership: handles.membership.clone(),
        recorder: handles.recorder.clone(),
        tokens: TokenKey::new(&identity.cookie, config.data.token_ttl.0),
        clients: ClientKey::new(&identity.cookie),
        data: DataNode {
            node_id: identity.node_id.clone(),
            data_addr: ports.data_addr.clone(),
            host_key,
        },
        pool: DataPool::new(
            config.client.connect_timeout.0,
            config.client.request_timeout.0,
            for_data_port(&tls),
        ),
        // Names carry the node id: several nodes may share a process (tests).
        root: format!("node-{}", identity.node_id),
        pending_replicas: config.ufs.pending_replicas,
        meta_replicas: config.meta.replicas,
        history_interval: config.http.history_interval.0,
    };
    let raft = start_writers(config, &meta.stores, &core.view);
    let engines = meta.engines.clone();
    let subsystems = Subsystems::build(&core);
    let service = Arc::new(Service::new(&core, &subsystems));
    let parts = tree_parts(
        config,
        &data_dir,
        &cluster,
        meta,
        &ports,
        &handles,
        &core,
        &subsystems,
        service.clone(),
        &tls,
        (metrics, tracer),
        raft,
    );
    let (supervisor, supervisor_done) = Actor::spawn(
        Some(core.root.clone()),
        Supervisor,
        tree::node_supervisor(parts),
    )
    .await
    .map_err(|e| StartError::Actors(e.to_string()))?;
    refresh_mounts(core.mounts.clone(), core.namespace.clone());
    let mut node = RunningNode {
        data_dir,
        supervisor,
        supervisor_done,
        view: core.view.clone(),
        blocks,
        rpc_addr: ports.client_addr,
        cluster_addr: cluster.addr,
        data_addr: ports.data_addr,
        http: None,
        s3_addr: ports.s3_addr.clone(),
        cluster_server: cluster.server,
        engines,
    };
    // What fails from here stops what started.
    let finished =
        serve_http(ports.http, service, &subsystems, &node.view, config).and_then(|http| {
            node.http = http;
            node.ready().write(&node.data_dir.path).map_err(|e| {
                StartError::Actors(format!(
                    "cannot write {} in {}: {e}",
                    ready::READY_FILE,
                    node.data_dir.path.display()
                ))
            })
        });
    match finished {
        Ok(_) => Ok(node),
        Err(e) => {
            node.stop().await;
            Err(e)
        }
    }
}

/// The shards' writers, started with the net their groups reach other
/// nodes through, before any shard actor asks for one.
fn start_writers(
    config: &Config,
    stores: &[Arc<curvine_actors::store::ShardStore>],
    view: &Arc<ClusterView>,
) -> Arc<RaftInboxes> {
    let raft = Arc::new(RaftInboxes::new(
        stores,
        config.meta.group_commit_max as usize,
        config.meta.commit_delay.0,
        Arc::new(RaftNet::new(view.clone())),
        may_found(config, view),
    ));
    view.set_boards(raft.boards());
    raft
}

/// With replicated shards (`meta.replicas` > 1) a node starts a shard's
/// group only when the map names it the shard's one node (a new cluster's
/// founder); every other member joins the group its leader adds it to.
fn may_found(
    config: &Config,
    view: &Arc<ClusterView>,
) -> Option<curvine_actors::replica::MayFound> {
    if config.meta.replicas <= 1 {
        return None;
    }
    let view = view.clone();
    Some(Arc::new(move |shard| {
        let map = view.map();
        !map.replicated(shard) && map.owner(shard) == Some(view.node_id.as_str())
    }))
}

/// The HTTP port on its socket, when there is one.
fn serve_http(
    listener: Option<TcpListener>,
    service: Arc<Service>,
    s: &Subsystems,
    view: &Arc<ClusterView>,
    config: &Config,
) -> Result<Option<HttpHandle>, StartError> {
    let Some(listener) = listener else {
        return Ok(None);
    };
    let (reports, history) = (s.reports.clone(), s.history.clone());
    crate::http::serve_node(
        listener,
        service,
        (reports, history),
        view.clone(),
        &config.http.token,
    )
    .map(Some)
    .map_err(|e| StartError::Listen {
        addr: "http.listen".into(),
        reason: e.to_string(),
    })
}

/// The S3 gateway: its client reaches the cluster through this node's
/// client port, with the cluster's cookie.
fn s3_gateway(config: &Config, cookie: &str, ports: &Listeners) -> curvine_s3::Gateway {
    curvine_s3::Gateway::new(curvine_s3::GatewayConf::for_node(
        config,
        &ports.client_addr,
        cookie,
    ))
}

/// The children of the node's supervision tree, from what the start made.
#[allow(clippy::too_many_arguments)]
fn tree_parts(
    config: &Config,
    data_dir: &DataDir,
    cluster: &ClusterPort,
    meta: MetaStores,
    ports: &Listeners,
    handles: &Handles,
    core: &Core,
    s: &Subsystems,
    service: Arc<Service>,
    tls: &Option<Arc<Tls>>,
    (metrics, tracer): (Metrics, Tracer),
    raft: Arc<RaftInboxes>,
) -> TreeParts {
    let policy = RestartPolicy::from(&config.supervisor);
    let identity = &data_dir.identity;
    let shards: Vec<ShardArgs> = meta
        .stores
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
    let (ns, view) = (core.namespace.clone(), core.view.clone());
    TreeParts {
        policy: policy.clone(),
        metrics: metrics.clone(),
        tracer: tracer.clone(),
        recorder: handles.recorder.clone(),
        host: HostArgs {
            shards,
            directory: handles.directory.clone(),
            policy,
            metrics: metrics.clone(),
            // Intents are driven by the node that serves the shard (of a
            // replicated one, the shard keeper has its leader drive them).
            on_started: Arc::new(move |shard| {
                if view.serves_now(shard) {
                    redrive(ns.clone(), shard);
                }
            }),
        },
        blocks: BlockArgs {
            store: core.blocks.clone(),
            namespace: core.namespace.clone(),
            conf: BlockConf {
                high_watermark: config.data.high_watermark,
                low_watermark: config.data.low_watermark,
                evict_interval: config.data.evict_interval.0,
                orphan_grace: config.data.orphan_grace.0,
                freed_grace: config.data.freed_grace.0,
                read_hold_max: config.data.read_hold_max.0,
                upload_wait: config.data.upload_wait.0,
                tick: Duration::from_secs(1),
            },
            policy: RestartPolicy::from(&config.supervisor),
        },
        block_ref: handles.block_ref.clone(),
        data: (
            ports.data.clone(),
            DataContext {
                store: core.blocks.clone(),
                manager: handles.block_ref.clone(),
                tokens: core.tokens.clone(),
                node_id: identity.node_id.clone(),
                host_key: core.data.host_key.clone(),
                fills: s.fills.clone(),
                metrics: metrics.clone(),
                tracer: tracer.clone(),
                tls: for_data_port(tls),
            },
        ),
        gateway: GatewayArgs {
            view: core.view.clone(),
            membership: handles.membership.clone(),
            join: JoinInfo {
                cluster_id: identity.cluster_id.clone(),
                cluster_name: identity.cluster_name.clone(),
                shard_count: identity.shard_count,
                meta_layout: identity.meta_layout.clone(),
                map: ClusterMap::default(),
                node_id: identity.node_id.clone(),
            },
            data_dir: data_dir.path.clone(),
            recorder: handles.recorder.clone(),
            manager: handles.block_ref.clone(),
            read_holds: core.blocks.holds.clone(),
            reports: s.reports.clone(),
            replicas: s.replicas.clone(),
            loads: s.loads.clone(),
            scrub: s.scrub.clone(),
            raft: raft.clone(),
        },
        membership: (
            membership_args(config, data_dir, cluster, core),
            handles.membership.clone(),
        ),
        s3: ports
            .s3
            .clone()
            .map(|listener| (listener, s3_gateway(config, &identity.cookie, ports))),
        loader: UfsLoaderArgs {
            persist: s.persist.clone(),
            loads: s.loads.clone(),
            tick: Duration::from_millis(500),
            sweep: config.ufs.persist_sweep.0,
            loaders: config.ufs.loaders as usize,
            retry_delay: config.ufs.persist_retry_delay.0,
            retry_max: config.ufs.persist_max_delay.0,
            metrics,
        },
        cluster_tls: match (&cluster.tls_listener, tls) {
            (Some(l), Some(t)) => Some((l.clone(), t.clone(), cluster.server.clone())),
            _ => None,
        },
        client: (
            ports.client.clone(),
            service,
            tls.clone(),
            config.node.max_connections,
        ),
        replicas: (s.replicas.clone(), config.cluster.rereplicate_after.0),
        history: (s.history.clone(), s.reports.clone()),
        keeper: Arc::new(ShardKeeper {
            view: core.view.clone(),
            namespace: core.namespace.clone(),
            raft: raft.clone(),
            membership: handles.membership.clone(),
            replicas: config.meta.replicas,
            rereplicate_after: config.cluster.rereplicate_after.0,
            handovers: Default::default(),
        }),
    }
}

/// Membership's arguments: it re-drives the intents of shards this node
/// starts serving, and reloads the mount table when a heartbeat says it is
/// behind.
fn membership_args(
    config: &Config,
    data_dir: &DataDir,
    cluster: &ClusterPort,
    core: &Core,
) -> MembershipArgs {
    let tier_store = core.blocks.clone();
    let map_ns = core.namespace.clone();
    let mounts_seen = core.mounts.clone();
    let mounts_behind = (core.mounts.clone(), core.namespace.clone());
    let me_id = core.info.node_id.clone();
    MembershipArgs {
        view: core.view.clone(),
        server: cluster.server.clone(),
        dial: cluster.dial.clone(),
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

impl RunningNode {
    /// What the ready file says of this node.
    pub fn ready(&self) -> Ready {
        Ready {
            node_id: self.data_dir.identity.node_id.clone(),
            cluster_id: self.data_dir.identity.cluster_id.clone(),
            pid: std::process::id(),
            client_addr: self.rpc_addr.clone(),
            cluster_addr: self.cluster_addr.clone(),
            data_addr: self.data_addr.clone(),
            http_addr: self
                .http
                .as_ref()
                .map(|h| h.addr.clone())
                .unwrap_or_default(),
            s3_addr: self.s3_addr.clone(),
            started_ns: self.view.me().started_ns,
        }
    }

    /// Stops accepting requests, stops the actors (every queued mutation is
    /// committed first; the client port stops first, the shards last) and
    /// releases the data directory.
    pub async fn stop(self) {
        Ready::remove(&self.data_dir.path);
        if let Some(http) = &self.http {
            http.stop();
        }
        self.cluster_server.stop(None);
        let _ = self
            .supervisor
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
            .await;
        // A clean stop leaves no metadata log to apply at the next start.
        let engines = self.engines;
        let _ = tokio::task::spawn_blocking(move || engines.iter().for_each(|e| e.close())).await;
    }
}

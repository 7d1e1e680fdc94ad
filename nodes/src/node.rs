//! Node assembly: the root supervisor, the client port and the cluster port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::net::TcpListener;

use curvine_actors::host::{HostArgs, ShardDirectory, ShardHost};
use curvine_actors::namespace::Namespace;
use curvine_actors::shard::ShardArgs;
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_actors::supervisor::{RestartPolicy, RestartTracker};
use curvine_conf::Config;
use curvine_messages::{now_ns, ShardId};

use crate::identity::DataDir;
use crate::service::{NodeInfo, Service};

/// Root of the node's supervision tree. Restarts a failed child with backoff;
/// when a child fails too often it fails itself, which stops the node.
pub struct NodeSupervisor;

pub struct NodeArgs {
    pub make_host_args: Arc<dyn Fn() -> HostArgs + Send + Sync>,
    pub policy: RestartPolicy,
}

pub enum NodeMsg {
    RestartShardHost,
}

impl ractor::Message for NodeMsg {}

pub struct NodeState {
    args: NodeArgs,
    host: Option<ActorRef<curvine_actors::host::HostMsg>>,
    tracker: RestartTracker,
}

impl NodeSupervisor {
    async fn start_host(
        myself: &ActorRef<NodeMsg>,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let (host, _) = Actor::spawn_linked(
            Some("shard-host".into()),
            ShardHost,
            (state.args.make_host_args)(),
            myself.get_cell(),
        )
        .await?;
        state.host = Some(host);
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
        let mut state = NodeState {
            args,
            host: None,
            tracker: RestartTracker::default(),
        };
        Self::start_host(&myself, &mut state).await?;
        Ok(state)
    }

    async fn post_stop(
        &self,
        myself: ActorRef<NodeMsg>,
        _state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
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
        match message {
            NodeMsg::RestartShardHost => Self::start_host(&myself, state).await?,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<NodeMsg>,
        event: SupervisionEvent,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(cell, error) = event {
            if state
                .host
                .as_ref()
                .is_some_and(|h| h.get_id() == cell.get_id())
            {
                state.host = None;
                tracing::error!(error = %error, "shard host failed");
                match state.tracker.on_failure(&state.args.policy, Instant::now()) {
                    Some(delay) => {
                        myself.send_after(delay, || NodeMsg::RestartShardHost);
                    }
                    None => {
                        return Err(format!("shard host keeps failing; last error: {error}").into())
                    }
                }
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
    server: tokio::task::JoinHandle<()>,
    cluster_server: Option<ActorRef<ractor_cluster::NodeServerMessage>>,
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
}

/// Starts a node with `config`: opens (or formats) the data directory,
/// starts the supervision tree, the client port and the cluster port.
pub async fn start(config: &Config) -> Result<RunningNode, StartError> {
    let data_dir = DataDir::open(&config.data_dir(), config)?;
    let identity = data_dir.identity.clone();
    let directory = ShardDirectory::new(identity.shard_count);
    let namespace = Namespace::new(directory.clone(), config.client.request_timeout.0);

    let options = StoreOptions {
        map_size: config.meta.map_size.0,
        max_readers: config.meta.max_readers,
        sync_commit: config.meta.sync_commit,
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
    let stores = tokio::task::spawn_blocking(move || {
        identities
            .iter()
            .zip(paths)
            .map(|(id, path)| ShardStore::open(&path, id, &options).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| StartError::Actors(e.to_string()))?
    .map_err(|e| StartError::Store(e.to_string()))?;
    let shard_args: Vec<ShardArgs> = stores
        .into_iter()
        .map(|store| ShardArgs {
            store,
            group_commit_max: config.meta.group_commit_max as usize,
            commit_delay: config.meta.commit_delay.0,
            op_record_ttl: config.meta.op_record_ttl.0,
        })
        .collect();
    let policy = RestartPolicy::from(&config.supervisor);
    let recovery_ns = namespace.clone();
    let host_policy = policy.clone();
    let make_host_args = Arc::new(move || {
        let ns = recovery_ns.clone();
        HostArgs {
            shards: shard_args.clone(),
            directory: directory.clone(),
            policy: host_policy.clone(),
            on_started: Arc::new(move |shard| {
                let ns = ns.clone();
                tokio::spawn(async move {
                    match ns.redrive(shard).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(shard, intents = n, "recovered pending operations"),
                        Err(e) => {
                            tracing::error!(shard, error = %e, "recovering pending operations failed")
                        }
                    }
                });
            }),
        }
    });
    let (supervisor, supervisor_done) = Actor::spawn(
        Some("node".into()),
        NodeSupervisor,
        NodeArgs {
            make_host_args,
            policy,
        },
    )
    .await
    .map_err(|e| StartError::Actors(e.to_string()))?;

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

    let cluster_addr = config.cluster_listen();
    let (host, port) = cluster_addr.rsplit_once(':').unwrap_or(("127.0.0.1", "0"));
    let port: u16 = port.parse().unwrap_or(0);
    let cluster_server = ractor_cluster::NodeServer::new(
        port,
        identity.cookie.clone(),
        identity.node_id.clone(),
        host.to_string(),
        None,
        Some(ractor_cluster::node::NodeConnectionMode::Transitive),
    );
    let cluster_server = match Actor::spawn(None, cluster_server, ()).await {
        Ok((server, _)) => Some(server),
        Err(e) => {
            return Err(StartError::Cluster {
                addr: cluster_addr,
                reason: e.to_string(),
            })
        }
    };

    let service = Arc::new(Service {
        namespace,
        info: NodeInfo {
            cluster_id: identity.cluster_id.clone(),
            node_id: identity.node_id.clone(),
            rpc_addr: rpc_addr.clone(),
            cluster_addr: cluster_addr.clone(),
            data_dir: data_dir.path.display().to_string(),
            started_ns: now_ns(),
        },
    });
    let server = tokio::spawn(crate::server::serve(listener, service.clone()));
    Ok(RunningNode {
        data_dir,
        supervisor,
        supervisor_done,
        service,
        rpc_addr,
        cluster_addr,
        server,
        cluster_server,
    })
}

impl RunningNode {
    /// Stops accepting requests, stops the actors (every queued mutation is
    /// committed first) and releases the data directory.
    pub async fn stop(self) {
        self.server.abort();
        if let Some(server) = &self.cluster_server {
            server.stop(None);
        }
        let _ = self
            .supervisor
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
            .await;
    }
}

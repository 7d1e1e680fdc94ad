//! `Membership`: keeps this node in its cluster.
//!
//! Every `cluster.heartbeat` it sends a [`Heartbeat`] (who it is, its tiers,
//! its cluster map, the nodes it knows) to the gateway of every connected
//! node, marks nodes silent for `cluster.node_timeout` as down, and dials
//! the seeds and every known node it is not connected to, with backoff.
//! ractor_cluster neither reconnects nor tells a failed authentication from
//! a lost link, so both are done here: a session that closes before it
//! authenticated is reported as a refused cookie, on both sides.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef};
use ractor_cluster::node::{NodeEventSubscription, NodeServerSessionInformation};
use ractor_cluster::NodeServerMessage;
use serde::{Deserialize, Serialize};

use curvine_messages::block::TierStats;
use curvine_messages::cluster::{ClusterMap, Heartbeat, MemberState, PeerMsg};
use curvine_messages::now_ns;

use crate::cluster::{gateway_of, ClusterView};
use crate::supervisor::Slot;

/// Opens a cluster connection to a node's cluster port (`host:port`):
/// plain, or TLS when the node is configured for it. The session is
/// handed to the given `NodeServer`; the handshake goes on from there.
pub type Dialer = Arc<
    dyn Fn(
            ActorRef<NodeServerMessage>,
            String,
        ) -> futures::future::BoxFuture<'static, Result<(), String>>
        + Send
        + Sync,
>;

/// Dials plain TCP (ractor_cluster's own connect).
pub fn plain_dialer() -> Dialer {
    Arc::new(|server, addr| {
        Box::pin(async move {
            ractor_cluster::client_connect(&server, addr.as_str())
                .await
                .map_err(|e| format!("{e:?}"))
        })
    })
}

/// Called with the old and the new map when a newer map is adopted.
pub type OnMapChange = Arc<dyn Fn(&ClusterMap, &ClusterMap) + Send + Sync>;

pub struct Membership;

#[derive(Clone)]
pub struct MembershipArgs {
    pub view: Arc<ClusterView>,
    pub server: ActorRef<NodeServerMessage>,
    /// How to open a connection to another node.
    pub dial: Dialer,
    /// Cluster addresses to dial (the seeds).
    pub seeds: Vec<String>,
    pub heartbeat: Duration,
    /// Where the known nodes and the last map are kept across restarts.
    pub members_file: PathBuf,
    /// This node's tiers right now.
    pub tiers: Arc<dyn Fn() -> Vec<TierStats> + Send + Sync>,
    pub on_map_change: OnMapChange,
    /// The version of the mount table this node holds.
    pub mounts_version: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// Called when a heartbeat carries a newer mount table version.
    pub on_mounts_behind: Arc<dyn Fn(u64) + Send + Sync>,
}

/// What ractor_cluster reported about a session.
#[derive(Debug)]
pub enum SessionEvent {
    Opened,
    Authenticated,
    Disconnected,
}

pub enum MembershipMsg {
    Tick,
    /// A heartbeat another node sent (through this node's gateway).
    Heard(Box<Heartbeat>),
    Session {
        event: SessionEvent,
        session: ActorId,
        peer_name: Option<String>,
        peer_addr: String,
        incoming: bool,
    },
    /// This node is leaving the cluster for good (decommissioned).
    Leave,
}

impl ractor::Message for MembershipMsg {}

/// Tells the other nodes at once (a heartbeat) that something they cache
/// changed: the cluster map or the mount table.
pub fn announce(membership: &Slot<MembershipMsg>) {
    if let Some(m) = membership.current() {
        let _ = m.cast(MembershipMsg::Tick);
    }
}

/// The node table as kept in the data directory.
#[derive(Debug, Default, Serialize, Deserialize)]
struct MembersFile {
    #[serde(default)]
    nodes: Vec<KnownNode>,
    #[serde(default)]
    map_version: u64,
    #[serde(default)]
    map: Vec<String>,
    #[serde(default)]
    followers: Vec<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KnownNode {
    node_id: String,
    cluster_addr: String,
}

/// Reads the nodes and map kept by a previous run (empty when absent).
pub fn read_members_file(path: &std::path::Path) -> (Vec<(String, String)>, Option<ClusterMap>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return (Vec::new(), None);
    };
    match toml::from_str::<MembersFile>(&text) {
        Ok(f) => {
            let map = (f.map_version > 0).then_some(ClusterMap {
                version: f.map_version,
                shards: f.map,
                followers: f.followers,
            });
            (
                f.nodes
                    .into_iter()
                    .map(|n| (n.node_id, n.cluster_addr))
                    .collect(),
                map,
            )
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable members file");
            (Vec::new(), None)
        }
    }
}

/// Writes a node table holding one member and the map it gave, for a node
/// that just joined: should the node fail before its Membership saves the
/// table (a port taken, say), a restart without seeds still finds its
/// cluster. Leaves an existing table alone.
pub fn remember_join(
    path: &std::path::Path,
    node_id: &str,
    cluster_addr: &str,
    map: &ClusterMap,
) -> std::io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    let file = MembersFile {
        nodes: vec![KnownNode {
            node_id: node_id.to_string(),
            cluster_addr: cluster_addr.to_string(),
        }],
        map_version: map.version,
        map: map.shards.clone(),
        followers: map.followers.clone(),
    };
    write_members_file(path, &file)
}

/// Writes the node table by rename, so a crash never leaves half of it.
fn write_members_file(path: &std::path::Path, file: &MembersFile) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let text = toml::to_string(file).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The cluster address node `node_id` announced on its session with this
/// node's server, if it has one.
pub async fn session_addr(server: &ActorRef<NodeServerMessage>, node_id: &str) -> Option<String> {
    let sessions = ractor::call_t!(server, NodeServerMessage::GetSessions, 1000).ok()?;
    sessions.values().find_map(|s| {
        s.peer_name
            .as_ref()
            .filter(|n| node_of(&n.name) == node_id)
            .map(|n| n.connection_string.clone())
    })
}

struct Subscription(ActorRef<MembershipMsg>);

impl Subscription {
    fn send(&self, event: SessionEvent, ses: &NodeServerSessionInformation) {
        let _ = self.0.cast(MembershipMsg::Session {
            event,
            session: ses.actor.get_id(),
            peer_name: ses.peer_name.as_ref().map(|n| n.name.clone()),
            peer_addr: ses.peer_addr.clone(),
            incoming: ses.is_server,
        });
    }
}

impl NodeEventSubscription for Subscription {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        self.send(SessionEvent::Opened, &ses);
    }
    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        self.send(SessionEvent::Disconnected, &ses);
    }
    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.send(SessionEvent::Authenticated, &ses);
    }
}

struct Dial {
    next: Instant,
    delay: Duration,
}

pub struct MembershipState {
    args: MembershipArgs,
    stats: std::sync::Arc<crate::stats::ActorStats>,
    authenticated: HashSet<ActorId>,
    /// Connections closed during their handshake in a row, by the peer's
    /// host (see [`handshake_closed`]).
    unauthenticated: std::sync::Arc<parking_lot::Mutex<HashMap<String, u32>>>,
    dials: HashMap<String, Dial>,
    /// Cluster addresses of nodes of another cluster, not dialed until then.
    refused: HashMap<String, Instant>,
    saved: Option<(Vec<KnownNode>, u64)>,
    leaving: bool,
    ticker: Option<ractor::concurrency::JoinHandle<()>>,
}

const DIAL_MIN: Duration = Duration::from_millis(200);
const DIAL_MAX: Duration = Duration::from_secs(5);
/// How long a node of another cluster is left alone after a refusal.
const REFUSED_BACKOFF: Duration = Duration::from_secs(60);

/// Connections closed during their handshake in a row before one that
/// does not is taken for a refusal.
const HANDSHAKES_REFUSED: u32 = 3;

/// The host of a `host:port` address.
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// Logs a cluster connection that closed before it authenticated, the
/// `in_a_row`-th from its host since one authenticated. A peer that
/// stopped or restarted during the handshake closes it too, once: only
/// [`HANDSHAKES_REFUSED`] in a row are taken for a refusal (a joining node
/// gives up after as many, `join::REFUSALS`).
fn handshake_closed(peer_name: Option<&str>, peer_addr: &str, incoming: bool, in_a_row: u32) {
    let direction = if incoming { "from" } else { "to" };
    if in_a_row < HANDSHAKES_REFUSED {
        tracing::info!(
            peer = ?peer_name,
            %peer_addr,
            "cluster connection {direction} {peer_addr} closed during its handshake (the peer may have stopped or restarted); it is dialed again"
        );
    } else {
        tracing::error!(
            peer = ?peer_name,
            %peer_addr,
            "cluster connection {direction} {peer_addr} closed before it authenticated, {in_a_row} times in a row: the two nodes have different cluster cookies (cluster.cookie) or TLS settings (tls.*), or the peer is not a curvine node"
        );
    }
}

/// The node id in a ractor_cluster peer name (`node_id@host`).
fn node_of(peer_name: &str) -> &str {
    peer_name.split('@').next().unwrap_or(peer_name)
}

/// Node ids whose gateway this process currently sees.
pub fn connected_nodes() -> Vec<String> {
    ractor::pg::which_groups()
        .into_iter()
        .filter_map(|g| g.strip_prefix("curvine.gw.").map(str::to_string))
        .filter(|n| gateway_of(n).is_some())
        .collect()
}

impl Membership {
    fn heartbeat(state: &MembershipState) -> Heartbeat {
        let view = &state.args.view;
        Heartbeat {
            cluster_id: view.cluster_id.clone(),
            shard_count: view.shard_count,
            member: view.me(),
            map: (*view.map()).clone(),
            known: view
                .members()
                .into_iter()
                .filter(|m| m.state != MemberState::Left && !m.info.cluster_addr.is_empty())
                .map(|m| (m.info.node_id, m.info.cluster_addr))
                .collect(),
            leaving: state.leaving,
            mounts_version: (state.args.mounts_version)(),
            leads: view.leads(),
        }
    }

    async fn tick(state: &mut MembershipState) {
        let view = state.args.view.clone();
        let tiers = (state.args.tiers)();
        view.update_me(|me| me.tiers = tiers);
        let hb = Self::heartbeat(state);
        for node in connected_nodes() {
            if node == view.node_id {
                continue;
            }
            if let Some(gw) = gateway_of(&node) {
                let _ = gw.cast(PeerMsg::Heartbeat(Box::new(hb.clone())));
            }
        }
        for node in view.expire(now_ns()) {
            tracing::warn!(
                node,
                timeout = ?view.node_timeout(),
                "node is down: no heartbeat within the node timeout"
            );
        }
        Self::dial(state).await;
        Self::save(state);
    }

    /// Dials the seeds and known nodes this node has no session with.
    async fn dial(state: &mut MembershipState) {
        let view = state.args.view.clone();
        let sessions =
            match ractor::call_t!(state.args.server, NodeServerMessage::GetSessions, 1000) {
                Ok(s) => s,
                Err(_) => return,
            };
        let mut connected_addrs: HashSet<String> = HashSet::new();
        let mut connected_ids: HashSet<String> = HashSet::new();
        for ses in sessions.values() {
            if let Some(name) = &ses.peer_name {
                connected_addrs.insert(name.connection_string.clone());
                connected_ids.insert(node_of(&name.name).to_string());
            }
        }
        let me = view.me();
        let mut targets: Vec<String> = state.args.seeds.clone();
        for m in view.members() {
            if m.info.node_id != view.node_id
                && m.state != MemberState::Left
                && !m.info.cluster_addr.is_empty()
                && !connected_ids.contains(&m.info.node_id)
            {
                targets.push(m.info.cluster_addr.clone());
            }
        }
        targets.sort();
        targets.dedup();
        let now = Instant::now();
        state
            .dials
            .retain(|addr, _| !connected_addrs.contains(addr));
        for addr in targets {
            if addr == me.cluster_addr || connected_addrs.contains(&addr) {
                continue;
            }
            let dial = state.dials.entry(addr.clone()).or_insert(Dial {
                next: now,
                delay: DIAL_MIN,
            });
            if dial.next > now {
                continue;
            }
            dial.next = now + dial.delay;
            dial.delay = (dial.delay * 2).min(DIAL_MAX);
            let server = state.args.server.clone();
            let dial = (state.args.dial)(server, addr.clone());
            tokio::spawn(async move {
                if let Err(e) = dial.await {
                    tracing::debug!(%addr, error = %e, "cannot reach node");
                }
            });
        }
    }

    /// Keeps the known nodes and the map in the data directory.
    fn save(state: &mut MembershipState) {
        let view = &state.args.view;
        let mut nodes: Vec<KnownNode> = view
            .members()
            .into_iter()
            .filter(|m| {
                m.info.node_id != view.node_id
                    && m.state != MemberState::Left
                    && !m.info.cluster_addr.is_empty()
            })
            .map(|m| KnownNode {
                node_id: m.info.node_id,
                cluster_addr: m.info.cluster_addr,
            })
            .collect();
        nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        let map = view.map();
        if state.saved.as_ref() == Some(&(nodes.clone(), map.version)) {
            return;
        }
        let file = MembersFile {
            nodes: nodes.clone(),
            map_version: map.version,
            map: map.shards.clone(),
            followers: map.followers.clone(),
        };
        let path = &state.args.members_file;
        match write_members_file(path, &file) {
            Ok(()) => state.saved = Some((nodes, map.version)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot save the node table")
            }
        }
    }

    async fn heard(state: &mut MembershipState, hb: Heartbeat) {
        let view = state.args.view.clone();
        let node = hb.member.node_id.clone();
        if hb.cluster_id != view.cluster_id || hb.shard_count != view.shard_count {
            // Tell the other side who we are before hanging up, so it can
            // say why too; then leave its address alone for a while.
            if let Some(gw) = gateway_of(&node) {
                let _ = gw.cast(PeerMsg::Heartbeat(Box::new(Self::heartbeat(state))));
            }
            let until = Instant::now() + REFUSED_BACKOFF;
            state.dials.insert(
                hb.member.cluster_addr.clone(),
                Dial {
                    next: until,
                    delay: DIAL_MAX,
                },
            );
            state.refused.insert(hb.member.cluster_addr.clone(), until);
            tracing::error!(
                node,
                addr = %hb.member.cluster_addr,
                their_cluster = %hb.cluster_id,
                our_cluster = %view.cluster_id,
                their_shards = hb.shard_count,
                our_shards = view.shard_count,
                "refusing a node of another cluster (its data directory was formatted for a different cluster); disconnecting it"
            );
            let server = state.args.server.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                disconnect(&server, &node).await;
            });
            return;
        }
        if node == view.node_id {
            return;
        }
        let old_map = view.map();
        let heard = view.heard(&hb, now_ns());
        if heard.new {
            tracing::info!(node, addr = %hb.member.cluster_addr, "node joined");
        } else if heard.back {
            tracing::info!(node, addr = %hb.member.cluster_addr, "node is up again");
        }
        if hb.leaving && heard.back {
            tracing::info!(node, "node left the cluster");
        }
        for (id, addr) in &hb.known {
            if view.know(id, addr, now_ns()) {
                tracing::info!(node = %id, %addr, "learned of node");
            }
        }
        if hb.mounts_version > (state.args.mounts_version)() {
            (state.args.on_mounts_behind)(hb.mounts_version);
        }
        if heard.map_changed {
            let new_map = view.map();
            tracing::info!(
                from = old_map.version,
                to = new_map.version,
                "adopted a newer cluster map"
            );
            (state.args.on_map_change)(&old_map, &new_map);
        }
    }
}

/// Closes every session with `node`.
async fn disconnect(server: &ActorRef<NodeServerMessage>, node: &str) {
    if let Ok(sessions) = ractor::call_t!(server, NodeServerMessage::GetSessions, 1000) {
        for ses in sessions.values() {
            if ses
                .peer_name
                .as_ref()
                .is_some_and(|n| node_of(&n.name) == node)
            {
                ses.actor.stop(Some("refused: another cluster".into()));
            }
        }
    }
}

impl Actor for Membership {
    type Msg = MembershipMsg;
    type State = MembershipState;
    type Arguments = MembershipArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<MembershipMsg>,
        args: MembershipArgs,
    ) -> Result<MembershipState, ActorProcessingErr> {
        let stats = args.view.metrics.actor("membership", false);
        args.view.metrics.started(myself.get_id(), &stats);
        let (known, _) = read_members_file(&args.members_file);
        for (id, addr) in known {
            args.view.know(&id, &addr, now_ns());
        }
        args.server.cast(NodeServerMessage::SubscribeToEvents {
            id: "curvine-membership".into(),
            subscription: Box::new(Subscription(myself.clone())),
        })?;
        let ticker = myself.send_interval(args.heartbeat, || MembershipMsg::Tick);
        let _ = myself.cast(MembershipMsg::Tick);
        Ok(MembershipState {
            args,
            stats,
            authenticated: HashSet::new(),
            unauthenticated: Default::default(),
            dials: HashMap::new(),
            refused: HashMap::new(),
            saved: None,
            leaving: false,
            ticker: Some(ticker),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<MembershipMsg>,
        state: &mut MembershipState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        let _ = state
            .args
            .server
            .cast(NodeServerMessage::UnsubscribeToEvents(
                "curvine-membership".into(),
            ));
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<MembershipMsg>,
        message: MembershipMsg,
        state: &mut MembershipState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.stats.clone();
        let _handling = stats.handling(match &message {
            MembershipMsg::Tick => "tick",
            MembershipMsg::Heard(_) => "heard",
            MembershipMsg::Leave => "leave",
            MembershipMsg::Session { .. } => "session",
        });
        match message {
            MembershipMsg::Tick => Self::tick(state).await,
            MembershipMsg::Heard(hb) => Self::heard(state, *hb).await,
            MembershipMsg::Leave => {
                state.leaving = true;
                Self::tick(state).await;
            }
            MembershipMsg::Session {
                event,
                session,
                peer_name,
                peer_addr,
                incoming,
            } => match event {
                SessionEvent::Opened => {}
                SessionEvent::Authenticated => {
                    state.authenticated.insert(session);
                    state.unauthenticated.lock().remove(host_of(&peer_addr));
                    tracing::debug!(peer = ?peer_name, %peer_addr, "cluster session authenticated");
                    // Greet at once rather than at the next tick.
                    drop(myself.send_after(Duration::from_millis(50), || MembershipMsg::Tick));
                }
                SessionEvent::Disconnected => {
                    if state.authenticated.remove(&session) {
                        tracing::info!(
                            peer = ?peer_name,
                            %peer_addr,
                            "lost the connection to a node; re-dialing"
                        );
                    } else {
                        // ractor_cluster also closes the second of two
                        // connections between the same nodes before it
                        // authenticates; only a peer with no session left
                        // after a moment was refused.
                        let server = state.args.server.clone();
                        let closed = state.unauthenticated.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            let node = peer_name.as_deref().map(node_of).unwrap_or_default();
                            let connected = !node.is_empty()
                                && ractor::call_t!(server, NodeServerMessage::GetSessions, 1000)
                                    .map(|s| {
                                        s.values().any(|x| {
                                            x.peer_name
                                                .as_ref()
                                                .is_some_and(|n| node_of(&n.name) == node)
                                        })
                                    })
                                    .unwrap_or(false);
                            if connected {
                                tracing::debug!(%peer_addr, "closed a duplicate cluster connection");
                                return;
                            }
                            let in_a_row = {
                                let mut closed = closed.lock();
                                let n = closed.entry(host_of(&peer_addr).to_string()).or_default();
                                *n += 1;
                                *n
                            };
                            handshake_closed(peer_name.as_deref(), &peer_addr, incoming, in_a_row);
                        });
                    }
                }
            },
        }
        Ok(())
    }
}

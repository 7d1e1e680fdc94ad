//! The node's cluster port, opened first (a new node learns its cluster
//! through it), and joining the cluster of the seeds with it.

use std::sync::Arc;

use ractor::{Actor, ActorRef};

use curvine_actors::membership::Dialer;
use curvine_conf::Config;
use curvine_messages::cluster::JoinInfo;
use curvine_wire::tls::Tls;

use super::error::StartError;
use crate::identity::DataDir;

/// The node's cluster port: its ractor_cluster node server, the address it
/// is reached at, the listener this node accepts on itself (with TLS), and
/// how to dial other nodes.
pub struct ClusterPort {
    pub server: ActorRef<ractor_cluster::NodeServerMessage>,
    pub addr: String,
    /// With TLS: the public port, served by a task of the supervision tree
    /// (`cluster_port::serve_cluster`).
    pub tls_listener: Option<Arc<std::net::TcpListener>>,
    pub dial: Dialer,
}

/// Opens the cluster port. With port 0 a free one is picked, again if
/// another process takes it between the probe and the bind. Plain,
/// ractor_cluster's listener serves it on the configured host only (all
/// interfaces only for `0.0.0.0` or `[::]`). With TLS this
/// node accepts it on the configured address (each handshake in a task of
/// its own with a timeout, where ractor_cluster's listener would wait on
/// one handshake before it accepts the next connection) and hands finished
/// sessions to the node server, whose own listener is then bound to a
/// loopback port (TLS too) and announces the public port.
pub async fn open(
    config: &Config,
    data_dir: &DataDir,
    tls: &Option<Arc<Tls>>,
) -> Result<ClusterPort, StartError> {
    let configured = config.cluster_listen();
    let any_port = split_addr(&configured).1 == 0;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let addr = resolve_port(&configured)?;
        let (host, port) = split_addr(&addr);
        let bind_ip = listen_ip(&host).map_err(|reason| StartError::Cluster {
            addr: addr.clone(),
            reason,
        })?;
        let cluster_error = |e: &dyn std::fmt::Display| StartError::Cluster {
            addr: addr.clone(),
            reason: e.to_string(),
        };
        let public = match tls {
            Some(_) => match std::net::TcpListener::bind(addr.as_str()) {
                Ok(l) => Some(Arc::new(l)),
                Err(_) if any_port && attempt < 5 => continue,
                Err(e) => return Err(cluster_error(&e)),
            },
            None => None,
        };
        let (cookie, name) = (
            data_dir.identity.cookie.clone(),
            data_dir.identity.node_id.clone(),
        );
        let server = match tls.as_ref().and_then(|t| t.cluster_acceptor()) {
            Some(acceptor) => ractor_cluster::NodeServer::new(
                0,
                cookie,
                name,
                host,
                Some(ractor_cluster::IncomingEncryptionMode::Tls(
                    acceptor.clone(),
                )),
                Some(ractor_cluster::node::NodeConnectionMode::Isolated),
            )
            .with_listen_addr(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            None => ractor_cluster::NodeServer::new(
                port,
                cookie,
                name,
                host,
                None,
                Some(ractor_cluster::node::NodeConnectionMode::Transitive),
            )
            .with_listen_addr(bind_ip),
        };
        let server = match Actor::spawn(None, server, ()).await {
            Ok((server, _)) => server,
            Err(_) if any_port && attempt < 5 => continue,
            Err(e) => return Err(cluster_error(&e)),
        };
        if public.is_some() {
            // Queued after the listener's own port report.
            let _ = server.cast(ractor_cluster::NodeServerMessage::PortChanged { port });
        }
        let dial =
            crate::cluster_port::cluster_dialer(tls.clone(), config.client.connect_timeout.0);
        return Ok(ClusterPort {
            server,
            addr,
            tls_listener: public,
            dial,
        });
    }
}

/// Joins the cluster of `node.seeds` (a new data directory with seeds) and
/// adopts its identity; the member that let this node in and the map are
/// saved with the node table at once, so a node that fails to start after
/// joining still knows its cluster when restarted without seeds.
pub async fn join(
    config: &Config,
    cluster: &ClusterPort,
    data_dir: &mut DataDir,
) -> Result<JoinInfo, StartError> {
    let info = crate::join::join(
        &cluster.server,
        &config.node.seeds,
        config.cluster.join_timeout.0,
        &cluster.dial,
    )
    .await
    .map_err(StartError::Join)?;
    data_dir.adopt(&info)?;
    tracing::info!(cluster = %info.cluster_id, through = %info.node_id, "joined the cluster");
    if let Some(addr) =
        curvine_actors::membership::session_addr(&cluster.server, &info.node_id).await
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
    Ok(info)
}

/// `host:port` with port 0 replaced by a free port (ractor_cluster
/// announces the port it was given, so it must be the real one).
fn resolve_port(addr: &str) -> Result<String, StartError> {
    let (host, port) = split_addr(addr);
    if port != 0 {
        return Ok(addr.to_string());
    }
    // Free on the interface the listener binds.
    let ip = listen_ip(&host).map_err(|reason| StartError::Cluster {
        addr: addr.to_string(),
        reason,
    })?;
    let probe = std::net::TcpListener::bind((ip, 0)).map_err(|e| StartError::Cluster {
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

/// The address the cluster listener binds for `host`: the host's own
/// address (a name is resolved; the first address counts), so a node given
/// `127.0.0.2:8996` listens there and nowhere else.
fn listen_ip(host: &str) -> Result<std::net::IpAddr, String> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse() {
        return Ok(ip);
    }
    use std::net::ToSocketAddrs;
    (bare, 0)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve the host {host}: {e}"))?
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| format!("the host {host} has no address"))
}

fn split_addr(addr: &str) -> (String, u16) {
    let (host, port) = addr.rsplit_once(':').unwrap_or(("127.0.0.1", "0"));
    (host.to_string(), port.parse().unwrap_or(0))
}

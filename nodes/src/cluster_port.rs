//! The cluster port over TLS: ractor_cluster's sessions on streams this node
//! accepts and dials itself, each handshake in a task of its own with a
//! timeout (`tls.handshake_timeout`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use curvine_wire::tls::{Opening, Tls};

/// A TLS connection of the cluster port handed to ractor_cluster.
pub struct ClusterStream<S> {
    pub stream: S,
    pub peer: String,
    pub local: String,
}

impl<S> ractor_cluster::ClusterBidiStream for ClusterStream<S>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    fn split(self: Box<Self>) -> (ractor_cluster::BoxRead, ractor_cluster::BoxWrite) {
        let (r, w) = tokio::io::split(self.stream);
        (Box::new(r), Box::new(w))
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.peer.clone())
    }

    fn local_label(&self) -> Option<String> {
        Some(self.local.clone())
    }
}

/// The dialer of the cluster port: ractor_cluster's plain connect, or TCP
/// and a TLS handshake (each within its timeout) handed to the node server
/// as an external stream.
pub fn cluster_dialer(
    tls: Option<Arc<Tls>>,
    connect_timeout: Duration,
) -> curvine_actors::membership::Dialer {
    let Some(tls) = tls else {
        return curvine_actors::membership::plain_dialer();
    };
    Arc::new(move |server, addr| {
        let tls = tls.clone();
        Box::pin(async move {
            let stream = tokio::time::timeout(connect_timeout, TcpStream::connect(addr.as_str()))
                .await
                .map_err(|_| format!("connecting to {addr} timed out"))?
                .map_err(|e| e.to_string())?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| addr.clone());
            let local = stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let stream = tls.connect(&addr, stream).await.map_err(|e| {
                tracing::warn!(%addr, error = %e, "cannot open a cluster connection");
                e.to_string()
            })?;
            ractor_cluster::client_connect_external(
                &server,
                Box::new(ClusterStream {
                    stream,
                    peer,
                    local,
                }),
            )
            .await
            .map_err(|e| format!("{e:?}"))
        })
    })
}

/// Accepts the cluster port's connections when TLS is on: each handshake
/// runs in its own task within the handshake timeout, so a peer that
/// connects and says nothing holds up no one; a finished one is handed to
/// the node server. Plain connections and failed handshakes are refused and
/// logged.
pub async fn serve_cluster(
    listener: tokio::net::TcpListener,
    tls: Arc<Tls>,
    server: ractor::ActorRef<ractor_cluster::NodeServerMessage>,
) {
    loop {
        let (stream, peer) = crate::ports::next_connection(&listener, "cluster port").await;
        let (tls, server) = (tls.clone(), server.clone());
        tokio::spawn(async move {
            let Some(acceptor) = tls.cluster_acceptor() else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let local = stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            match tls.open(acceptor, stream).await {
                Ok(Opening::Tls(stream)) => {
                    let _ = server.cast(
                        ractor_cluster::NodeServerMessage::ConnectionOpenedExternal {
                            stream: Box::new(ClusterStream {
                                stream: *stream,
                                peer: peer.to_string(),
                                local,
                            }),
                            is_server: true,
                        },
                    );
                }
                Ok(Opening::Plain(_)) => {
                    tracing::warn!(%peer, "refused a plain connection on the cluster port: this node requires TLS (tls.enabled)");
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "refused a cluster connection");
                }
            }
        });
    }
}

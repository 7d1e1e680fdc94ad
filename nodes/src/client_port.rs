//! The client port: accepts connections, checks the protocol version, and
//! runs each request concurrently against the node's services.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use curvine_actors::trace;
use curvine_messages::codec::{from_bytes, to_bytes, Hello, PROTOCOL_VERSION};
use curvine_messages::rpc::{
    AuthReply, ClientAuth, HelloReply, Request, RequestFrame, ResponseFrame, CONNECTION_LIMIT,
};
use curvine_messages::trace::{sample, TraceCtx};
use curvine_messages::FsError;

use curvine_wire::frame::{read_frame, write_frame};

use crate::service::Service;
use curvine_wire::tls::{Accepted, Tls, Transport};

/// How many client connections the node serves at once
/// (`node.max_connections`): kept across restarts of the accept loop, as
/// the connections it counts outlive it.
#[derive(Clone)]
pub struct ConnectionLimit {
    max: usize,
    live: Arc<AtomicUsize>,
}

impl ConnectionLimit {
    pub fn new(max: u32) -> ConnectionLimit {
        ConnectionLimit {
            max: max as usize,
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A place for one more connection, or why there is none.
    fn take(&self, node: &str) -> Result<Counted, String> {
        let n = self.live.fetch_add(1, Ordering::SeqCst);
        let counted = Counted(self.live.clone());
        if n >= self.max {
            return Err(format!(
                "node {node} serves at most {} client connections at once and has that many open {CONNECTION_LIMIT}; \
                 close some, or raise node.max_connections",
                self.max
            ));
        }
        Ok(counted)
    }
}

/// A connection counted against the limit while it lives.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts the client port's connections while it runs (a supervised
/// task of the node: see `ports::accept_loop`).
pub async fn serve(
    listener: TcpListener,
    service: Arc<Service>,
    tls: Option<Arc<Tls>>,
    limit: ConnectionLimit,
) {
    loop {
        let (stream, peer) = crate::ports::next_connection(&listener, "client port").await;
        let service = service.clone();
        let tls = tls.clone();
        // Counted from the accept, so a burst is refused at once; one
        // past the limit is told why before its connection closes.
        let counted = limit.take(service.node_id());
        tokio::spawn(async move {
            if counted.is_err() {
                service.refused_connection();
            }
            let result = match open(stream, tls.as_deref()).await {
                Ok(Some(transport)) => connection(transport, peer, service, counted).await,
                Ok(None) => {
                    tracing::warn!(%peer, "refused a plain client: this node's client port requires TLS");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "refused a client connection");
                    return;
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "client connection closed");
            }
        });
    }
}

/// What a plain client of a port that requires TLS is told.
pub const TLS_REQUIRED: &str = "this node requires TLS on its client port: set tls.enabled = true \
     and tls.ca (the certificate authority of the cluster) in the client's config";

/// The connection's transport: TLS after its handshake when the node has
/// TLS on; `None` when the client spoke plain to a TLS port (it has been
/// answered with a refusal that says so).
async fn open(stream: TcpStream, tls: Option<&Tls>) -> std::io::Result<Option<Transport>> {
    let (mut stream, timeout) = match Accepted::from(stream, tls).await? {
        Accepted::Ready(transport) => return Ok(Some(transport)),
        Accepted::PlainOnTls { stream, timeout } => (stream, timeout),
    };
    let mut hello = [0u8; Hello::LEN];
    tokio::time::timeout(timeout, stream.read_exact(&mut hello))
        .await
        .map_err(|_| std::io::Error::other("no opening"))??;
    stream.write_all(&Hello::current().encode()).await?;
    let reply = HelloReply {
        accepted: false,
        server_version: PROTOCOL_VERSION,
        message: TLS_REQUIRED.to_string(),
        cluster_id: String::new(),
        node_id: String::new(),
        challenge: Vec::new(),
    };
    let bytes = to_bytes("hello reply", &reply).map_err(std::io::Error::other)?;
    write_frame(&mut stream, &bytes).await?;
    stream.flush().await?;
    Ok(None)
}

async fn connection(
    stream: Transport,
    peer: std::net::SocketAddr,
    service: Arc<Service>,
    counted: Result<Counted, String>,
) -> std::io::Result<()> {
    let peer = Some(peer);
    let (read, write) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    let mut writer = BufWriter::with_capacity(64 * 1024, write);

    let mut hello = [0u8; Hello::LEN];
    reader.read_exact(&mut hello).await?;
    writer.write_all(&Hello::current().encode()).await?;
    let refusal = match Hello::decode(&hello) {
        Err(e) => Some(e.to_string()),
        Ok(h) if h.version != PROTOCOL_VERSION => Some(format!(
            "client speaks protocol version {} but this node speaks version {PROTOCOL_VERSION}; use a matching curvine release",
            h.version
        )),
        Ok(_) => counted.as_ref().err().cloned(),
    };
    let challenge = curvine_wire::cookie::ClientKey::challenge();
    let reply = HelloReply {
        accepted: refusal.is_none(),
        server_version: PROTOCOL_VERSION,
        message: refusal.clone().unwrap_or_default(),
        cluster_id: service.cluster_id().to_string(),
        node_id: service.node_id().to_string(),
        challenge: challenge.clone(),
    };
    let bytes = to_bytes("hello reply", &reply).map_err(std::io::Error::other)?;
    write_frame(&mut writer, &bytes).await?;
    writer.flush().await?;
    if let Some(reason) = refusal {
        if counted.is_err() {
            // A flood past the limit is not logged line by line.
            tracing::debug!(peer = ?peer, reason, "refused client");
        } else {
            tracing::warn!(peer = ?peer, reason, "refused client");
        }
        return Ok(());
    }
    // The client proves it knows the cluster cookie.
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), read_frame(&mut reader))
        .await
        .map_err(|_| std::io::Error::other("no answer to the challenge in 10s"))??;
    let refusal = match answer.map(|b| from_bytes::<ClientAuth>("client auth", &b)) {
        None => return Ok(()),
        Some(Err(e)) => Some(format!("not an answer to the challenge: {e}")),
        Some(Ok(auth))
            if service
                .clients()
                .verify(&challenge, service.cluster_id(), &auth.proof) =>
        {
            None
        }
        Some(Ok(_)) => Some(
            "wrong cluster cookie: set the cluster's cookie as client.cookie or cluster.cookie \
             (it is in identity.toml in a node's data directory)"
                .to_string(),
        ),
    };
    let reply = AuthReply {
        accepted: refusal.is_none(),
        message: refusal.clone().unwrap_or_default(),
    };
    let bytes = to_bytes("auth reply", &reply).map_err(std::io::Error::other)?;
    write_frame(&mut writer, &bytes).await?;
    writer.flush().await?;
    if let Some(reason) = refusal {
        tracing::warn!(peer = ?peer, reason, "refused client");
        return Ok(());
    }

    // Blocks the connection's readers hold, released when it ends.
    let holds = Arc::new(curvine_actors::blocks::ConnHolds::new(service.read_holds()));
    // Responses go through one writer task, in completion order.
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer_task = tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            write_frame(&mut writer, &first).await?;
            while let Ok(more) = rx.try_recv() {
                write_frame(&mut writer, &more).await?;
            }
            writer.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    });

    while let Some(bytes) = read_frame(&mut reader).await? {
        let frame: RequestFrame = match from_bytes("request", &bytes) {
            Ok(f) => f,
            Err(e) => {
                // The stream is out of step: answer once, then close.
                let response = ResponseFrame {
                    id: 0,
                    result: Err(FsError::Protocol(e.to_string())),
                };
                if let Ok(out) = to_bytes("response", &response) {
                    let _ = tx.send(out);
                }
                break;
            }
        };
        let service = service.clone();
        let tx = tx.clone();
        let holds = holds.clone();
        tokio::spawn(async move {
            // A request starts a trace when the client asks for one or when
            // it is sampled; trace queries themselves are never traced.
            let tracer = service.tracer();
            let trace = match &frame.request {
                Request::TraceEvents(_) | Request::RecordTrace(_) => None,
                _ => frame
                    .trace
                    .or_else(|| sample(tracer.sample_rate()).then(TraceCtx::root)),
            };
            let span = tracer.start(trace, 0, "rpc", "client", frame.request.kind_name());
            let ctx = span.as_ref().map(|s| s.ctx());
            // Boxed: the request future is large, and a task's future is
            // copied when spawned.
            let result =
                trace::scope(ctx, Box::pin(service.handle_on(frame.request, &holds))).await;
            if let Some(span) = span {
                span.end(trace::outcome_of(&result));
            }
            let response = ResponseFrame {
                id: frame.id,
                result,
            };
            let out = to_bytes("response", &response).unwrap_or_else(|e| {
                let fallback = ResponseFrame {
                    id: frame.id,
                    result: Err(FsError::Protocol(e.to_string())),
                };
                to_bytes("response", &fallback).unwrap_or_default()
            });
            let _ = tx.send(out);
        });
    }
    drop(tx);
    let _ = writer_task.await;
    Ok(())
}

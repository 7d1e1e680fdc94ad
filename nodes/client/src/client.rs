//! The client library: what the CLI, FUSE and the benchmark embed.
//!
//! It opens `client.connections` connections to the first node of
//! `client.cluster` that answers, multiplexes requests over them (many in
//! flight per connection) and matches replies by id. It learns the other
//! nodes' client ports from the node it talks to; when that node goes away
//! it moves to another. A request whose connection broke before it was sent
//! is sent again on the new node; one that was in flight is retried only
//! when it changes nothing (a read), since the lost node may have applied it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot};

use curvine_conf::ClientConf;
use curvine_messages::codec::{from_bytes, to_bytes, Hello};
use curvine_messages::rpc::*;
use curvine_messages::trace::{TraceCtx, TraceQuery};
use curvine_messages::{Attr, FileKind, FsError, FsResult, SetAttr, XattrMode};

use curvine_wire::frame::{read_frame, write_frame};
use curvine_wire::tls::{Tls, Transport};

/// The client settings of `config`, with the cluster cookie found: the
/// `client.cookie`, else `cluster.cookie`, else the cookie in the identity
/// file of `node.data_dir` (a node on this host, when this user may read
/// its data directory).
pub fn client_conf(config: &curvine_conf::Config) -> ClientConf {
    let mut conf = config.client.clone();
    conf.tls = config.tls.clone();
    if conf.cookie.is_empty() {
        conf.cookie = config.cluster.cookie.clone();
    }
    if conf.cookie.is_empty() {
        if let Some(cookie) = curvine_wire::cookie::local_cookie(&config.data_dir()) {
            conf.cookie = cookie;
        }
    }
    conf
}

/// Client settings for file I/O.
#[derive(Debug, Clone)]
pub struct IoConf {
    pub short_circuit: bool,
    pub read_ahead: u32,
    /// `client.read_buffer_budget`.
    pub read_buffer_budget: usize,
    /// What this client's readers keep of what they streamed last,
    /// together (held to `read_buffer_budget`).
    pub recent: Arc<std::sync::atomic::AtomicUsize>,
}

impl From<&ClientConf> for IoConf {
    fn from(c: &ClientConf) -> Self {
        IoConf {
            short_circuit: c.short_circuit,
            read_ahead: c.read_ahead,
            read_buffer_budget: c.read_buffer_budget.0 as usize,
            recent: Default::default(),
        }
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<FsResult<Response>>>>>;

/// How far a failed request got.
enum Sent {
    /// Not sent: the connection was closed already.
    Before(FsError),
    /// Sent, and the connection broke before the reply.
    During(FsError),
}

struct Conn {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    closed: Arc<AtomicBool>,
}

/// The connections to one node.
struct Session {
    conns: Vec<Conn>,
    next_conn: AtomicUsize,
    node_addr: String,
    node_id: String,
}

impl Session {
    fn alive(&self) -> bool {
        self.conns.iter().any(|c| !c.closed.load(Ordering::SeqCst))
    }
}

struct Rpc {
    session: parking_lot::RwLock<Arc<Session>>,
    next_id: AtomicU64,
    /// Client ports of the cluster's nodes: the configured ones, then those
    /// learned from the nodes.
    addrs: Mutex<Vec<String>>,
    failover: tokio::sync::Mutex<()>,
    conf: ClientConf,
    /// The loaded `[tls]` settings, when TLS is on.
    tls: Option<Arc<Tls>>,
}

/// A connection to a cluster. Cheap to clone: clones share connections.
#[derive(Clone)]
pub struct Client {
    rpc: Arc<Rpc>,
    timeout: Duration,
    pub cluster_id: String,
    pub(crate) data: curvine_wire::data::DataPool,
    pub(crate) io: IoConf,
    /// The trace every request of this client joins (a traced command).
    trace: Option<TraceCtx>,
}

/// Requests that change nothing, so retrying one on another node is safe.
fn read_only(request: &Request) -> bool {
    matches!(
        request,
        Request::Stat(_)
            | Request::List(_)
            | Request::Readlink(_)
            | Request::GetXattr(_)
            | Request::ListXattr(_)
            | Request::Report(_)
            | Request::Fsck(_)
            | Request::OpenRead(_)
            | Request::Blocks(_)
            | Request::Members(_)
    )
}

/// The next frame of the handshake with node `addr`.
async fn next_frame<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    addr: &str,
) -> FsResult<Vec<u8>> {
    read_frame(reader)
        .await
        .map_err(|e| FsError::Unavailable(format!("cannot reach node {addr}: {e}")))?
        .ok_or_else(|| FsError::Unavailable(format!("node {addr} closed the connection")))
}

async fn open(
    addr: &str,
    timeout: Duration,
    key: &curvine_wire::cookie::ClientKey,
    tls: Option<&Tls>,
) -> FsResult<(Conn, HelloReply)> {
    let unavailable =
        |e: std::io::Error| FsError::Unavailable(format!("cannot reach node {addr}: {e}"));
    let stream = Transport::dial(addr, timeout, tls)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut => {
                FsError::TimedOut(format!("connecting to node {addr}: {e}"))
            }
            // TLS refused: a certificate, a protocol mismatch.
            std::io::ErrorKind::InvalidData => FsError::Protocol(format!("node {addr}: {e}")),
            std::io::ErrorKind::InvalidInput => {
                FsError::InvalidArgument(format!("node {addr}: {e}"))
            }
            _ => unavailable(e),
        })?;
    let (read, write) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    let mut writer = BufWriter::with_capacity(64 * 1024, write);
    writer
        .write_all(&Hello::current().encode())
        .await
        .map_err(unavailable)?;
    writer.flush().await.map_err(unavailable)?;
    let handshake = async {
        let mut hello = [0u8; Hello::LEN];
        reader.read_exact(&mut hello).await.map_err(unavailable)?;
        Hello::decode(&hello).map_err(|e| FsError::Protocol(format!("node {addr}: {e}")))?;
        let bytes = next_frame(&mut reader, addr).await?;
        let reply: HelloReply = from_bytes("hello reply", &bytes).map_err(FsError::from)?;
        if !reply.accepted {
            let message = format!("node {addr} refused the connection: {}", reply.message);
            return Err(if reply.message.contains(CONNECTION_LIMIT) {
                FsError::Busy(message)
            } else {
                FsError::Protocol(message)
            });
        }
        // Prove the cluster cookie (it is never sent).
        let auth = ClientAuth {
            proof: key.proof(&reply.challenge, &reply.cluster_id),
        };
        let bytes = to_bytes("client auth", &auth).map_err(FsError::from)?;
        write_frame(&mut writer, &bytes)
            .await
            .map_err(unavailable)?;
        writer.flush().await.map_err(unavailable)?;
        let bytes = next_frame(&mut reader, addr).await?;
        let auth: AuthReply = from_bytes("auth reply", &bytes).map_err(FsError::from)?;
        if !auth.accepted {
            return Err(FsError::PermissionDenied(format!(
                "node {addr} refused the connection: {}",
                auth.message
            )));
        }
        Ok::<_, FsError>(reply)
    };
    let reply = tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| FsError::TimedOut(format!("handshake with node {addr}")))??;

    let pending: Pending = Default::default();
    let closed = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            if write_frame(&mut writer, &first).await.is_err() {
                break;
            }
            while let Ok(more) = rx.try_recv() {
                if write_frame(&mut writer, &more).await.is_err() {
                    return;
                }
            }
            if writer.flush().await.is_err() {
                break;
            }
        }
    });
    let (pending_r, closed_r, node) = (pending.clone(), closed.clone(), addr.to_string());
    tokio::spawn(async move {
        let reason = loop {
            match read_frame(&mut reader).await {
                Ok(Some(bytes)) => match from_bytes::<ResponseFrame>("response", &bytes) {
                    Ok(frame) => {
                        if let Some(waiter) = pending_r.lock().remove(&frame.id) {
                            let _ = waiter.send(frame.result);
                        }
                    }
                    Err(e) => break format!("bad reply from node {node}: {e}"),
                },
                Ok(None) => break format!("node {node} closed the connection"),
                Err(e) => break format!("connection to node {node} lost: {e}"),
            }
        };
        closed_r.store(true, Ordering::SeqCst);
        for (_, waiter) in pending_r.lock().drain() {
            let _ = waiter.send(Err(FsError::Unavailable(reason.clone())));
        }
    });
    Ok((
        Conn {
            tx,
            pending,
            closed,
        },
        reply,
    ))
}

impl Client {
    /// A client whose every request is traced in `trace` (sharing this
    /// client's connections); `curvine-cli trace -- CMD` runs CMD with one.
    pub fn traced(&self, trace: TraceCtx) -> Client {
        Client {
            trace: Some(trace),
            ..self.clone()
        }
    }

    /// Tells the node that the reader holding `hold` closed, from runtime
    /// `rt` (not waiting for the answer).
    pub(crate) fn close_read(&self, hold: u64, rt: &tokio::runtime::Handle) {
        let client = self.clone();
        drop(rt.spawn(async move {
            let _ = client.call(CloseRead { holds: vec![hold] }).await;
        }));
    }

    /// Bytes this client's readers keep of what they streamed last,
    /// together (at most `client.read_buffer_budget`, and one chunk per
    /// reader past it).
    pub fn read_buffers(&self) -> usize {
        self.io.recent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The trace this client's requests join, if any.
    pub fn trace(&self) -> Option<TraceCtx> {
        self.trace
    }

    /// Trace events of the cluster's nodes matching `query`; `cursors` are
    /// the `next_seq` per node of a previous answer (to follow).
    pub async fn trace_events(
        &self,
        query: TraceQuery,
        cursors: Vec<(String, u64)>,
    ) -> FsResult<Vec<NodeTrace>> {
        self.call(TraceEvents { query, cursors }).await
    }

    /// Connects to the first reachable node of `conf.cluster`.
    pub async fn connect(conf: &ClientConf) -> FsResult<Client> {
        let tls = Tls::from_conf(&conf.tls, false)
            .map_err(|e| FsError::InvalidArgument(e.to_string()))?;
        let mut last = FsError::InvalidArgument("client.cluster lists no node".into());
        for addr in &conf.cluster {
            match Self::connect_to(addr, conf, tls.clone()).await {
                Ok(client) => return Ok(client),
                Err(
                    e @ (FsError::Protocol(_)
                    | FsError::PermissionDenied(_)
                    | FsError::InvalidArgument(_)),
                ) => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn connect_to(addr: &str, conf: &ClientConf, tls: Option<Arc<Tls>>) -> FsResult<Client> {
        let (session, hello) = Self::open_session(addr, conf, tls.as_deref()).await?;
        let mut addrs = conf.cluster.clone();
        if !addrs.iter().any(|a| a == addr) {
            addrs.insert(0, addr.to_string());
        }
        let client = Client {
            rpc: Arc::new(Rpc {
                session: parking_lot::RwLock::new(Arc::new(session)),
                next_id: AtomicU64::new(1),
                addrs: Mutex::new(addrs),
                failover: tokio::sync::Mutex::new(()),
                conf: conf.clone(),
                tls: tls.clone(),
            }),
            data: curvine_wire::data::DataPool::new(
                conf.connect_timeout.0,
                conf.request_timeout.0,
                curvine_wire::tls::for_data_port(&tls),
            ),
            io: IoConf::from(conf),
            timeout: conf.request_timeout.0,
            trace: None,
            cluster_id: hello.cluster_id,
        };
        // Learn the other nodes in the background, for a failover later.
        let learner = client.clone();
        tokio::spawn(async move { learner.learn_nodes().await });
        Ok(client)
    }

    async fn open_session(
        addr: &str,
        conf: &ClientConf,
        tls: Option<&Tls>,
    ) -> FsResult<(Session, HelloReply)> {
        let mut conns = Vec::new();
        let mut hello = None;
        let key = curvine_wire::cookie::ClientKey::new(&conf.cookie);
        for _ in 0..conf.connections.max(1) {
            let (conn, reply) = open(addr, conf.connect_timeout.0, &key, tls).await?;
            conns.push(conn);
            hello = Some(reply);
        }
        let hello =
            hello.ok_or_else(|| FsError::InvalidArgument("client.connections is 0".into()))?;
        Ok((
            Session {
                conns,
                next_conn: AtomicUsize::new(0),
                node_addr: addr.to_string(),
                node_id: hello.node_id.clone(),
            },
            hello,
        ))
    }

    /// The client port of the node this client talks to now.
    pub fn node_addr(&self) -> String {
        self.rpc.session.read().node_addr.clone()
    }

    /// The id of the node this client talks to now.
    pub fn node_id(&self) -> String {
        self.rpc.session.read().node_id.clone()
    }

    /// Adds the client ports of the nodes that are up to the failover list.
    async fn learn_nodes(&self) {
        // Straight on the current session: no failover from here.
        let session = self.rpc.session.read().clone();
        let members = match self.send(&session, &Request::Members(Members)).await {
            Ok(Ok(Response::Members(m))) => m,
            _ => return,
        };
        let mut addrs = self.rpc.addrs.lock();
        for m in members {
            if m.state == curvine_messages::cluster::MemberState::Up
                && !m.info.rpc_addr.is_empty()
                && !addrs.contains(&m.info.rpc_addr)
            {
                addrs.push(m.info.rpc_addr);
            }
        }
    }

    /// Moves to another node of the cluster after `dead` stopped answering.
    async fn fail_over(&self, dead: &Arc<Session>) -> FsResult<()> {
        let _one = self.rpc.failover.lock().await;
        if !Arc::ptr_eq(&self.rpc.session.read(), dead) && self.rpc.session.read().alive() {
            return Ok(()); // another request already moved on
        }
        let mut candidates = self.rpc.addrs.lock().clone();
        // The node that went away is tried last (it may be back).
        candidates.retain(|a| *a != dead.node_addr);
        candidates.push(dead.node_addr.clone());
        let mut last = FsError::Unavailable("no node to try".into());
        for addr in &candidates {
            match Self::open_session(addr, &self.rpc.conf, self.rpc.tls.as_deref()).await {
                Ok((session, hello)) if hello.cluster_id == self.cluster_id => {
                    tracing::info!(from = %dead.node_addr, to = %addr, "moved to another node of the cluster");
                    *self.rpc.session.write() = Arc::new(session);
                    let learner = self.clone();
                    tokio::spawn(async move { learner.learn_nodes().await });
                    return Ok(());
                }
                Ok((_, hello)) => {
                    last = FsError::Protocol(format!(
                        "node {addr} belongs to cluster {}, not {}",
                        hello.cluster_id, self.cluster_id
                    ))
                }
                Err(e) => last = e,
            }
        }
        Err(FsError::Unavailable(format!(
            "no node of the cluster answers (tried {}; last: {last})",
            candidates.join(", ")
        )))
    }

    /// Sends a request and waits for its typed reply.
    pub async fn call<R: Call>(&self, request: R) -> FsResult<R::Reply> {
        let request: Request = request.into();
        curvine_runtime::stats::process().add(
            "curvine_client_calls_total",
            "Calls the client library made to the cluster, per kind (an attempt made again counts once).",
            &[("call", request.kind_name())],
            1,
        );
        let retry_in_flight = read_only(&request);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let session = self.rpc.session.read().clone();
            match self.send(&session, &request).await {
                Ok(response) => return R::reply(response?),
                Err(Sent::Before(_)) if attempts < 3 => self.fail_over(&session).await?,
                Err(Sent::During(_)) if attempts < 3 && retry_in_flight => {
                    self.fail_over(&session).await?
                }
                Err(Sent::Before(e) | Sent::During(e)) => {
                    // Later requests go to another node.
                    let client = self.clone();
                    tokio::spawn(async move {
                        let _ = client.fail_over(&session).await;
                    });
                    return Err(e);
                }
            }
        }
    }

    async fn send(&self, session: &Session, request: &Request) -> Result<FsResult<Response>, Sent> {
        let rpc = &self.rpc;
        let id = rpc.next_id.fetch_add(1, Ordering::Relaxed);
        let conn =
            &session.conns[session.next_conn.fetch_add(1, Ordering::Relaxed) % session.conns.len()];
        let closed = || {
            Sent::Before(FsError::Unavailable(format!(
                "connection to node {} is closed",
                session.node_addr
            )))
        };
        if conn.closed.load(Ordering::SeqCst) {
            return Err(closed());
        }
        let frame = RequestFrame {
            id,
            request: request.clone(),
            trace: self.trace.or_else(curvine_runtime::trace::current),
        };
        let bytes = match to_bytes("request", &frame) {
            Ok(b) => b,
            Err(e) => return Ok(Err(FsError::from(e))),
        };
        let (tx, rx) = oneshot::channel();
        {
            // The reader marks the connection closed, then fails what is
            // pending under this lock: a request added after that would
            // wait for a reply that never comes (until the timeout), so
            // the flag is checked under the lock.
            let mut pending = conn.pending.lock();
            if conn.closed.load(Ordering::SeqCst) {
                return Err(closed());
            }
            pending.insert(id, tx);
        }
        if conn.tx.send(bytes).is_err() {
            conn.pending.lock().remove(&id);
            return Err(closed());
        }
        // The server answers within its own request timeout; allow a margin.
        match tokio::time::timeout(self.timeout + Duration::from_secs(5), rx).await {
            Ok(Ok(Err(FsError::Unavailable(reason)))) if conn.closed.load(Ordering::SeqCst) => {
                Err(Sent::During(FsError::Unavailable(reason)))
            }
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Err(Sent::During(FsError::Unavailable(format!(
                "connection to node {} lost",
                session.node_addr
            )))),
            Err(_) => {
                conn.pending.lock().remove(&id);
                Ok(Err(FsError::TimedOut(format!(
                    "no reply from node {} in {:?}",
                    session.node_addr, self.timeout
                ))))
            }
        }
    }

    // ---- conveniences ------------------------------------------------------

    pub async fn stat(&self, path: &str) -> FsResult<Attr> {
        self.call(Stat { path: path.into() }).await
    }

    pub async fn mkdir(&self, path: &str, parents: bool) -> FsResult<Attr> {
        let (uid, gid) = current_owner();
        self.call(Mkdir {
            path: path.into(),
            parents,
            mode: 0o755,
            uid,
            gid,
        })
        .await
    }

    pub async fn touch(&self, path: &str) -> FsResult<Attr> {
        let (uid, gid) = current_owner();
        self.call(Touch {
            path: path.into(),
            mode: 0o644,
            exclusive: false,
            uid,
            gid,
        })
        .await
    }

    /// Creates an empty file; EEXIST if the path exists.
    pub async fn create(&self, path: &str) -> FsResult<Attr> {
        let (uid, gid) = current_owner();
        self.call(Touch {
            path: path.into(),
            mode: 0o644,
            exclusive: true,
            uid,
            gid,
        })
        .await
    }

    pub async fn symlink(&self, target: &str, link: &str) -> FsResult<Attr> {
        let (uid, gid) = current_owner();
        self.call(Symlink {
            target: target.into(),
            link: link.into(),
            uid,
            gid,
        })
        .await
    }

    /// Swaps what `a` and `b` name, atomically (RENAME_EXCHANGE).
    pub async fn exchange(&self, a: &str, b: &str) -> FsResult<()> {
        self.call(Exchange {
            a: a.into(),
            b: b.into(),
        })
        .await
    }

    /// Makes `link` a new name (hard link) of what `target` names.
    pub async fn link(&self, target: &str, link: &str) -> FsResult<Attr> {
        self.call(Link {
            target: target.into(),
            link: link.into(),
        })
        .await
    }

    /// Makes a FIFO, socket or device node (`kind`) with permission bits
    /// `mode`, owned by the caller.
    pub async fn mknod(&self, path: &str, kind: FileKind, mode: u32) -> FsResult<Attr> {
        let (uid, gid) = current_owner();
        self.call(Mknod {
            path: path.into(),
            kind,
            mode,
            uid,
            gid,
        })
        .await
    }

    pub async fn readlink(&self, path: &str) -> FsResult<String> {
        self.call(Readlink { path: path.into() }).await
    }

    pub async fn rename(&self, src: &str, dst: &str) -> FsResult<()> {
        self.call(Rename {
            src: src.into(),
            dst: dst.into(),
        })
        .await
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> FsResult<RemoveSummary> {
        self.call(Remove {
            path: path.into(),
            recursive,
            dir: false,
        })
        .await
    }

    pub async fn rmdir(&self, path: &str) -> FsResult<RemoveSummary> {
        self.call(Remove {
            path: path.into(),
            recursive: false,
            dir: true,
        })
        .await
    }

    /// Changes attributes of a path, following a symlink at its end.
    pub async fn setattr(&self, path: &str, set: SetAttr) -> FsResult<Attr> {
        self.call(SetAttrs {
            path: path.into(),
            set,
            follow: true,
        })
        .await
    }

    pub async fn set_xattr(
        &self,
        path: &str,
        name: &str,
        value: &[u8],
        mode: XattrMode,
    ) -> FsResult<()> {
        self.call(SetXattr {
            path: path.into(),
            name: name.into(),
            value: value.to_vec(),
            mode,
        })
        .await
    }

    pub async fn get_xattr(&self, path: &str, name: &str) -> FsResult<Vec<u8>> {
        self.call(GetXattr {
            path: path.into(),
            name: name.into(),
        })
        .await
    }

    pub async fn list_xattr(&self, path: &str) -> FsResult<Vec<String>> {
        self.call(ListXattr { path: path.into() }).await
    }

    pub async fn remove_xattr(&self, path: &str, name: &str) -> FsResult<()> {
        self.call(RemoveXattr {
            path: path.into(),
            name: name.into(),
        })
        .await
    }

    /// Every entry of a directory, all pages.
    pub async fn list_all(&self, path: &str) -> FsResult<Vec<ListEntry>> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .call(List {
                    path: path.into(),
                    after: after.clone(),
                    limit: 1000,
                })
                .await?;
            after = page.entries.last().map(|e| e.name.clone());
            let more = page.more;
            out.extend(page.entries);
            if !more || after.is_none() {
                return Ok(out);
            }
        }
    }

    /// Drops cached blocks under `path` that have another copy.
    pub async fn free(&self, path: &str) -> FsResult<curvine_messages::block::FreeSummary> {
        self.call(FreePath { path: path.into() }).await
    }

    /// A file's blocks with their replicas.
    pub async fn blocks(&self, path: &str) -> FsResult<FileBlocks> {
        self.call(Blocks { path: path.into() }).await
    }

    /// Tells the node this client talks to that its blocks `ids` were read
    /// without it (see [`curvine_messages::rpc::TouchBlocks`]).
    pub async fn touch_blocks(&self, ids: Vec<curvine_messages::block::BlockId>) -> FsResult<()> {
        self.call(curvine_messages::rpc::TouchBlocks { ids }).await
    }

    /// Asks the node this client is connected to (which must hold every
    /// block of the file) to lay the file's blocks out in one extent file,
    /// so that a mount on its host can pass the file through; answers
    /// where the blocks are after.
    pub async fn assemble(&self, path: &str) -> FsResult<FileBlocks> {
        self.call(curvine_messages::rpc::Assemble { path: path.into() })
            .await
    }

    /// As [`Client::assemble`], the node first copying the blocks of the
    /// file only other nodes hold (each one more replica).
    pub async fn copy_here(&self, path: &str) -> FsResult<FileBlocks> {
        self.call(curvine_messages::rpc::CopyHere { path: path.into() })
            .await
    }

    /// Verifies the blocks of every node (or of `node`); with `repair`,
    /// drops bad copies whose data is whole elsewhere.
    pub async fn scrub(
        &self,
        node: Option<String>,
        repair: bool,
    ) -> FsResult<Vec<curvine_messages::rpc::NodeScrub>> {
        self.call(curvine_messages::rpc::Scrub { node, repair })
            .await
    }

    /// Keeps trace events recorded here (a FUSE mount's) in the node's ring.
    pub async fn record_trace(
        &self,
        events: Vec<curvine_messages::trace::TraceEvent>,
    ) -> FsResult<()> {
        self.call(curvine_messages::rpc::RecordTrace { events })
            .await
    }

    /// The supervision tree of every node, or of `node`.
    pub async fn actors(
        &self,
        node: Option<String>,
    ) -> FsResult<Vec<curvine_messages::stats::NodeActors>> {
        self.call(curvine_messages::rpc::Actors { node }).await
    }

    pub async fn report(&self) -> FsResult<ClusterReport> {
        self.call(Report).await
    }

    pub async fn fsck(&self) -> FsResult<FsckReport> {
        self.call(Fsck).await
    }
}

/// The uid and gid of this process.
pub fn current_owner() -> (u32, u32) {
    // SAFETY: getuid/getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

//! The client library: what the CLI, FUSE and the benchmark embed.
//!
//! It opens `client.connections` connections to the first node of
//! `client.cluster` that answers, multiplexes requests over them (many in
//! flight per connection) and matches replies by id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use curvine_conf::ClientConf;
use curvine_messages::codec::{from_bytes, to_bytes, Hello};
use curvine_messages::rpc::*;
use curvine_messages::{Attr, FsError, FsResult, SetAttr, XattrMode};

use crate::server::{read_frame, write_frame};

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<FsResult<Response>>>>>;

struct Conn {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    closed: Arc<AtomicBool>,
}

struct Rpc {
    conns: Vec<Conn>,
    next_conn: AtomicUsize,
    next_id: AtomicU64,
}

/// A connection to a cluster. Cheap to clone: clones share connections.
#[derive(Clone)]
pub struct Client {
    rpc: Arc<Rpc>,
    timeout: Duration,
    /// The node this client is connected to.
    pub node_addr: String,
    pub cluster_id: String,
    pub node_id: String,
    pub(crate) data: crate::io::DataPool,
    pub(crate) io: crate::io::IoConf,
}

async fn open(addr: &str, timeout: Duration) -> FsResult<(Conn, HelloReply)> {
    let unavailable =
        |e: std::io::Error| FsError::Unavailable(format!("cannot reach node {addr}: {e}"));
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| FsError::TimedOut(format!("connecting to node {addr}")))?
        .map_err(unavailable)?;
    stream.set_nodelay(true).map_err(unavailable)?;
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
        let bytes = read_frame(&mut reader)
            .await
            .map_err(unavailable)?
            .ok_or_else(|| FsError::Unavailable(format!("node {addr} closed the connection")))?;
        let reply: HelloReply = from_bytes("hello reply", &bytes).map_err(FsError::from)?;
        Ok::<_, FsError>(reply)
    };
    let reply = tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| FsError::TimedOut(format!("handshake with node {addr}")))??;
    if !reply.accepted {
        return Err(FsError::Protocol(format!(
            "node {addr} refused the connection: {}",
            reply.message
        )));
    }

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
    /// Connects to the first reachable node of `conf.cluster`.
    pub async fn connect(conf: &ClientConf) -> FsResult<Client> {
        let mut last = FsError::InvalidArgument("client.cluster lists no node".into());
        for addr in &conf.cluster {
            match Self::connect_to(addr, conf).await {
                Ok(client) => return Ok(client),
                Err(e @ FsError::Protocol(_)) => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn connect_to(addr: &str, conf: &ClientConf) -> FsResult<Client> {
        let mut conns = Vec::new();
        let mut hello = None;
        for _ in 0..conf.connections.max(1) {
            let (conn, reply) = open(addr, conf.connect_timeout.0).await?;
            conns.push(conn);
            hello = Some(reply);
        }
        let hello =
            hello.ok_or_else(|| FsError::InvalidArgument("client.connections is 0".into()))?;
        Ok(Client {
            rpc: Arc::new(Rpc {
                conns,
                next_conn: AtomicUsize::new(0),
                next_id: AtomicU64::new(1),
            }),
            data: crate::io::DataPool::new(conf.connect_timeout.0),
            io: crate::io::IoConf::from(conf),
            timeout: conf.request_timeout.0,
            node_addr: addr.to_string(),
            cluster_id: hello.cluster_id,
            node_id: hello.node_id,
        })
    }

    /// Sends a request and waits for its typed reply.
    pub async fn call<R: Call>(&self, request: R) -> FsResult<R::Reply> {
        let rpc = &self.rpc;
        let id = rpc.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = &rpc.conns[rpc.next_conn.fetch_add(1, Ordering::Relaxed) % rpc.conns.len()];
        if conn.closed.load(Ordering::SeqCst) {
            return Err(FsError::Unavailable(format!(
                "connection to node {} is closed",
                self.node_addr
            )));
        }
        let frame = RequestFrame {
            id,
            request: request.into(),
        };
        let bytes = to_bytes("request", &frame).map_err(FsError::from)?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, tx);
        if conn.tx.send(bytes).is_err() {
            conn.pending.lock().remove(&id);
            return Err(FsError::Unavailable(format!(
                "connection to node {} is closed",
                self.node_addr
            )));
        }
        // The server answers within its own request timeout; allow a margin.
        match tokio::time::timeout(self.timeout + Duration::from_secs(5), rx).await {
            Ok(Ok(result)) => R::reply(result?),
            Ok(Err(_)) => Err(FsError::Unavailable(format!(
                "connection to node {} lost",
                self.node_addr
            ))),
            Err(_) => {
                conn.pending.lock().remove(&id);
                Err(FsError::TimedOut(format!(
                    "no reply from node {} in {:?}",
                    self.node_addr, self.timeout
                )))
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

    pub async fn setattr(&self, path: &str, set: SetAttr) -> FsResult<Attr> {
        self.call(SetAttrs {
            path: path.into(),
            set,
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

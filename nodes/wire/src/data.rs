//! The client side of the data port: connections to a node's data port
//! (pooled per address), block streams read chunk by chunk and verified
//! against their unit crcs, and block writes. The client library's reader
//! and writer use them, and so does a node copying a replica from another.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use curvine_messages::block::{
    chunk_header, unit_crcs, units, verify_units, DataNode, DataReply, DataRequest, TierKind,
    Token, CHECKSUM_UNIT, DATA_MAGIC, DATA_VERSION, MAX_CHUNK,
};
use curvine_messages::codec::{from_bytes, to_bytes};
use curvine_messages::rpc::BlockGrant;
use curvine_messages::{FsError, FsResult};

use crate::frame::{read_frame, write_frame};
use crate::tls::{Tls, Transport};

// ---- counters -----------------------------------------------------------------

static CHECKSUM_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Checksum mismatches this process detected in bytes it read (each also
/// failed its read with EIO).
pub fn checksum_errors() -> u64 {
    CHECKSUM_ERRORS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Verifies bytes, counting a mismatch.
pub fn verified(data: &[u8], crcs: &[u32], first_unit: usize, what: &str) -> FsResult<()> {
    let r = verify_units(data, crcs, first_unit, what);
    if r.is_err() {
        CHECKSUM_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    r
}

// ---- data connections -------------------------------------------------------

/// A connection to a node's data port.
pub struct DataConn {
    stream: BufReader<Transport>,
    addr: String,
    /// Longest time a request or chunk may take to move: a node that takes
    /// or sends nothing for this long fails the request (the reader then
    /// tries another copy) instead of holding it.
    idle: Duration,
    pub node_id: String,
    pub host_key: String,
}

fn lost(addr: &str, e: impl std::fmt::Display) -> FsError {
    FsError::Unavailable(format!("data port {addr}: {e}"))
}

/// `io` within `idle`, else `TimedOut` naming the data port.
async fn within<T>(
    idle: Duration,
    addr: &str,
    io: impl std::future::Future<Output = FsResult<T>>,
) -> FsResult<T> {
    tokio::time::timeout(idle, io).await.unwrap_or_else(|_| {
        Err(FsError::TimedOut(format!(
            "data port {addr}: nothing moved for {idle:?} (client.request_timeout)"
        )))
    })
}

impl DataConn {
    async fn connect(
        addr: &str,
        timeout: Duration,
        idle: Duration,
        tls: Option<&Tls>,
    ) -> FsResult<DataConn> {
        let stream = Transport::dial(addr, timeout, tls)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut => {
                    FsError::TimedOut(format!("connecting to data port {addr}: {e}"))
                }
                _ => lost(addr, e),
            })?;
        let mut conn = DataConn {
            stream: BufReader::with_capacity(256 * 1024, stream),
            addr: addr.to_string(),
            idle,
            node_id: String::new(),
            host_key: String::new(),
        };
        let mut hello = DATA_MAGIC.to_vec();
        hello.extend_from_slice(&DATA_VERSION.to_be_bytes());
        let s = conn.stream.get_mut();
        s.write_all(&hello).await.map_err(|e| lost(addr, e))?;
        match tokio::time::timeout(timeout, conn.recv()).await {
            Ok(Ok(DataReply::Hello {
                accepted: true,
                node_id,
                host_key,
                ..
            })) => {
                conn.node_id = node_id;
                conn.host_key = host_key;
                Ok(conn)
            }
            Ok(Ok(DataReply::Hello { message, .. })) => Err(FsError::Protocol(format!(
                "data port {addr} refused the connection: {message}"
            ))),
            Ok(Ok(other)) => Err(FsError::Protocol(format!(
                "data port {addr} answered {} to hello",
                other.kind_name()
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(FsError::TimedOut(format!(
                "handshake with data port {addr}"
            ))),
        }
    }

    async fn send(&mut self, request: &DataRequest) -> FsResult<()> {
        // The request joins the trace the running task works for.
        let frame = curvine_messages::block::DataFrameRef {
            trace: curvine_runtime::trace::current(),
            request,
        };
        let bytes = to_bytes("data request", &frame).map_err(FsError::from)?;
        let (idle, addr) = (self.idle, self.addr.as_str());
        let s = self.stream.get_mut();
        within(idle, addr, async {
            write_frame(s, &bytes).await.map_err(|e| lost(addr, e))?;
            s.flush().await.map_err(|e| lost(addr, e))
        })
        .await
    }

    async fn recv(&mut self) -> FsResult<DataReply> {
        let (idle, addr) = (self.idle, self.addr.as_str());
        let frame = within(idle, addr, async {
            read_frame(&mut self.stream)
                .await
                .map_err(|e| lost(addr, e))?
                .ok_or_else(|| lost(addr, "closed by the node"))
        })
        .await?;
        match from_bytes::<DataReply>("data reply", &frame).map_err(FsError::from)? {
            DataReply::Error(e) => Err(e),
            reply => Ok(reply),
        }
    }

    pub async fn call(&mut self, request: &DataRequest) -> FsResult<DataReply> {
        self.send(request).await?;
        self.recv().await
    }

    /// Reads one chunk of a block stream: header with unit crcs, then bytes,
    /// verified before they are returned.
    /// `data` is a buffer to reuse (its old bytes are overwritten).
    async fn read_chunk(
        &mut self,
        data: Vec<u8>,
        first_unit: usize,
        what: &str,
    ) -> FsResult<Vec<u8>> {
        let (idle, addr) = (self.idle, self.addr.clone());
        within(
            idle,
            &addr,
            self.read_chunk_now(&addr, data, first_unit, what),
        )
        .await
    }

    async fn read_chunk_now(
        &mut self,
        addr: &str,
        mut data: Vec<u8>,
        first_unit: usize,
        what: &str,
    ) -> FsResult<Vec<u8>> {
        let n = self.stream.read_u32().await.map_err(|e| lost(addr, e))?;
        if n == curvine_messages::block::ERROR_CHUNK {
            // The node failed part way (a UFS read): its error follows.
            return Err(match self.recv().await {
                Ok(other) => FsError::Protocol(format!(
                    "data port {addr} sent {} after an error mark",
                    other.kind_name()
                )),
                Err(e) => e,
            });
        }
        let n = n as usize;
        if n == 0 || n > MAX_CHUNK {
            return Err(FsError::Protocol(format!(
                "data port {addr} sent a chunk of {n} bytes"
            )));
        }
        let mut crcs = vec![0u32; units(n as u64)];
        for c in crcs.iter_mut() {
            *c = self.stream.read_u32().await.map_err(|e| lost(addr, e))?;
        }
        // The bytes go into the buffer's spare room: a recycled buffer
        // keeps its pages, a new one is not zeroed first.
        data.clear();
        data.reserve_exact(n);
        while data.len() < n {
            let rest = (n - data.len()) as u64;
            let got = (&mut self.stream)
                .take(rest)
                .read_buf(&mut data)
                .await
                .map_err(|e| lost(addr, e))?;
            if got == 0 {
                return Err(lost(
                    addr,
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                ));
            }
        }
        verified(&data, &crcs, first_unit, what)?;
        Ok(data)
    }
}

/// Idle data connections by address, shared by the clones of a client.
#[derive(Clone)]
pub struct DataPool {
    idle: Arc<Mutex<HashMap<String, Vec<DataConn>>>>,
    connect_timeout: Duration,
    /// How long a data connection may stall (see `DataConn::idle`).
    stall_timeout: Duration,
    /// TLS settings when the data port is encrypted.
    tls: Option<Arc<Tls>>,
    /// This host's key, compared with a node's to allow short-circuit.
    host_key: Arc<String>,
}

impl DataPool {
    pub fn new(
        connect_timeout: Duration,
        stall_timeout: Duration,
        tls: Option<Arc<Tls>>,
    ) -> DataPool {
        DataPool {
            idle: Default::default(),
            connect_timeout,
            stall_timeout,
            tls,
            host_key: Arc::new(crate::host::host_key()),
        }
    }

    pub async fn get(&self, addr: &str) -> FsResult<DataConn> {
        let idle = self.idle.lock().get_mut(addr).and_then(Vec::pop);
        match idle {
            Some(conn) => Ok(conn),
            None => {
                DataConn::connect(
                    addr,
                    self.connect_timeout,
                    self.stall_timeout,
                    self.tls.as_deref(),
                )
                .await
            }
        }
    }

    pub fn put(&self, conn: DataConn) {
        let mut idle = self.idle.lock();
        let list = idle.entry(conn.addr.clone()).or_default();
        if list.len() < 32 {
            list.push(conn);
        }
    }

    pub fn is_local(&self, node: &DataNode) -> bool {
        !node.host_key.is_empty() && node.host_key == *self.host_key
    }
}

pub fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> FsError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        FsError::NoSpace(format!("{what}: {e}"))
    } else {
        FsError::Io(format!("{what}: {e}"))
    }
}

/// A block streamed from a data port, chunk by chunk, by a task of its own.
pub struct BlockStream {
    pub index: u32,
    pub rx: mpsc::Receiver<FsResult<(u64, Vec<u8>)>>,
    /// Block offset of the next chunk's first byte (the stream starts at
    /// the checksum unit holding the offset asked for).
    pub next: u64,
    /// Consumed chunks go back to the streaming task for reuse.
    pub recycle: mpsc::UnboundedSender<Vec<u8>>,
    task: JoinHandle<()>,
}

impl Drop for BlockStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where to read a block from.
#[derive(Clone)]
pub struct BlockSource {
    pub node: DataNode,
    pub token: Token,
    /// File bytes in the block.
    pub len: u64,
    /// Read through the node from the file's UFS object (the block is not
    /// cached): the file's path and the block's index.
    pub fill: Option<(Arc<str>, u32)>,
}

/// Streams bytes `[offset, offset + len)` of a block (`len` capped at the block's end).
pub fn start_stream(
    pool: &DataPool,
    src: &BlockSource,
    index: u32,
    offset: u64,
    len: u64,
) -> BlockStream {
    let (tx, rx) = mpsc::channel(8);
    let (recycle, mut recycled) = mpsc::unbounded_channel::<Vec<u8>>();
    let pool = pool.clone();
    let src = src.clone();
    let task = tokio::spawn(curvine_runtime::trace::scope(
        curvine_runtime::trace::current(),
        async move {
            let result = async {
                let mut conn = pool.get(&src.node.data_addr).await?;
                let what = format!(
                    "block {:#x} from node {}",
                    src.token.block, src.node.node_id
                );
                let len = len.min(src.len.saturating_sub(offset));
                let request = match &src.fill {
                    None => DataRequest::Read {
                        token: src.token.clone(),
                        offset,
                        len,
                    },
                    Some((path, index)) => DataRequest::Fill {
                        token: src.token.clone(),
                        path: path.to_string(),
                        index: *index,
                        offset,
                        len,
                    },
                };
                let reply = conn.call(&request).await?;
                let DataReply::Reading { offset: start, len } = reply else {
                    return Err(FsError::Protocol(format!(
                        "{what}: unexpected reply {}",
                        reply.kind_name()
                    )));
                };
                let mut pos = start;
                while pos < start + len {
                    let buf = recycled.try_recv().unwrap_or_default();
                    let data = conn
                        .read_chunk(buf, (pos / CHECKSUM_UNIT as u64) as usize, &what)
                        .await?;
                    let n = data.len() as u64;
                    if tx.send(Ok((pos, data))).await.is_err() {
                        return Ok(()); // the reader went away; drop the connection
                    }
                    pos += n;
                }
                pool.put(conn);
                Ok(())
            }
            .await;
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        },
    ));
    BlockStream {
        index,
        rx,
        next: offset / CHECKSUM_UNIT as u64 * CHECKSUM_UNIT as u64,
        recycle,
        task,
    }
}

/// Copies a whole block (`len` stored bytes) from a node's data port into
/// the file at `dst`, verified on the way; returns its unit crcs. Used by a
/// node that takes a replica.
pub async fn copy_block(
    pool: &DataPool,
    node: &DataNode,
    token: &Token,
    len: u64,
    dst: &std::path::Path,
) -> FsResult<Vec<u32>> {
    let src = BlockSource {
        node: node.clone(),
        token: token.clone(),
        len,
        fill: None,
    };
    let what = format!("copy of block {:#x} into {}", token.block, dst.display());
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .map_err(|e| io_err(&what, e))?;
    let crcs = copy_block_into(pool, &src, &file, 0, &what).await?;
    tokio::task::spawn_blocking(move || file.sync_data())
        .await
        .map_err(|e| FsError::Io(format!("{what}: {e}")))?
        .map_err(|e| io_err(&what, e))?;
    Ok(crcs)
}

/// Copies a whole block (`src.len` bytes) from a node's data port into
/// `file` from `offset` on, verified on the way; returns its unit crcs.
/// `what` names the copy in errors.
pub async fn copy_block_into(
    pool: &DataPool,
    src: &BlockSource,
    file: &std::fs::File,
    offset: u64,
    what: &str,
) -> FsResult<Vec<u32>> {
    use std::os::unix::fs::FileExt;
    let len = src.len;
    // Writes (and the tier's page cache they may wait for) run off the
    // runtime's workers.
    let file = std::sync::Arc::new(file.try_clone().map_err(|e| io_err(what, e))?);
    let mut crcs = Vec::with_capacity(len.div_ceil(CHECKSUM_UNIT as u64) as usize);
    let mut stream = start_stream(pool, src, 0, 0, len);
    let mut done = 0u64;
    while done < len {
        let Some(item) = stream.rx.recv().await else {
            return Err(FsError::Io(format!("{what}: the stream ended early")));
        };
        let (start, data) = item?;
        if start != done {
            return Err(FsError::Protocol(format!(
                "{what}: a chunk at {start} where {done} was expected"
            )));
        }
        crcs.extend(curvine_messages::block::unit_crcs(&data));
        let (f, at) = (file.clone(), offset + done);
        let data = tokio::task::spawn_blocking(move || f.write_all_at(&data, at).map(|()| data))
            .await
            .map_err(|e| FsError::Io(format!("{what}: {e}")))?
            .map_err(|e| io_err(what, e))?;
        done += data.len() as u64;
        let _ = stream.recycle.send(data);
    }
    Ok(crcs)
}

/// A whole block read from a node's data port, chunk by chunk, verified.
pub struct BlockChunks {
    stream: BlockStream,
    len: u64,
    done: u64,
}

impl BlockChunks {
    /// Streams the first `len` bytes of the block `token` names from `node`.
    pub fn start(pool: &DataPool, node: &DataNode, token: &Token, len: u64) -> BlockChunks {
        let src = BlockSource {
            node: node.clone(),
            token: token.clone(),
            len,
            fill: None,
        };
        BlockChunks {
            stream: start_stream(pool, &src, 0, 0, len),
            len,
            done: 0,
        }
    }

    /// The next chunk, `None` after the last byte.
    pub async fn next(&mut self) -> Option<FsResult<Vec<u8>>> {
        if self.done >= self.len {
            return None;
        }
        match self.stream.rx.recv().await {
            Some(Ok((start, data))) => {
                if start != self.done {
                    return Some(Err(FsError::Protocol(format!(
                        "block {:#x}: a chunk at {start} where {} was expected",
                        self.stream.index, self.done
                    ))));
                }
                let keep = ((self.len - self.done) as usize).min(data.len());
                self.done += keep as u64;
                let mut data = data;
                data.truncate(keep);
                Some(Ok(data))
            }
            Some(Err(e)) => Some(Err(e)),
            None => Some(Err(FsError::Io(format!(
                "block stream ended after {} of {} bytes",
                self.done, self.len
            )))),
        }
    }
}

/// Opens the write of one block on its node's data port: the node reserves
/// room for it (all of `size_hint` where a tier has room for it, else a first
/// part, [`curvine_messages::block::FIRST_RESERVATION`], grown as the bytes
/// arrive or as the writer asks) before it answers, so a block a tier has no
/// room for is refused here, before any of its bytes are taken.
pub async fn open_remote_block(
    pool: &DataPool,
    grant: &BlockGrant,
    tier: Option<TierKind>,
    size_hint: u64,
) -> FsResult<DataConn> {
    let mut conn = pool.get(&grant.node.data_addr).await?;
    match conn
        .call(&DataRequest::Write {
            token: grant.token.clone(),
            tier,
            size_hint,
        })
        .await?
    {
        DataReply::Ready => Ok(conn),
        other => Err(FsError::Protocol(format!(
            "unexpected reply {} to a block write",
            other.kind_name()
        ))),
    }
}

/// Streams one block opened by [`open_remote_block`]: chunks from `rx`,
/// then the commit.
pub async fn stream_remote_block(
    pool: DataPool,
    mut conn: DataConn,
    mut rx: mpsc::Receiver<Vec<u8>>,
) -> FsResult<(u64, u32)> {
    let mut header = Vec::with_capacity(4 + 4 * (MAX_CHUNK / CHECKSUM_UNIT));
    let (idle, addr) = (conn.idle, conn.addr.clone());
    let sent: FsResult<()> = async {
        while let Some(chunk) = rx.recv().await {
            let crcs = unit_crcs(&chunk);
            chunk_header(chunk.len(), &crcs, &mut header);
            let s = conn.stream.get_mut();
            within(idle, &addr, async {
                s.write_all(&header).await.map_err(|e| lost(&addr, e))?;
                s.write_all(&chunk).await.map_err(|e| lost(&addr, e))
            })
            .await?;
        }
        let s = conn.stream.get_mut();
        within(idle, &addr, async {
            s.write_all(&0u32.to_be_bytes())
                .await
                .map_err(|e| lost(&addr, e))?;
            s.flush().await.map_err(|e| lost(&addr, e))
        })
        .await
    }
    .await;
    // The node's reply says what went wrong when sending failed.
    let reply = conn.recv().await;
    match (sent, reply) {
        (_, Ok(DataReply::Committed { len, crc })) => {
            pool.put(conn);
            Ok((len, crc))
        }
        (_, Err(e)) => Err(e),
        (Err(e), _) => Err(e),
        (Ok(()), Ok(other)) => Err(FsError::Protocol(format!(
            "unexpected reply {} to a block write",
            other.kind_name()
        ))),
    }
}

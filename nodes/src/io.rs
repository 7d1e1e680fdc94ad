//! File I/O of the client library: [`FileWriter`] and [`FileReader`].
//!
//! Bytes go to and from block files either through a node's data port or,
//! when the block's node runs on this host and grants it, directly in the
//! block file (short-circuit). Either way every byte read is checked against
//! the crc32c of its 64KiB unit; a mismatch is EIO, never wrong bytes.
//!
//! Writes are copy-on-write at block granularity: a block that is written
//! (even one byte of it) is replaced by a new block holding the old bytes
//! around the new ones, and the file switches to the new blocks when the
//! writer closes it. Readers of the old version keep reading it until they
//! reopen (close-to-open consistency).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use curvine_conf::ClientConf;
use curvine_messages::block::{
    chunk_header, unit_crcs, units, verify_units, BlockInfo, Crc32c, DataNode, DataReply,
    DataRequest, FileSpec, ReadBlock, TierKind, Token, CHECKSUM_UNIT, DATA_MAGIC, DATA_VERSION,
    MAX_CHUNK,
};
use curvine_messages::codec::{from_bytes, to_bytes};
use curvine_messages::rpc::{AddBlock, BlockGrant, CompleteFile, OpenFile, OpenRead, ReadOpen};
use curvine_messages::{Attr, FsError, FsResult};

use crate::client::Client;
use crate::server::{read_frame, write_frame};
use crate::tls::{Tls, Transport};

/// Client settings for file I/O.
#[derive(Debug, Clone)]
pub struct IoConf {
    pub short_circuit: bool,
    pub read_ahead: u32,
}

impl From<&ClientConf> for IoConf {
    fn from(c: &ClientConf) -> Self {
        IoConf {
            short_circuit: c.short_circuit,
            read_ahead: c.read_ahead,
        }
    }
}

// ---- counters -----------------------------------------------------------------

static CHECKSUM_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Checksum mismatches this process detected in bytes it read (each also
/// failed its read with EIO).
pub fn checksum_errors() -> u64 {
    CHECKSUM_ERRORS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Verifies bytes, counting a mismatch.
fn verified(data: &[u8], crcs: &[u32], first_unit: usize, what: &str) -> FsResult<()> {
    let r = verify_units(data, crcs, first_unit, what);
    if r.is_err() {
        CHECKSUM_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    r
}

/// Short-circuit reads and writes complete without ever waiting, so a task
/// doing nothing else would keep its runtime worker (and any task queued
/// behind it there) to itself. Yield every few MiB.
const YIELD_EVERY: usize = 4 << 20;

async fn yield_sometimes(since: &mut usize, n: usize) {
    *since += n;
    if *since >= YIELD_EVERY {
        *since = 0;
        tokio::task::yield_now().await;
    }
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
            trace: curvine_actors::trace::current(),
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

    async fn call(&mut self, request: &DataRequest) -> FsResult<DataReply> {
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
        // A recycled buffer is only shortened: no zeroing, no new pages.
        if data.len() >= n {
            data.truncate(n);
        } else {
            data.resize(n, 0);
        }
        self.stream
            .read_exact(&mut data)
            .await
            .map_err(|e| lost(addr, e))?;
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
            host_key: Arc::new(crate::data::host_key()),
        }
    }

    async fn get(&self, addr: &str) -> FsResult<DataConn> {
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

    fn put(&self, conn: DataConn) {
        let mut idle = self.idle.lock();
        let list = idle.entry(conn.addr.clone()).or_default();
        if list.len() < 32 {
            list.push(conn);
        }
    }

    fn is_local(&self, node: &DataNode) -> bool {
        !node.host_key.is_empty() && node.host_key == *self.host_key
    }
}

fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> FsError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        FsError::NoSpace(format!("{what}: {e}"))
    } else {
        FsError::Io(format!("{what}: {e}"))
    }
}

/// Who this client is, for write leases.
fn client_name() -> String {
    let key = crate::data::host_key();
    let host = key.split('/').next().unwrap_or("");
    format!("{host}:{}", std::process::id())
}

// ---- reading ----------------------------------------------------------------

/// A block file opened directly (short-circuit).
struct LocalBlock {
    file: File,
    stored: u64,
    crcs: Vec<u32>,
    what: String,
}

impl LocalBlock {
    /// Reads `buf.len()` bytes at `offset`, verified. Reads straight into
    /// `buf` when the range is whole checksum units.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> FsResult<()> {
        let unit = CHECKSUM_UNIT as u64;
        let end = offset + buf.len() as u64;
        if end > self.stored {
            return Err(FsError::Io(format!(
                "{}: read past the block's {} bytes",
                self.what, self.stored
            )));
        }
        let first = (offset / unit) as usize;
        if offset.is_multiple_of(unit) && (end.is_multiple_of(unit) || end == self.stored) {
            self.file
                .read_exact_at(buf, offset)
                .map_err(|e| io_err(&self.what, e))?;
            return verified(buf, &self.crcs[first..], first, &self.what);
        }
        let start = offset / unit * unit;
        let stop = end.div_ceil(unit).saturating_mul(unit).min(self.stored);
        let mut scratch = vec![0u8; (stop - start) as usize];
        self.file
            .read_exact_at(&mut scratch, start)
            .map_err(|e| io_err(&self.what, e))?;
        verified(&scratch, &self.crcs[first..], first, &self.what)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&scratch[skip..skip + buf.len()]);
        Ok(())
    }
}

/// A block streamed from a data port, chunk by chunk, by a task of its own.
struct RemoteStream {
    index: u32,
    rx: mpsc::Receiver<FsResult<(u64, Vec<u8>)>>,
    /// The chunk being consumed: block offset of its first byte, bytes.
    chunk: Option<(u64, Vec<u8>)>,
    /// Consumed chunks go back to the streaming task for reuse.
    recycle: mpsc::UnboundedSender<Vec<u8>>,
    task: JoinHandle<()>,
}

impl RemoteStream {
    fn take(&mut self, next: (u64, Vec<u8>)) {
        if let Some((_, old)) = self.chunk.replace(next) {
            let _ = self.recycle.send(old);
        }
    }
}

impl Drop for RemoteStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where to read a block from.
#[derive(Clone)]
struct Source {
    node: DataNode,
    token: Token,
    /// File bytes in the block.
    len: u64,
    /// Read through the node from the file's UFS object (the block is not
    /// cached): the file's path and the block's index.
    fill: Option<(Arc<str>, u32)>,
}

/// Streams bytes `[offset, offset + len)` of a block (`len` capped at the block's end).
fn start_stream(pool: &DataPool, src: &Source, index: u32, offset: u64, len: u64) -> RemoteStream {
    let (tx, rx) = mpsc::channel(8);
    let (recycle, mut recycled) = mpsc::unbounded_channel::<Vec<u8>>();
    let pool = pool.clone();
    let src = src.clone();
    let task = tokio::spawn(curvine_actors::trace::scope(
        curvine_actors::trace::current(),
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
    RemoteStream {
        index,
        rx,
        chunk: None,
        recycle,
        task,
    }
}

/// Opens a block file directly when short-circuit is allowed for its node;
/// `None` means: read it over the data port.
async fn open_local_block(client: &Client, src: &Source) -> Option<LocalBlock> {
    if !client.io.short_circuit || !client.data.is_local(&src.node) {
        return None;
    }
    // The block may move between the grant and the open: ask again once.
    for _ in 0..2 {
        let mut conn = client.data.get(&src.node.data_addr).await.ok()?;
        let reply = conn
            .call(&DataRequest::OpenLocal {
                token: src.token.clone(),
            })
            .await;
        let Ok(DataReply::Local { path, len, crcs }) = reply else {
            return None;
        };
        client.data.put(conn);
        if let Ok(file) = File::open(&path) {
            return Some(LocalBlock {
                file,
                stored: len,
                crcs,
                what: format!("block {:#x} ({path})", src.token.block),
            });
        }
    }
    None
}

/// Reads `buf.len()` bytes of a block at `off` in one go (short-circuit
/// when allowed, else one request on the data port).
async fn read_once(client: &Client, src: &Source, off: u64, buf: &mut [u8]) -> FsResult<()> {
    match open_local_block(client, src).await {
        Some(block) => block.read_at(off, buf),
        None => fetch_remote(client, src, off, buf).await,
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
    let src = Source {
        node: node.clone(),
        token: token.clone(),
        len,
        fill: None,
    };
    let what = format!("copy of block {:#x} into {}", token.block, dst.display());
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .map_err(|e| io_err(&what, e))?;
    let mut crcs = Vec::with_capacity(len.div_ceil(CHECKSUM_UNIT as u64) as usize);
    let mut stream = start_stream(pool, &src, 0, 0, len);
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
        file.write_all(&data).map_err(|e| io_err(&what, e))?;
        done += data.len() as u64;
        let _ = stream.recycle.send(data);
    }
    file.sync_data().map_err(|e| io_err(&what, e))?;
    Ok(crcs)
}

/// A whole block read from a node's data port, chunk by chunk, verified.
pub struct BlockChunks {
    stream: RemoteStream,
    len: u64,
    done: u64,
}

impl BlockChunks {
    /// Streams the first `len` bytes of the block `token` names from `node`.
    pub fn start(pool: &DataPool, node: &DataNode, token: &Token, len: u64) -> BlockChunks {
        let src = Source {
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

/// Reads `buf.len()` bytes of a block at `off` with one data-port request.
async fn fetch_remote(client: &Client, src: &Source, off: u64, buf: &mut [u8]) -> FsResult<()> {
    let mut stream = start_stream(&client.data, src, 0, off, buf.len() as u64);
    let mut done = 0;
    while done < buf.len() {
        let Some(item) = stream.rx.recv().await else {
            return Err(FsError::Io(format!(
                "block {:#x}: stream ended early",
                src.token.block
            )));
        };
        let (start, data) = item?;
        let from = (off + done as u64).saturating_sub(start) as usize;
        if from >= data.len() {
            continue;
        }
        let n = (data.len() - from).min(buf.len() - done);
        buf[done..done + n].copy_from_slice(&data[from..from + n]);
        done += n;
        let _ = stream.recycle.send(data);
    }
    Ok(())
}

/// Block files a reader keeps open for short-circuit reads.
const LOCAL_BLOCKS_OPEN: usize = 64;

/// Reads a file as it was when opened.
pub struct FileReader {
    client: Client,
    pub attr: Attr,
    blocks: BTreeMap<u32, ReadBlock>,
    nodes: HashMap<String, DataNode>,
    bs: u64,
    pos: u64,
    local: HashMap<u32, Arc<LocalBlock>>,
    /// Local blocks that could not be opened directly (read remotely instead).
    no_local: std::collections::HashSet<u32>,
    stream: Option<RemoteStream>,
    ahead: VecDeque<RemoteStream>,
    /// Bytes read since the last yield (see [`yield_sometimes`]).
    since_yield: usize,
    /// (block, node) reads that failed; other replicas are used instead.
    failed: std::collections::HashSet<(u32, String)>,
    /// A UFS file: blocks that are not cached are read through this node.
    ufs: Option<(curvine_messages::rpc::UfsRead, Arc<str>)>,
}

impl FileReader {
    pub async fn open(client: &Client, path: &str) -> FsResult<FileReader> {
        let open: ReadOpen = client.call(OpenRead { path: path.into() }).await?;
        Ok(Self::from_open(client, open, path))
    }

    fn from_open(client: &Client, open: ReadOpen, path: &str) -> FileReader {
        FileReader {
            ufs: open.ufs.map(|u| (u, Arc::from(path))),
            client: client.clone(),
            bs: open.attr.block_size.max(1),
            attr: open.attr,
            blocks: open.blocks.into_iter().map(|b| (b.info.index, b)).collect(),
            nodes: open
                .nodes
                .into_iter()
                .map(|n| (n.node_id.clone(), n))
                .collect(),
            pos: 0,
            local: HashMap::new(),
            no_local: Default::default(),
            stream: None,
            ahead: VecDeque::new(),
            since_yield: 0,
            failed: Default::default(),
        }
    }

    pub fn size(&self) -> u64 {
        self.attr.size
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    pub fn seek(&mut self, pos: u64) {
        self.pos = pos;
    }

    /// Where to read block `index`: a live node holding it, one on this
    /// host first, skipping nodes that failed this reader.
    fn source(&self, index: u32) -> FsResult<Option<Source>> {
        let Some(block) = self.blocks.get(&index) else {
            return Ok(self.fill_source(index));
        };
        let candidates = || {
            block
                .info
                .locs
                .iter()
                .filter(|id| !self.failed.contains(&(index, (*id).clone())))
                .filter_map(|id| self.nodes.get(id))
        };
        let node = candidates()
            .find(|n| self.client.data.is_local(n))
            .or_else(|| candidates().next());
        if node.is_none() {
            // Every copy is on a node that is down or failed: a UFS file
            // reads the block from its object instead.
            if let Some(src) = self.fill_source(index) {
                return Ok(Some(src));
            }
        }
        let node = node.ok_or_else(|| {
            let failed: Vec<&String> = block
                .info
                .locs
                .iter()
                .filter(|id| self.failed.contains(&(index, (*id).clone())))
                .collect();
            if failed.is_empty() {
                FsError::NodeDown(format!(
                    "block {:#x} (index {index}) is only on node(s) {}, which are down",
                    block.info.id,
                    block.info.locs.join(", ")
                ))
            } else {
                FsError::Io(format!(
                    "block {:#x} (index {index}): every node holding it failed ({})",
                    block.info.id,
                    block.info.locs.join(", ")
                ))
            }
        })?;
        Ok(Some(Source {
            node: node.clone(),
            token: block.token.clone(),
            len: block.info.len,
            fill: None,
        }))
    }

    /// A block of a UFS file that is not cached: read through a node.
    fn fill_source(&self, index: u32) -> Option<Source> {
        let (ufs, path) = self.ufs.as_ref()?;
        let start = index as u64 * self.bs;
        if start >= self.attr.size {
            return None;
        }
        Some(Source {
            node: ufs.node.clone(),
            token: ufs.token.clone(),
            len: self.bs.min(self.attr.size - start),
            fill: Some((path.clone(), index)),
        })
    }

    async fn open_local(&mut self, index: u32, src: &Source) -> Option<Arc<LocalBlock>> {
        if src.fill.is_some() {
            return None;
        }
        if self.no_local.contains(&index) {
            return None;
        }
        match open_local_block(&self.client, src).await {
            Some(block) => {
                // Random readers jump between blocks: keep a good number of
                // them open (each reopen is a request to the node).
                if self.local.len() >= LOCAL_BLOCKS_OPEN {
                    if let Some(&drop) = self.local.keys().find(|i| **i != index) {
                        self.local.remove(&drop);
                    }
                }
                let block = Arc::new(block);
                self.local.insert(index, block.clone());
                Some(block)
            }
            None => {
                self.no_local.insert(index);
                None
            }
        }
    }

    /// Reads at `offset` without waiting, when every byte asked for is in
    /// a block file of this host the reader has open (short-circuit):
    /// `None` when the read needs the node or the network. Verified like
    /// every read.
    pub fn read_local_now(&mut self, offset: u64, buf: &mut [u8]) -> Option<FsResult<usize>> {
        if offset >= self.attr.size || buf.is_empty() {
            return Some(Ok(0));
        }
        let index = (offset / self.bs) as u32;
        let off = offset % self.bs;
        let block = self.blocks.get(&index)?;
        let n = (buf.len() as u64)
            .min(self.attr.size - offset)
            .min(self.bs - off)
            .min(block.info.len.saturating_sub(off)) as usize;
        if n == 0 {
            return None;
        }
        let local = self.local.get(&index)?;
        Some(local.read_at(off, &mut buf[..n]).map(|_| n))
    }

    /// Reads at the current position; returns 0 at the end of the file.
    pub async fn read(&mut self, buf: &mut [u8]) -> FsResult<usize> {
        let n = self.read_inner(self.pos, buf, true).await?;
        self.pos += n as u64;
        Ok(n)
    }

    /// Reads at `offset` without moving the position.
    pub async fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        self.read_inner(offset, buf, false).await
    }

    /// Fills `buf` from `offset` as far as the file goes.
    pub async fn read_full_at(&mut self, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = self
                .read_inner(offset + done as u64, &mut buf[done..], false)
                .await?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    /// Reads from one replica; when that node fails, from the next.
    async fn read_inner(&mut self, pos: u64, buf: &mut [u8], sequential: bool) -> FsResult<usize> {
        loop {
            match self.read_once(pos, buf, sequential).await {
                Err(e) if !matches!(e, FsError::InvalidArgument(_) | FsError::NodeDown(_)) => {
                    let index = (pos / self.bs) as u32;
                    let Ok(Some(src)) = self.source(index) else {
                        return Err(e);
                    };
                    if src.fill.is_some() {
                        // Read from the UFS through a node: nothing else to try.
                        return Err(e);
                    }
                    self.failed.insert((index, src.node.node_id.clone()));
                    if !matches!(self.source(index), Ok(Some(_))) {
                        return Err(match e {
                            FsError::Unavailable(d) | FsError::TimedOut(d) => FsError::Io(format!(
                                "reading block {index} from node {}: {d}",
                                src.node.node_id
                            )),
                            other => other,
                        });
                    }
                    tracing::warn!(node = %src.node.node_id, error = %e, "reading a block failed; trying another replica");
                    self.stream = None;
                    self.ahead.clear();
                    self.local.remove(&index);
                    self.no_local.remove(&index);
                }
                other => return other,
            }
        }
    }

    async fn read_once(&mut self, pos: u64, buf: &mut [u8], sequential: bool) -> FsResult<usize> {
        if pos >= self.attr.size || buf.is_empty() {
            return Ok(0);
        }
        let index = (pos / self.bs) as u32;
        let off = pos % self.bs;
        let mut n = (buf.len() as u64)
            .min(self.attr.size - pos)
            .min(self.bs - off) as usize;
        let len = match self.blocks.get(&index) {
            Some(block) if off < block.info.len => block.info.len,
            None if self.ufs.is_some() => self.bs.min(self.attr.size - index as u64 * self.bs),
            // A hole, or past the block's bytes up to the size: zeros.
            _ => {
                buf[..n].fill(0);
                return Ok(n);
            }
        };
        n = n.min((len - off) as usize);
        let local = match self.local.get(&index).cloned() {
            Some(local) => local,
            None => {
                let src = self
                    .source(index)?
                    .ok_or_else(|| FsError::Io(format!("block {index} of the file is unknown")))?;
                match self.open_local(index, &src).await {
                    Some(local) => local,
                    None if sequential => {
                        return self.read_stream(index, &src, off, &mut buf[..n]).await
                    }
                    None => {
                        fetch_remote(&self.client, &src, off, &mut buf[..n]).await?;
                        return Ok(n);
                    }
                }
            }
        };
        local.read_at(off, &mut buf[..n])?;
        yield_sometimes(&mut self.since_yield, n).await;
        Ok(n)
    }

    async fn read_stream(
        &mut self,
        index: u32,
        src: &Source,
        off: u64,
        buf: &mut [u8],
    ) -> FsResult<usize> {
        if self.stream.as_ref().is_none_or(|s| s.index != index) {
            // Take a read-ahead stream of this block if there is one.
            while let Some(s) = self.ahead.pop_front() {
                if s.index == index {
                    self.stream = Some(s);
                    break;
                }
            }
            if self.stream.as_ref().is_none_or(|s| s.index != index) {
                self.stream = Some(start_stream(&self.client.data, src, index, off, u64::MAX));
            }
            // Blocks after this one start streaming now.
            for ahead in 1..=self.client.io.read_ahead {
                let next = index + ahead;
                if self.ahead.iter().any(|s| s.index == next) {
                    continue;
                }
                if let Ok(Some(nsrc)) = self.source(next) {
                    if nsrc.fill.is_some()
                        || !(self.client.io.short_circuit && self.client.data.is_local(&nsrc.node))
                    {
                        self.ahead.push_back(start_stream(
                            &self.client.data,
                            &nsrc,
                            next,
                            0,
                            u64::MAX,
                        ));
                    }
                }
            }
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(FsError::Io("no block stream".into()));
        };
        loop {
            if let Some((start, data)) = &stream.chunk {
                let end = *start + data.len() as u64;
                if off >= *start && off < end {
                    let from = (off - start) as usize;
                    let n = (data.len() - from).min(buf.len());
                    buf[..n].copy_from_slice(&data[from..from + n]);
                    return Ok(n);
                }
                if off < *start {
                    // A backwards seek inside the block: start over.
                    *stream = start_stream(&self.client.data, src, index, off, u64::MAX);
                    continue;
                }
            }
            match stream.rx.recv().await {
                Some(item) => stream.take(item?),
                None => {
                    return Err(FsError::Io(format!(
                        "block {:#x}: stream ended before offset {off}",
                        src.token.block
                    )))
                }
            }
        }
    }

    /// Reads the rest of the file into `out`.
    pub async fn read_to_end(&mut self, out: &mut Vec<u8>) -> FsResult<usize> {
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        loop {
            let n = self.read(&mut buf).await?;
            if n == 0 {
                return Ok(total);
            }
            out.extend_from_slice(&buf[..n]);
            total += n;
        }
    }
}

// ---- writing ----------------------------------------------------------------

/// How a file is opened for writing.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub create: bool,
    pub exclusive: bool,
    pub truncate: bool,
    /// Start at the end of the file.
    pub append: bool,
    /// Replace the whole content at close: the file keeps its old content
    /// (for readers, and if the writer aborts or dies) until the close, then
    /// has exactly what was written. Unlike `truncate`, nothing is lost
    /// before the new content is complete.
    pub replace: bool,
    pub mode: u32,
    pub spec: FileSpec,
    /// Owner (uid, gid) of a file the open creates; default: this process's.
    pub owner: Option<(u32, u32)>,
}

impl WriteOptions {
    /// Create or replace (`>` in a shell).
    pub fn create() -> WriteOptions {
        WriteOptions {
            create: true,
            truncate: true,
            mode: 0o644,
            ..Default::default()
        }
    }
}

enum SinkKind {
    Local {
        file: File,
        conn: DataConn,
        crcs: Vec<u32>,
        unit_crc: Box<Crc32c>,
        unit_fill: usize,
    },
    Remote {
        tx: mpsc::Sender<Vec<u8>>,
        task: JoinHandle<FsResult<(u64, u32)>>,
        buf: Vec<u8>,
    },
}

/// The new block being written.
struct Sink {
    grant: BlockGrant,
    /// Bytes written into the block so far.
    len: u64,
    kind: SinkKind,
}

/// Writes a file; the new content becomes visible when [`FileWriter::close`] returns.
pub struct FileWriter {
    client: Client,
    pub attr: Attr,
    handle: u64,
    bs: u64,
    storage: Option<TierKind>,
    pos: u64,
    size: u64,
    sink: Option<Sink>,
    next: Option<(u32, JoinHandle<FsResult<BlockGrant>>)>,
    finishing: Vec<(BlockGrant, JoinHandle<FsResult<BlockInfo>>)>,
    /// Blocks written by this writer, by index (the newest wins).
    written: BTreeMap<u32, (BlockInfo, BlockGrant)>,
    /// The file as it was when opened, for the bytes around overwritten ranges.
    old: Option<FileReader>,
    failed: bool,
    /// Bytes written since the last yield (see [`yield_sometimes`]).
    since_yield: usize,
    /// The path the file was opened at.
    path: String,
}

impl FileWriter {
    pub async fn open(client: &Client, path: &str, options: &WriteOptions) -> FsResult<FileWriter> {
        let (uid, gid) = options.owner.unwrap_or_else(crate::client::current_owner);
        let open = client
            .call(OpenFile {
                path: path.into(),
                create: options.create,
                exclusive: options.exclusive,
                truncate: options.truncate,
                mode: options.mode,
                uid,
                gid,
                spec: options.spec.clone(),
                client: client_name(),
                append: options.append,
            })
            .await?;
        let old = if open.attr.size > 0 && !open.blocks.is_empty() && !options.replace {
            // The lease is held: this is the content until we close.
            Some(FileReader::open(client, path).await?)
        } else {
            None
        };
        let size = if options.replace { 0 } else { open.attr.size };
        // The block allocated with the open is the first one the writer needs.
        let next = open.first.map(|grant| {
            let index = grant.index;
            (index, tokio::spawn(async move { Ok(grant) }))
        });
        Ok(FileWriter {
            client: client.clone(),
            bs: open.attr.block_size.max(CHECKSUM_UNIT as u64),
            storage: open.attr.storage.or(options.spec.storage),
            handle: open.handle,
            pos: if options.append { size } else { 0 },
            size,
            attr: open.attr,
            sink: None,
            next,
            finishing: Vec::new(),
            written: BTreeMap::new(),
            old,
            failed: false,
            since_yield: 0,
            path: path.to_string(),
        })
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Size of the file as this writer sees it.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Block size of the file's data.
    pub fn block_size(&self) -> u64 {
        self.bs
    }

    /// Moves the write position (a later write there replaces those bytes).
    pub async fn seek(&mut self, pos: u64) -> FsResult<()> {
        if self.sink.is_some() && pos != self.pos {
            self.finish_sink().await?;
        }
        self.pos = pos;
        Ok(())
    }

    fn grant(&self, index: u32) -> JoinHandle<FsResult<BlockGrant>> {
        let client = self.client.clone();
        let (ino, handle) = (self.attr.ino, self.handle);
        tokio::spawn(async move { client.call(AddBlock { ino, handle, index }).await })
    }

    /// The bytes `[pos, pos + len)` of the file as this writer sees it
    /// (blocks it wrote, else the old content; zeros for holes).
    async fn old_bytes(&mut self, pos: u64, len: u64) -> FsResult<Vec<u8>> {
        let mut out = vec![0u8; len as usize];
        if len == 0 {
            return Ok(out);
        }
        let index = (pos / self.bs) as u32;
        self.settle(index).await?;
        if let Some((info, grant)) = self.written.get(&index) {
            let off = pos % self.bs;
            let have = info.len.saturating_sub(off).min(len);
            if have > 0 {
                let src = Source {
                    node: grant.node.clone(),
                    token: grant.token.clone(),
                    len: info.len,
                    fill: None,
                };
                read_once(&self.client, &src, off, &mut out[..have as usize]).await?;
            }
            return Ok(out);
        }
        if let Some(old) = self.old.as_mut() {
            let n = old.read_full_at(pos, &mut out).await?;
            out[n..].fill(0);
        }
        Ok(out)
    }

    async fn open_sink(&mut self) -> FsResult<()> {
        let index = (self.pos / self.bs) as u32;
        let task = match self.next.take() {
            Some((i, task)) if i == index => task,
            _ => self.grant(index),
        };
        let grant = task
            .await
            .map_err(|e| FsError::Io(format!("block allocation task: {e}")))??;
        let local = self.client.io.short_circuit && self.client.data.is_local(&grant.node);
        let mut kind = None;
        if local {
            let mut conn = self.client.data.get(&grant.node.data_addr).await?;
            let reply = conn
                .call(&DataRequest::CreateLocal {
                    token: grant.token.clone(),
                    tier: self.storage,
                    size_hint: self.bs,
                })
                .await?;
            if let DataReply::Local { path, .. } = reply {
                match OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
                {
                    Ok(file) => {
                        kind = Some(SinkKind::Local {
                            file,
                            conn,
                            crcs: Vec::new(),
                            unit_crc: Box::default(),
                            unit_fill: 0,
                        })
                    }
                    Err(e) => {
                        tracing::debug!(path, error = %e, "cannot write the block file directly; using the data port");
                        let _ = conn
                            .call(&DataRequest::Abort {
                                token: grant.token.clone(),
                            })
                            .await;
                    }
                }
            }
        }
        let kind = match kind {
            Some(k) => k,
            None => {
                let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
                let pool = self.client.data.clone();
                let g = grant.clone();
                let (tier, hint) = (self.storage, self.bs);
                let task = tokio::spawn(curvine_actors::trace::scope(
                    curvine_actors::trace::current(),
                    async move { remote_block(pool, g, tier, hint, rx).await },
                ));
                SinkKind::Remote {
                    tx,
                    task,
                    buf: Vec::with_capacity(MAX_CHUNK),
                }
            }
        };
        self.sink = Some(Sink {
            grant,
            len: 0,
            kind,
        });
        // Copy-on-write: the block starts with the bytes before the write position.
        let off = self.pos % self.bs;
        if off > 0 {
            let start = self.pos - off;
            let head = self.old_bytes(start, off).await?;
            self.pos = start;
            self.write_in_block(&head).await?;
        }
        Ok(())
    }

    /// Writes bytes that fit in the current block.
    async fn write_in_block(&mut self, data: &[u8]) -> FsResult<()> {
        let Some(sink) = self.sink.as_mut() else {
            return Err(FsError::Io("no block open".into()));
        };
        match &mut sink.kind {
            SinkKind::Local { .. } => write_local(sink, data)?,
            SinkKind::Remote { tx, buf, task } => {
                let mut rest = data;
                while !rest.is_empty() {
                    let n = (MAX_CHUNK - buf.len()).min(rest.len());
                    buf.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    if buf.len() == MAX_CHUNK {
                        let full = std::mem::replace(buf, Vec::with_capacity(MAX_CHUNK));
                        if tx.send(full).await.is_err() {
                            // The block task ended: report its error.
                            return Err(match task.await {
                                Ok(Err(e)) => e,
                                _ => FsError::Io(format!(
                                    "block {:#x}: the data connection ended",
                                    sink.grant.id
                                )),
                            });
                        }
                    }
                }
            }
        }
        self.wrote(data.len());
        Ok(())
    }

    /// Moves the position past bytes written into the current block and
    /// asks for the next block once this one is half full.
    fn wrote(&mut self, n: usize) {
        if let Some(sink) = self.sink.as_mut() {
            sink.len += n as u64;
        }
        let Some(sink) = self.sink.as_ref() else {
            return;
        };
        self.pos += n as u64;
        self.size = self.size.max(self.pos);
        let half = self.bs / 2;
        if sink.len >= half && self.next.is_none() {
            let next = (self.pos / self.bs) as u32 + 1;
            let task = self.grant(next);
            self.next = Some((next, task));
        }
    }

    /// Writes at the current position without waiting, when the bytes fit
    /// inside the block being written straight into its file on this host
    /// (short-circuit): `None` when the write needs more (a new block, the
    /// data port), which [`FileWriter::write`] does. Must run inside the
    /// tokio runtime (it may ask for the next block in the background).
    pub fn write_now(&mut self, data: &[u8]) -> Option<FsResult<()>> {
        if self.failed || data.is_empty() {
            return None;
        }
        let sink = self.sink.as_mut()?;
        if !matches!(sink.kind, SinkKind::Local { .. })
            || self.pos % self.bs + data.len() as u64 >= self.bs
        {
            return None;
        }
        if let Err(e) = write_local(sink, data) {
            self.failed = true;
            return Some(Err(e));
        }
        self.wrote(data.len());
        Some(Ok(()))
    }

    /// Finishes the current block: copies the old bytes after the written
    /// range (copy-on-write), then commits it in the background.
    async fn finish_sink(&mut self) -> FsResult<()> {
        let Some(sink) = self.sink.as_ref() else {
            return Ok(());
        };
        let index = sink.grant.index;
        let block_start = index as u64 * self.bs;
        let block_end = (block_start + self.bs).min(self.size);
        if self.pos < block_end {
            let tail = self.old_bytes(self.pos, block_end - self.pos).await?;
            let keep = self.pos;
            self.write_in_block(&tail).await?;
            self.pos = keep;
        }
        let Some(sink) = self.sink.take() else {
            return Ok(());
        };
        let grant = sink.grant.clone();
        let len = sink.len;
        let pool = self.client.data.clone();
        let task: JoinHandle<FsResult<BlockInfo>> = match sink.kind {
            SinkKind::Local {
                file,
                mut conn,
                mut crcs,
                unit_crc,
                unit_fill,
            } => {
                if unit_fill > 0 {
                    crcs.push(unit_crc.value());
                }
                drop(file);
                let g = grant.clone();
                let trace = curvine_actors::trace::current();
                tokio::spawn(curvine_actors::trace::scope(trace, async move {
                    let reply = conn
                        .call(&DataRequest::CommitLocal {
                            token: g.token.clone(),
                            len,
                            crcs,
                        })
                        .await?;
                    pool.put(conn);
                    match reply {
                        DataReply::Committed { len, crc } => Ok(block_info(&g, len, crc)),
                        other => Err(FsError::Protocol(format!(
                            "unexpected reply {} to a block commit",
                            other.kind_name()
                        ))),
                    }
                }))
            }
            SinkKind::Remote { tx, task, buf } => {
                let g = grant.clone();
                tokio::spawn(async move {
                    if !buf.is_empty() {
                        let _ = tx.send(buf).await;
                    }
                    drop(tx);
                    let (len, crc) = task
                        .await
                        .map_err(|e| FsError::Io(format!("block task: {e}")))??;
                    Ok(block_info(&g, len, crc))
                })
            }
        };
        self.finishing.push((grant, task));
        Ok(())
    }

    /// Waits for the commit of a block of `index` this writer finished.
    async fn settle(&mut self, index: u32) -> FsResult<()> {
        let mut i = 0;
        while i < self.finishing.len() {
            if self.finishing[i].0.index == index {
                let (grant, task) = self.finishing.remove(i);
                let info = task
                    .await
                    .map_err(|e| FsError::Io(format!("block commit task: {e}")))??;
                self.written.insert(index, (info, grant));
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Collects block commits that are done, without waiting.
    async fn collect_done(&mut self) -> FsResult<()> {
        let done: Vec<u32> = self
            .finishing
            .iter()
            .filter(|(_, t)| t.is_finished())
            .map(|(g, _)| g.index)
            .collect();
        for index in done {
            self.settle(index).await?;
        }
        Ok(())
    }

    pub async fn write(&mut self, mut data: &[u8]) -> FsResult<()> {
        if self.failed {
            return Err(FsError::Io(
                "an earlier write of this file failed; reopen it".into(),
            ));
        }
        let result: FsResult<()> = async {
            while !data.is_empty() {
                if self.sink.is_none() {
                    self.collect_done().await?;
                    self.open_sink().await?;
                }
                let room = self.bs - self.pos % self.bs;
                let n = (data.len() as u64).min(room) as usize;
                self.write_in_block(&data[..n]).await?;
                yield_sometimes(&mut self.since_yield, n).await;
                data = &data[n..];
                if self.pos.is_multiple_of(self.bs) {
                    self.finish_sink().await?;
                }
            }
            Ok(())
        }
        .await;
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Gives up: the file keeps the content it had when opened (after the
    /// truncation, if one was asked for), the blocks written are freed and
    /// the write lease is released.
    pub async fn abort(mut self) -> FsResult<Attr> {
        self.sink = None;
        self.next = None;
        for (_, task) in std::mem::take(&mut self.finishing) {
            task.abort();
        }
        let size = self.attr.size;
        self.client
            .call(CompleteFile {
                path: self.path.clone(),
                abort: true,
                ino: self.attr.ino,
                handle: self.handle,
                size,
                blocks: Vec::new(),
            })
            .await
    }

    /// Commits every block and makes the new content visible. Returns the
    /// file's attributes after the close.
    pub async fn close(mut self) -> FsResult<Attr> {
        if self.failed {
            return Err(FsError::Io(
                "an earlier write of this file failed; its previous content is unchanged".into(),
            ));
        }
        self.finish_sink().await?;
        if let Some((_, task)) = self.next.take() {
            // An allocated block that was not needed is freed by the close.
            let _ = task.await;
        }
        let mut blocks: BTreeMap<u32, BlockInfo> = self
            .written
            .iter()
            .map(|(i, (info, _))| (*i, info.clone()))
            .collect();
        for (grant, task) in std::mem::take(&mut self.finishing) {
            let info = task
                .await
                .map_err(|e| FsError::Io(format!("block commit task: {e}")))??;
            blocks.insert(grant.index, info);
        }
        self.client
            .call(CompleteFile {
                path: self.path.clone(),
                abort: false,
                ino: self.attr.ino,
                handle: self.handle,
                size: self.size,
                blocks: blocks.into_values().collect(),
            })
            .await
    }
}

/// Appends bytes to a block file written directly, with its unit crcs.
fn write_local(sink: &mut Sink, data: &[u8]) -> FsResult<()> {
    let SinkKind::Local {
        file,
        crcs,
        unit_crc,
        unit_fill,
        ..
    } = &mut sink.kind
    else {
        return Err(FsError::Io("the block is not written locally".into()));
    };
    file.write_all(data)
        .map_err(|e| io_err(format!("block {:#x}", sink.grant.id), e))?;
    let mut rest = data;
    while !rest.is_empty() {
        let n = (CHECKSUM_UNIT - *unit_fill).min(rest.len());
        unit_crc.update(&rest[..n]);
        *unit_fill += n;
        rest = &rest[n..];
        if *unit_fill == CHECKSUM_UNIT {
            crcs.push(unit_crc.value());
            **unit_crc = Crc32c::default();
            *unit_fill = 0;
        }
    }
    Ok(())
}

fn block_info(grant: &BlockGrant, len: u64, crc: u32) -> BlockInfo {
    BlockInfo {
        id: grant.id,
        index: grant.index,
        len,
        stored: len,
        crc,
        locs: vec![grant.node.node_id.clone()],
    }
}

/// Streams one block to a data port: chunks from `rx`, then the commit.
async fn remote_block(
    pool: DataPool,
    grant: BlockGrant,
    tier: Option<TierKind>,
    size_hint: u64,
    mut rx: mpsc::Receiver<Vec<u8>>,
) -> FsResult<(u64, u32)> {
    let mut conn = pool.get(&grant.node.data_addr).await?;
    match conn
        .call(&DataRequest::Write {
            token: grant.token.clone(),
            tier,
            size_hint,
        })
        .await?
    {
        DataReply::Ready => {}
        other => {
            return Err(FsError::Protocol(format!(
                "unexpected reply {} to a block write",
                other.kind_name()
            )))
        }
    }
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

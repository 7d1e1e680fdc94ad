//! [`FileWriter`]: writes a file copy-on-write, block by block, into block
//! files on this host (short-circuit) or through a node's data port; the
//! file switches to its new blocks when the writer closes it.

use std::collections::BTreeMap;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use curvine_messages::block::{
    next_reservation, BlockInfo, DataReply, DataRequest, FileSpec, LocalCommit, TierKind, Token,
    CHECKSUM_UNIT, FIRST_RESERVATION, MAX_CHUNK,
};
use curvine_messages::rpc::{AddBlock, BlockGrant, CompleteFile, OpenFile};
use curvine_messages::{Attr, FsError, FsResult, SetAttr};
use curvine_wire::data::{open_remote_block, stream_remote_block, BlockSource, DataConn};

use super::local::{read_once, yield_sometimes};
use super::reader::FileReader;
use super::sink::{open_block_file, refused_if_full, write_local, Sink, SinkKind, Stop};
use crate::client::Client;

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

/// A whole block just written short-circuit whose commit waits until the
/// next block is reserved naming it (`CreateLocal::after`), so that the
/// node can place that one right after it in one extent file: a file
/// written in order is then one file on the node, which a mount passes
/// through from its first read. Dropping it lets the commit go.
struct Chain {
    index: u32,
    block: curvine_messages::block::BlockId,
    len: u64,
    node: String,
    /// Sent when the writer begins the next block: from then on the
    /// commit waits for that block's reservation however long the node
    /// takes, not only [`CHAIN_WAIT`].
    begun: Option<oneshot::Sender<()>>,
    _go: oneshot::Sender<()>,
}

/// How long a finished block's commit waits for the writer to begin the
/// next block (see [`Chain`]): a writer that pauses after a block leaves
/// nothing uncommitted for long.
const CHAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long it then waits for the next block's reservation, a bound for a
/// writer whose reservation failed and that is never closed.
const CHAIN_RESERVE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What a finished block's commit waits for before it goes (see [`Chain`]):
/// the writer beginning the next block within [`CHAIN_WAIT`], then that
/// block's reservation; or the chain dropped.
async fn chain_wait(begun: oneshot::Receiver<()>, go: oneshot::Receiver<()>) {
    if let Ok(Ok(())) = tokio::time::timeout(CHAIN_WAIT, begun).await {
        let _ = tokio::time::timeout(CHAIN_RESERVE_WAIT, go).await;
    }
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
    /// The last block finished, while the next may follow it.
    chain: Option<Chain>,
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
        Self::opened(client, path, options, open).await
    }

    /// The writer of a file the node opened for writing (`OpenFile`'s
    /// answer, or a create a mount made in a delegated directory).
    pub async fn opened(
        client: &Client,
        path: &str,
        options: &WriteOptions,
        open: curvine_messages::rpc::WriteOpen,
    ) -> FsResult<FileWriter> {
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
            chain: None,
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
                let src = BlockSource {
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

    /// Opens the block the position is in: its grant, room on its node,
    /// and (copy-on-write) the bytes before the position.
    async fn open_sink(&mut self) -> Result<(), Stop> {
        let index = (self.pos / self.bs) as u32;
        if let Some(begun) = self
            .chain
            .as_mut()
            .filter(|c| c.index + 1 == index)
            .and_then(|c| c.begun.take())
        {
            let _ = begun.send(());
        }
        let task = match self.next.take() {
            Some((i, task)) if i == index => task,
            _ => self.grant(index),
        };
        let grant = task
            .await
            .map_err(|e| FsError::Io(format!("block allocation task: {e}")))?
            .map_err(refused_if_full)?;
        let local = self.client.io.short_circuit && self.client.data.is_local(&grant.node);
        // The block just finished, if this one continues it on its node;
        // its commit waits until this one is reserved.
        let chain = self
            .chain
            .take()
            .filter(|c| local && c.index + 1 == index && c.node == grant.node.node_id);
        // The node reserves a first part (in a tier with room for the
        // whole block where one has it): the writer asks for more, at
        // least double, before it passes what it has.
        let reserved = self.bs.min(FIRST_RESERVATION);
        let mut kind = None;
        if local {
            let mut conn = self.client.data.get(&grant.node.data_addr).await?;
            let reply = conn
                .call(&DataRequest::CreateLocal {
                    token: grant.token.clone(),
                    tier: self.storage,
                    size_hint: self.bs,
                    after: chain.as_ref().map(|c| (c.block, c.len)),
                })
                .await;
            drop(chain);
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    self.keep_grant(grant);
                    return Err(refused_if_full(e));
                }
            };
            if let DataReply::Local { path, offset, .. } = reply {
                match open_block_file(&path, offset) {
                    Ok(file) => {
                        kind = Some(SinkKind::Local {
                            file,
                            conn,
                            crcs: Vec::new(),
                            unit_crc: Box::default(),
                            unit_fill: 0,
                            reserved,
                            base: offset,
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
                let pool = self.client.data.clone();
                let conn = match open_remote_block(&pool, &grant, self.storage, self.bs).await {
                    Ok(conn) => conn,
                    Err(e) => {
                        self.keep_grant(grant);
                        return Err(refused_if_full(e));
                    }
                };
                let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
                let task = tokio::spawn(curvine_runtime::trace::scope(
                    curvine_runtime::trace::current(),
                    async move { stream_remote_block(pool, conn, rx).await },
                ));
                SinkKind::Remote {
                    tx,
                    task,
                    buf: Vec::with_capacity(MAX_CHUNK),
                    reserved,
                }
            }
        };
        self.sink = Some(Sink {
            grant,
            len: 0,
            kind,
        });
        // Copy-on-write: the block starts with the bytes before the write
        // position, and ends with those after what this writer writes:
        // room for all of them is asked for now, so that finishing the
        // block never needs more.
        let off = self.pos % self.bs;
        let start = self.pos - off;
        let old_end = (start + self.bs).min(self.size);
        if let Err(stop) = self.reserve(old_end.saturating_sub(start)).await {
            self.drop_sink().await;
            return Err(stop);
        }
        if off > 0 {
            let keep = self.pos;
            let head = match self.old_bytes(start, off).await {
                Ok(head) => head,
                Err(e) => {
                    self.drop_sink().await;
                    return Err(Stop::Failed(e));
                }
            };
            self.pos = start;
            if let Err(stop) = self.write_in_block(&head).await {
                self.pos = keep;
                self.drop_sink().await;
                return Err(stop);
            }
        }
        Ok(())
    }

    /// Keeps the grant of a block whose reservation was refused for the
    /// next try, while its token has a while to live.
    fn keep_grant(&mut self, grant: BlockGrant) {
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if grant.token.expires_s > now_s + 60 {
            let index = grant.index;
            self.next = Some((index, tokio::spawn(async move { Ok(grant) })));
        }
    }

    /// Gives up the block being written (its reservation is released):
    /// after a refusal while it was being opened.
    async fn drop_sink(&mut self) {
        let Some(sink) = self.sink.take() else {
            return;
        };
        match sink.kind {
            SinkKind::Local { mut conn, .. } => {
                let _ = conn
                    .call(&DataRequest::Abort {
                        token: sink.grant.token.clone(),
                    })
                    .await;
            }
            // The node drops a block whose writer went away.
            SinkKind::Remote { task, .. } => task.abort(),
        }
    }

    /// Makes sure the node has room for `need` bytes of the block being
    /// written, asking for more (at least double) when it has less.
    async fn reserve(&mut self, need: u64) -> Result<(), Stop> {
        let Some(sink) = self.sink.as_mut() else {
            return Err(Stop::Failed(FsError::Io("no block open".into())));
        };
        if need <= sink.kind.reserved() {
            return Ok(());
        }
        let double = next_reservation(sink.kind.reserved(), need, self.bs);
        let (token, tier) = (&sink.grant.token, self.storage);
        let granted = match &mut sink.kind {
            SinkKind::Local { conn, .. } => ask_room(conn, token, tier, double, need).await?,
            SinkKind::Remote { .. } => {
                // Its own connection streams the bytes.
                let mut conn = self.client.data.get(&sink.grant.node.data_addr).await?;
                let granted = ask_room(&mut conn, token, tier, double, need).await?;
                self.client.data.put(conn);
                granted
            }
        };
        match &mut sink.kind {
            SinkKind::Local { reserved, .. } | SinkKind::Remote { reserved, .. } => {
                *reserved = granted
            }
        }
        Ok(())
    }

    /// Writes bytes that fit in the current block.
    async fn write_in_block(&mut self, data: &[u8]) -> Result<(), Stop> {
        let need = self.sink.as_ref().map_or(0, |s| s.len) + data.len() as u64;
        self.reserve(need).await?;
        let Some(sink) = self.sink.as_mut() else {
            return Err(Stop::Failed(FsError::Io("no block open".into())));
        };
        match &mut sink.kind {
            SinkKind::Local { .. } => write_local(sink, data)?,
            SinkKind::Remote { tx, buf, task, .. } => {
                let mut rest = data;
                while !rest.is_empty() {
                    let n = (MAX_CHUNK - buf.len()).min(rest.len());
                    buf.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    if buf.len() == MAX_CHUNK {
                        let full = std::mem::replace(buf, Vec::with_capacity(MAX_CHUNK));
                        if tx.send(full).await.is_err() {
                            // The block task ended: report its error.
                            return Err(Stop::Failed(match task.await {
                                Ok(Err(e)) => e,
                                _ => FsError::Io(format!(
                                    "block {:#x}: the data connection ended",
                                    sink.grant.id
                                )),
                            }));
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
        let SinkKind::Local { reserved, .. } = sink.kind else {
            return None;
        };
        if self.pos % self.bs + data.len() as u64 >= self.bs
            || sink.len + data.len() as u64 > reserved
        {
            return None;
        }
        match write_local(sink, data) {
            Ok(()) => {}
            Err(Stop::Refused(e)) => return Some(Err(e)),
            Err(Stop::Failed(e)) => {
                self.failed = true;
                return Some(Err(e));
            }
        }
        self.wrote(data.len());
        Some(Ok(()))
    }

    /// Finishes the current block: copies the old bytes after the written
    /// range (copy-on-write), then commits it in the background.
    async fn finish_sink(&mut self) -> FsResult<()> {
        self.finish_block(false).await.map(drop)
    }

    /// [`Self::finish_sink`]; with `at_close`, a block written
    /// short-circuit on the node this client talks to is not committed
    /// here: its commit is returned, for the close to carry.
    async fn finish_block(
        &mut self,
        at_close: bool,
    ) -> FsResult<Option<(BlockGrant, LocalCommit)>> {
        let Some(sink) = self.sink.as_ref() else {
            return Ok(None);
        };
        let index = sink.grant.index;
        let block_start = index as u64 * self.bs;
        let block_end = (block_start + self.bs).min(self.size);
        if self.pos < block_end {
            let tail = self.old_bytes(self.pos, block_end - self.pos).await?;
            let keep = self.pos;
            // Room for these was reserved when the block was opened.
            self.write_in_block(&tail).await.map_err(Stop::into_error)?;
            self.pos = keep;
        }
        let Some(sink) = self.sink.take() else {
            return Ok(None);
        };
        let grant = sink.grant.clone();
        let len = sink.len;
        let pool = self.client.data.clone();
        let here = at_close && grant.node.node_id == self.client.node_id();
        let task: JoinHandle<FsResult<BlockInfo>> = match sink.kind {
            SinkKind::Local {
                file,
                conn,
                mut crcs,
                unit_crc,
                unit_fill,
                ..
            } if here => {
                if unit_fill > 0 {
                    crcs.push(unit_crc.value());
                }
                drop(file);
                pool.put(conn);
                let token = grant.token.clone();
                return Ok(Some((grant, LocalCommit { token, len, crcs })));
            }
            SinkKind::Local {
                file,
                mut conn,
                mut crcs,
                unit_crc,
                unit_fill,
                ..
            } => {
                if unit_fill > 0 {
                    crcs.push(unit_crc.value());
                }
                drop(file);
                let g = grant.clone();
                let trace = curvine_runtime::trace::current();
                // A whole block may be continued by the next, in one file
                // on its node: its commit waits for the next reservation.
                let (go, wait) = oneshot::channel();
                let (begun, begun_wait) = oneshot::channel();
                if len == self.bs {
                    self.chain = Some(Chain {
                        index,
                        block: g.id,
                        len,
                        node: g.node.node_id.clone(),
                        begun: Some(begun),
                        _go: go,
                    });
                }
                tokio::spawn(curvine_runtime::trace::scope(trace, async move {
                    chain_wait(begun_wait, wait).await;
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
            SinkKind::Remote { tx, task, buf, .. } => {
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
        Ok(None)
    }

    /// Waits for the commit of a block of `index` this writer finished.
    async fn settle(&mut self, index: u32) -> FsResult<()> {
        // A commit held for the next block goes now (it is awaited).
        if self.chain.as_ref().is_some_and(|c| c.index == index) {
            self.chain = None;
        }
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

    /// Writes all of `data` at the position. When a tier has no room for
    /// part of it, the bytes before that part are written and the error is
    /// `NoSpace` (see [`Self::write_some`]).
    pub async fn write(&mut self, mut data: &[u8]) -> FsResult<()> {
        while !data.is_empty() {
            let n = self.write_some(data).await?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Writes `data` at the position, all of it, or as much as the node had
    /// room for: `Ok(n)` with `n` short of the length when a tier had no
    /// room for the rest (ENOSPC), and `NoSpace` when it had none for any.
    /// A refused write leaves the writer as it was: what was written
    /// before stays and a later write that finds room succeeds. Any other
    /// error fails the writer (its close then fails, and the file keeps
    /// its previous content).
    pub async fn write_some(&mut self, data: &[u8]) -> FsResult<usize> {
        if self.failed {
            return Err(FsError::Io(
                "an earlier write of this file failed; reopen it".into(),
            ));
        }
        let mut done = 0;
        while done < data.len() {
            let step: Result<usize, Stop> = async {
                if self.sink.is_none() {
                    self.collect_done().await?;
                    self.open_sink().await?;
                }
                let room = self.bs - self.pos % self.bs;
                let n = ((data.len() - done) as u64).min(room) as usize;
                self.write_in_block(&data[done..done + n]).await?;
                Ok(n)
            }
            .await;
            match step {
                Ok(n) => {
                    yield_sometimes(&mut self.since_yield, n).await;
                    done += n;
                    if self.pos.is_multiple_of(self.bs) {
                        if let Err(e) = self.finish_sink().await {
                            self.failed = true;
                            return Err(e);
                        }
                    }
                }
                Err(Stop::Refused(e)) => {
                    tracing::debug!(path = self.path, pos = self.pos, error = %e, "a write refused for want of room");
                    // The block before need not wait for this one.
                    self.chain = None;
                    return if done > 0 { Ok(done) } else { Err(e) };
                }
                Err(Stop::Failed(e)) => {
                    self.failed = true;
                    return Err(e);
                }
            }
        }
        Ok(done)
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
                set: None,
                commit: None,
            })
            .await
    }

    /// Commits every block and makes the new content visible. Returns the
    /// file's attributes after the close.
    pub async fn close(self) -> FsResult<Attr> {
        self.close_with(None).await
    }

    /// [`Self::close`] that also sets attributes (no size) in the same
    /// commit: the mode, owner or times a caller set while writing.
    pub async fn close_with(mut self, set: Option<SetAttr>) -> FsResult<Attr> {
        if self.failed {
            return Err(FsError::Io(
                "an earlier write of this file failed; its previous content is unchanged".into(),
            ));
        }
        let last = self.finish_block(true).await?;
        self.chain = None;
        if let Some((_, task)) = self.next.take() {
            // An allocated block that was not needed is freed by the close.
            let _ = task.await;
        }
        let mut blocks: BTreeMap<u32, BlockInfo> = self
            .written
            .iter()
            .map(|(i, (info, _))| (*i, info.clone()))
            .collect();
        // Its checksum comes from the commit the close carries.
        let commit = last.map(|(grant, commit)| {
            blocks.insert(grant.index, block_info(&grant, commit.len, 0));
            commit
        });
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
                set,
                commit,
            })
            .await
    }
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

/// Asks a block's node for room: `double` bytes where a tier has room for
/// them, else exactly `need` (as the data port grows a block it is sent).
/// Returns the room the block has now.
async fn ask_room(
    conn: &mut DataConn,
    token: &Token,
    tier: Option<TierKind>,
    double: u64,
    need: u64,
) -> Result<u64, Stop> {
    let ask = |size_hint| DataRequest::CreateLocal {
        token: token.clone(),
        tier,
        size_hint,
        after: None,
    };
    match conn.call(&ask(double)).await {
        Err(FsError::NoSpace(_)) if double > need => {}
        answer => return answer.map(|_| double).map_err(refused_if_full),
    }
    conn.call(&ask(need))
        .await
        .map(|_| need)
        .map_err(refused_if_full)
}

/// Who writes, as a file's write lease names it: host and process.
pub fn client_name() -> String {
    let key = curvine_wire::host::host_key();
    let host = key.split('/').next().unwrap_or("");
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[tokio::test]
    async fn a_held_commit_waits_for_a_begun_next_block_however_slow_its_reservation() {
        // Begun at once, reserved later than CHAIN_WAIT: the commit waits.
        let (begun, begun_rx) = oneshot::channel();
        let (go, go_rx) = oneshot::channel::<()>();
        begun.send(()).unwrap();
        let slow = CHAIN_WAIT + Duration::from_millis(300);
        tokio::spawn(async move {
            tokio::time::sleep(slow).await;
            drop(go);
        });
        let t = Instant::now();
        chain_wait(begun_rx, go_rx).await;
        assert!(t.elapsed() >= slow, "{:?}", t.elapsed());
        // Never begun (a writer that paused): it goes after CHAIN_WAIT.
        let (_begun, begun_rx) = oneshot::channel();
        let (_go, go_rx) = oneshot::channel::<()>();
        let t = Instant::now();
        chain_wait(begun_rx, go_rx).await;
        assert!(t.elapsed() >= CHAIN_WAIT && t.elapsed() < CHAIN_RESERVE_WAIT);
        // Dropped (a close): at once.
        let (begun, begun_rx) = oneshot::channel::<()>();
        let (go, go_rx) = oneshot::channel::<()>();
        drop((begun, go));
        let t = Instant::now();
        chain_wait(begun_rx, go_rx).await;
        assert!(t.elapsed() < CHAIN_WAIT);
    }
}

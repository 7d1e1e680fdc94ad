//! [`FileReader`]: reads a file as it was when opened, from block files on
//! this host (short-circuit) or streamed from the data ports of their nodes,
//! reading ahead of a sequential reader.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use curvine_messages::block::{DataNode, ReadBlock, MAX_CHUNK};
use curvine_messages::rpc::{OpenRead, ReadOpen};
use curvine_messages::{Attr, FsError, FsResult};
use curvine_wire::data::{start_stream, BlockSource, BlockStream};

use super::local::{fetch_remote, open_local_block, yield_sometimes, LocalBlock};
use crate::client::Client;

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
    stream: Option<BlockStream>,
    ahead: VecDeque<BlockStream>,
    /// The chunks streamed last (block index, block offset, bytes), oldest
    /// first, [`RECENT_BYTES`] at most: the kernel's readahead sends many
    /// reads at once, which reach the reader a little out of order.
    recent: VecDeque<(u32, u64, Vec<u8>)>,
    recent_bytes: usize,
    /// The buffer of [`FileReader::pread_with`]'s reads that no one chunk
    /// holds.
    scratch: Vec<u8>,
    /// Bytes read since the last yield (see [`yield_sometimes`]).
    since_yield: usize,
    /// (block, node) reads that failed; other replicas are used instead.
    failed: std::collections::HashSet<(u32, String)>,
    /// A UFS file: blocks that are not cached are read through this node.
    ufs: Option<(curvine_messages::rpc::UfsRead, Arc<str>)>,
    /// Where the last random read of [`FileReader::pread`] ended: a read
    /// from there starts streaming again.
    random_end: u64,
    /// Whether the last [`FileReader::pread`] ran on from the stream: only
    /// then do reads a little ahead of the position (the kernel's
    /// readahead, out of order) run on too; after a random read, only one
    /// that continues it exactly does.
    streaming: bool,
    /// The node holds the blocks of the version opened for this reader
    /// until told it is closed (0: nothing held); told from the runtime
    /// the reader was opened in.
    hold: u64,
    runtime: Option<tokio::runtime::Handle>,
}

impl Drop for FileReader {
    fn drop(&mut self) {
        self.client
            .io
            .recent
            .fetch_sub(self.recent_bytes, std::sync::atomic::Ordering::Relaxed);
        if self.hold == 0 {
            return;
        }
        // Block files first: the node counts their bytes as held while
        // they are open.
        self.local.clear();
        // With no runtime left, the hold ends with the connection.
        if let Some(rt) = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.clone())
        {
            self.client.close_read(self.hold, &rt);
        }
    }
}

/// How far ahead of a reader's position a [`FileReader::pread`] still runs
/// on from its stream (the kernel's readahead requests arrive out of order
/// over its whole window: `fuse.max_readahead`, 16MiB).
const SEQUENTIAL_WINDOW: u64 = 16 << 20;

/// How far ahead of what a block stream has delivered a read may be and
/// still wait for the stream; further ahead, the stream starts over there.
const STREAM_SKIP: u64 = 16 << 20;

/// Streamed bytes a reader keeps for reads that arrive after the ones
/// beyond them (see `FileReader::recent`).
const RECENT_BYTES: usize = 16 << 20;

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
            recent: VecDeque::new(),
            recent_bytes: 0,
            scratch: Vec::new(),
            since_yield: 0,
            failed: Default::default(),
            random_end: u64::MAX,
            streaming: false,
            hold: open.hold,
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    pub fn size(&self) -> u64 {
        self.attr.size
    }

    /// Closes the reader and waits until its node knows: the blocks of the
    /// version it read are free to go from then on (dropping a reader
    /// tells the node too, without waiting).
    pub async fn close(mut self) -> FsResult<()> {
        let hold = std::mem::take(&mut self.hold);
        self.local.clear();
        if hold == 0 {
            return Ok(());
        }
        self.client
            .call(curvine_messages::rpc::CloseRead { holds: vec![hold] })
            .await
    }

    /// The file's attributes as of the open.
    pub fn attr(&self) -> &curvine_messages::Attr {
        &self.attr
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    pub fn seek(&mut self, pos: u64) {
        self.pos = pos;
    }

    /// Where to read block `index`: a live node holding it, one on this
    /// host first, skipping nodes that failed this reader.
    fn source(&self, index: u32) -> FsResult<Option<BlockSource>> {
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
        Ok(Some(BlockSource {
            node: node.clone(),
            token: block.token.clone(),
            len: block.info.len,
            fill: None,
        }))
    }

    /// A block of a UFS file that is not cached: read through a node.
    fn fill_source(&self, index: u32) -> Option<BlockSource> {
        let (ufs, path) = self.ufs.as_ref()?;
        let start = index as u64 * self.bs;
        if start >= self.attr.size {
            return None;
        }
        Some(BlockSource {
            node: ufs.node.clone(),
            token: ufs.token.clone(),
            len: self.bs.min(self.attr.size - start),
            fill: Some((path.clone(), index)),
        })
    }

    async fn open_local(&mut self, index: u32, src: &BlockSource) -> Option<Arc<LocalBlock>> {
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

    /// Fills `buf` from `offset` as far as the file goes, choosing how:
    /// a read that runs on from the position (or from where the previous
    /// random read ended) streams the rest of the block, and moves the
    /// position; any other fetches just its bytes, leaving the stream and
    /// the position where they were.
    pub async fn pread(&mut self, offset: u64, buf: &mut [u8]) -> FsResult<usize> {
        if let Some(n) = self.read_recent(offset, buf) {
            return Ok(n);
        }
        if !self.runs_on(offset) {
            // One behind a stream's position (a readahead request that came
            // late) leaves it streaming.
            self.streaming &= offset < self.pos;
            let done = self.read_full_at(offset, buf).await?;
            self.random_end = offset + done as u64;
            return Ok(done);
        }
        self.streaming = true;
        self.seek(offset);
        self.read_full(buf).await
    }

    /// Whether a read at `offset` runs on from the position (or from where
    /// the previous random read ended): see [`FileReader::pread`].
    fn runs_on(&self, offset: u64) -> bool {
        offset == self.pos
            || offset == self.random_end
            || (self.streaming && offset > self.pos && offset - self.pos <= SEQUENTIAL_WINDOW)
    }

    /// [`FileReader::pread`] of up to `len` bytes at `offset`, handing the
    /// bytes to `f`: straight from the chunk a block stream delivered when
    /// one chunk holds them all (no copy: the mount answers the kernel from
    /// it), else from a buffer `pread` filled.
    pub async fn pread_with<R>(
        &mut self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> FsResult<R> {
        let read = self.pread_kept(offset, len, f).await;
        if read.is_ok() && offset.saturating_add(len as u64) >= self.attr.size {
            self.let_go_if_small();
        }
        read
    }

    /// A small file (one chunk) read to its end keeps nothing of what was
    /// streamed: a reader held open long after (a program keeping many
    /// files open) costs its state alone, and the kernel keeps the pages
    /// it read.
    fn let_go_if_small(&mut self) {
        if self.attr.size > MAX_CHUNK as u64 {
            return;
        }
        self.client
            .io
            .recent
            .fetch_sub(self.recent_bytes, std::sync::atomic::Ordering::Relaxed);
        self.recent = VecDeque::new();
        self.recent_bytes = 0;
        self.stream = None;
        self.ahead = VecDeque::new();
        self.scratch = Vec::new();
    }

    async fn pread_kept<R>(
        &mut self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> FsResult<R> {
        let want = (len as u64).min(self.attr.size.saturating_sub(offset)) as usize;
        if want == 0 {
            return Ok(f(&[]));
        }
        if let Some((at, from)) = self.recent_slot(offset, want) {
            return Ok(f(&self.recent[at].2[from..from + want]));
        }
        if self.runs_on(offset) {
            while self.stream_reaches(offset, want) {
                let Some(stream) = self.stream.as_mut() else {
                    break;
                };
                let index = stream.index;
                match stream.rx.recv().await {
                    Some(Ok((start, data))) => {
                        stream.next = start + data.len() as u64;
                        self.keep_recent(index, start, data);
                    }
                    // `pread` starts the stream again, and turns to another
                    // replica if this one fails again.
                    _ => {
                        self.stream = None;
                        break;
                    }
                }
                if let Some((at, from)) = self.recent_slot(offset, want) {
                    self.streaming = true;
                    self.pos = offset + want as u64;
                    return Ok(f(&self.recent[at].2[from..from + want]));
                }
            }
        }
        // A buffer kept between reads: zeroed once, not for every read.
        let mut buf = std::mem::take(&mut self.scratch);
        if buf.len() < want {
            buf.resize(want, 0);
        }
        let read = self.pread(offset, &mut buf[..want]).await;
        let out = read.map(|n| f(&buf[..n]));
        self.scratch = buf;
        out
    }

    /// Where in [`FileReader::recent`] one chunk holds all of `[offset,
    /// offset + want)`: (its place, the offset in it).
    fn recent_slot(&self, offset: u64, want: usize) -> Option<(usize, usize)> {
        let (index, off) = ((offset / self.bs) as u32, offset % self.bs);
        let end = off + want as u64;
        let at = self.recent.iter().rposition(|(i, start, data)| {
            *i == index && off >= *start && end <= *start + data.len() as u64
        })?;
        Some((at, (off - self.recent[at].1) as usize))
    }

    /// Whether the running block stream's next chunks bring `[offset,
    /// offset + want)` (all in its block, at or a little past what it
    /// delivered).
    fn stream_reaches(&self, offset: u64, want: usize) -> bool {
        let (index, off) = ((offset / self.bs) as u32, offset % self.bs);
        let in_block = match self.blocks.get(&index) {
            Some(b) => off + want as u64 <= b.info.len,
            None => self.ufs.is_some() && off + want as u64 <= self.bs,
        };
        in_block
            && self
                .stream
                .as_ref()
                .is_some_and(|s| s.index == index && off >= s.next && off - s.next <= STREAM_SKIP)
    }

    /// Reads from the position until `buf` is full or the file ends.
    pub async fn read_full(&mut self, buf: &mut [u8]) -> FsResult<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read(&mut buf[done..]).await?;
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
        src: &BlockSource,
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
        loop {
            if let Some(n) = self.copy_recent(index, off, buf) {
                return Ok(n);
            }
            let Some(stream) = self.stream.as_mut() else {
                return Err(FsError::Io("no block stream".into()));
            };
            if off < stream.next || off - stream.next > STREAM_SKIP {
                // Before what the stream delivered (and no longer kept), or
                // far ahead, inside the block: start over there.
                *stream = start_stream(&self.client.data, src, index, off, u64::MAX);
            }
            let (start, data) = match stream.rx.recv().await {
                Some(item) => item?,
                None => {
                    return Err(FsError::Io(format!(
                        "block {:#x}: stream ended before offset {off}",
                        src.token.block
                    )))
                }
            };
            stream.next = start + data.len() as u64;
            self.keep_recent(index, start, data);
        }
    }

    /// Copies what the chunks streamed last hold of block `index` from
    /// `off` on, as far as one chunk goes.
    fn copy_recent(&self, index: u32, off: u64, buf: &mut [u8]) -> Option<usize> {
        let (_, start, data) = self.recent.iter().rev().find(|(i, start, data)| {
            *i == index && off >= *start && off < *start + data.len() as u64
        })?;
        let from = (off - start) as usize;
        let n = (data.len() - from).min(buf.len());
        buf[..n].copy_from_slice(&data[from..from + n]);
        Some(n)
    }

    /// Fills `buf` from `offset` when the chunks streamed last hold all of
    /// it (or the file ends first).
    fn read_recent(&self, offset: u64, buf: &mut [u8]) -> Option<usize> {
        if self.recent.is_empty() || offset >= self.attr.size {
            return None;
        }
        let want = (buf.len() as u64).min(self.attr.size - offset) as usize;
        let mut done = 0;
        while done < want {
            let pos = offset + done as u64;
            let (index, off) = ((pos / self.bs) as u32, pos % self.bs);
            let end = ((self.bs - off) as usize).min(want - done);
            done += self.copy_recent(index, off, &mut buf[done..done + end])?;
        }
        Some(done)
    }

    /// Keeps a streamed chunk, handing the oldest back for reuse beyond
    /// [`RECENT_BYTES`], or while the client's readers keep more than
    /// `client.read_buffer_budget` together.
    fn keep_recent(&mut self, index: u32, start: u64, data: Vec<u8>) {
        use std::sync::atomic::Ordering::Relaxed;
        let total = self.client.io.recent.clone();
        self.recent_bytes += data.len();
        total.fetch_add(data.len(), Relaxed);
        self.recent.push_back((index, start, data));
        let budget = self.client.io.read_buffer_budget;
        while (self.recent_bytes > RECENT_BYTES || total.load(Relaxed) > budget)
            && self.recent.len() > 1
        {
            let Some((_, _, old)) = self.recent.pop_front() else {
                break;
            };
            self.recent_bytes -= old.len();
            total.fetch_sub(old.len(), Relaxed);
            if let Some(s) = &self.stream {
                let _ = s.recycle.send(old);
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

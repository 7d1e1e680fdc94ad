//! The node's UFS data work: reading UFS objects into cached blocks as a
//! reader asks for them (fills, and load jobs), and writing a file's cached
//! content to its UFS object (cache_mode close, fs_mode persist).

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::mounts::Mounts;
use curvine_actors::namespace::Namespace;
use curvine_actors::token::TokenKey;
use curvine_actors::ufs::UfsObject;
use curvine_messages::block::{
    block_crc, unit_crcs, Access, BlockInfo, BlockMsg, CHECKSUM_UNIT, MAX_CHUNK,
};
use curvine_messages::mount::{MountInfo, Persist, UfsFile, UfsState};
use curvine_messages::shard::ShardMsg;
use curvine_messages::{now_ns, shard_of, Attr, FileKind, FsError, FsResult, Ino};

use curvine_actors::ufs::Ufs;

use curvine_wire::data::DataPool;

use super::placement::Placement;
use super::replicas::Replicas;

/// A chunk of a fill on its way to the reader: block offset, bytes, unit crcs.
pub type FillChunk = FsResult<(u64, Vec<u8>, Vec<u32>)>;

/// What a fill sends: the unit-aligned range of the block, then its chunks.
pub struct FillStream {
    pub offset: u64,
    pub len: u64,
    pub chunks: mpsc::Receiver<FillChunk>,
}

/// A UFS file as the namespace has it: where its object is and what it
/// should be.
struct UfsTarget {
    mount: MountInfo,
    ufs: Ufs,
    rel: String,
    expect: UfsFile,
}

pub struct Fills {
    namespace: Arc<Namespace>,
    mounts: Arc<Mounts>,
    blocks: Arc<BlockStore>,
    manager: BlockManagerRef,
    tokens: TokenKey,
    /// Connections to other nodes' data ports (uploads read blocks there).
    pool: DataPool,
    placement: Arc<Placement>,
    replicas: Arc<Replicas>,
    node_id: String,
}

/// What fills and uploads work with.
pub struct FillsArgs {
    pub namespace: Arc<Namespace>,
    pub mounts: Arc<Mounts>,
    pub blocks: Arc<BlockStore>,
    pub manager: BlockManagerRef,
    pub tokens: TokenKey,
    pub pool: DataPool,
    pub placement: Arc<Placement>,
    pub replicas: Arc<Replicas>,
    pub node_id: String,
}

impl Fills {
    pub fn new(a: FillsArgs) -> Fills {
        Fills {
            namespace: a.namespace,
            mounts: a.mounts,
            blocks: a.blocks,
            manager: a.manager,
            tokens: a.tokens,
            pool: a.pool,
            placement: a.placement,
            replicas: a.replicas,
            node_id: a.node_id,
        }
    }

    /// Checks that `path` is UFS file `ino` and that its object holds its
    /// content.
    async fn ufs_target(&self, path: &str, ino: Ino) -> FsResult<(Attr, UfsTarget)> {
        let attr = self.namespace.stat(path, true).await?;
        if attr.ino != ino {
            return Err(FsError::Stale(format!(
                "{path} is no longer the file that was opened"
            )));
        }
        if attr.kind != FileKind::File {
            return Err(FsError::IsADirectory(path.to_string()));
        }
        let state = attr
            .ufs
            .clone()
            .ok_or_else(|| FsError::InvalidArgument(format!("{path} is not a UFS file")))?;
        if state.persist != Persist::Synced {
            return Err(FsError::InvalidArgument(format!(
                "{path}: its content is not in the UFS yet"
            )));
        }
        let mut found = self.mounts.find(path).filter(|(m, _)| m.id == state.mount);
        if found.is_none() {
            // This node may not have heard of the mount yet.
            self.mounts.refresh(&self.namespace).await?;
            found = self.mounts.find(path).filter(|(m, _)| m.id == state.mount);
        }
        let (mount, rel) =
            found.ok_or_else(|| FsError::Stale(format!("{path}: its mount is gone")))?;
        let ufs = self.mounts.client(&mount)?;
        let expect = UfsFile {
            name: String::new(),
            len: state.len,
            mtime_ns: state.mtime_ns,
            etag: state.etag.clone(),
        };
        Ok((
            attr,
            UfsTarget {
                mount,
                ufs,
                rel,
                expect,
            },
        ))
    }

    /// Starts reading block `index` of UFS file `ino` (at `path`) from its
    /// object: the bytes `[offset, offset + len)` of the block (widened to
    /// checksum units) are sent on the returned stream as they arrive, and,
    /// when the mount caches, the whole block is written to this node and
    /// recorded for the file (carried on to the end even if the reader goes
    /// away). An object that changed is `Stale`, never mixed bytes.
    pub async fn start_fill(
        self: &Arc<Self>,
        ino: Ino,
        path: &str,
        index: u32,
        offset: u64,
        len: u64,
        always_cache: bool,
    ) -> FsResult<FillStream> {
        let (attr, target) = self.ufs_target(path, ino).await?;
        let bs = attr.block_size.max(CHECKSUM_UNIT as u64);
        let block_start = index as u64 * bs;
        if block_start >= attr.size {
            return Err(FsError::InvalidArgument(format!(
                "block {index} is past the end of {path} ({} bytes)",
                attr.size
            )));
        }
        let block_len = bs.min(attr.size - block_start);
        let unit = CHECKSUM_UNIT as u64;
        let start = (offset.min(block_len) / unit) * unit;
        let end = offset
            .saturating_add(len)
            .min(block_len)
            .div_ceil(unit)
            .saturating_mul(unit)
            .min(block_len);
        let cache = if target.mount.auto_cache || always_cache {
            let expect = target.expect.clone();
            self.namespace
                .call_shard(shard_of(ino), move |reply| ShardMsg::UfsAddBlock {
                    ino,
                    index,
                    expect: expect.clone(),
                    reply,
                })
                .await?
        } else {
            None
        };
        // The block file, when caching.
        let file = match cache {
            Some(id) => {
                let tier = attr.storage;
                // A reader's fill makes room as a cache does; a load job's
                // (always_cache) does not drop cached blocks for it.
                let reserved = self
                    .manager
                    .reserve_with(id, tier, (block_len, false), None, !always_cache)
                    .await;
                match reserved.and_then(|r| {
                    OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&r.path)
                        .map(|f| (f, r.tier))
                        .map_err(|e| FsError::Io(format!("block file {}: {e}", r.path)))
                }) {
                    Ok((f, tier)) => Some((id, f, tier)),
                    Err(e) => {
                        self.manager.cast(BlockMsg::Abort { block: id });
                        self.ufs_abort_block(ino, id).await;
                        if always_cache {
                            // A load must cache: no room is its failure.
                            return Err(e);
                        }
                        // No room here: read through without caching.
                        tracing::debug!(path, error = %e, "not caching a UFS block");
                        None
                    }
                }
            }
            None => None,
        };
        let (from, count) = if file.is_some() {
            (block_start, block_len)
        } else {
            (block_start + start, end - start)
        };
        let etag = Some(target.expect.etag.clone()).filter(|e| !e.is_empty());
        let stream = match target
            .ufs
            .read(&target.rel, from, count, etag.as_deref())
            .await
        {
            Ok(s) => s,
            Err(e) => {
                if let Some((id, _, _)) = file {
                    self.manager.cast(BlockMsg::Abort { block: id });
                    self.ufs_abort_block(ino, id).await;
                }
                return Err(self.note_ufs_error(path, e));
            }
        };
        let (tx, rx) = mpsc::channel(4);
        let this = self.clone();
        let path = path.to_string();
        // The fill serves this request: it stays in its trace.
        let ctx = curvine_actors::trace::current();
        tokio::spawn(curvine_actors::trace::scope(ctx, async move {
            let from_block = from - block_start;
            let result = this
                .run_fill(
                    FillJob {
                        ino,
                        index,
                        path: path.clone(),
                        block_len,
                        from_block,
                        count,
                        start,
                        end,
                        expect: target.expect,
                        file,
                        replicas: attr.replicas,
                    },
                    Box::pin(stream),
                    &tx,
                )
                .await;
            if let Err(e) = result {
                let e = this.note_ufs_error(&path, e);
                let _ = tx.send(Err(e)).await;
            }
        }));
        Ok(FillStream {
            offset: start,
            len: end - start,
            chunks: rx,
        })
    }

    async fn run_fill(
        &self,
        job: FillJob,
        mut stream: std::pin::Pin<Box<dyn futures::Stream<Item = FsResult<Bytes>> + Send>>,
        tx: &mpsc::Sender<FillChunk>,
    ) -> FsResult<()> {
        let FillJob {
            ino,
            index,
            path,
            block_len,
            from_block,
            count,
            start,
            end,
            expect,
            mut file,
            replicas,
        } = job;
        let mut crcs_all: Vec<u32> = Vec::new();
        let mut pending: Vec<u8> = Vec::with_capacity(MAX_CHUNK);
        let mut pos = from_block; // block offset of `pending`'s first byte
        let mut reader_here = true;
        let mut got: u64 = 0;
        let outcome: FsResult<()> = async {
            loop {
                let next = stream.next().await;
                let done = next.is_none();
                if let Some(bytes) = next {
                    let bytes = bytes?;
                    got += bytes.len() as u64;
                    if got > count {
                        return Err(FsError::Stale(format!(
                            "{path}: the UFS object grew while it was read"
                        )));
                    }
                    pending.extend_from_slice(&bytes);
                }
                // Emit whole chunks (and the rest at the end).
                while pending.len() >= MAX_CHUNK || (done && !pending.is_empty()) {
                    let n = pending.len().min(MAX_CHUNK);
                    let chunk: Vec<u8> = pending.drain(..n).collect();
                    let crcs = unit_crcs(&chunk);
                    if let Some((_, f, _)) = file.as_mut() {
                        f.write_all(&chunk)
                            .map_err(|e| FsError::Io(format!("caching {path}: {e}")))?;
                        crcs_all.extend_from_slice(&crcs);
                    }
                    let (c_start, c_end) = (pos, pos + n as u64);
                    let (o_start, o_end) = (c_start.max(start), c_end.min(end));
                    if reader_here && o_start < o_end {
                        let a = (o_start - c_start) as usize;
                        let b = (o_end - c_start) as usize;
                        let ua = a / CHECKSUM_UNIT;
                        let ub = b.div_ceil(CHECKSUM_UNIT);
                        let part = chunk[a..b].to_vec();
                        if tx
                            .send(Ok((o_start, part, crcs[ua..ub].to_vec())))
                            .await
                            .is_err()
                        {
                            reader_here = false;
                        }
                    }
                    pos = c_end;
                    if !reader_here && file.is_none() {
                        return Ok(());
                    }
                }
                if done {
                    break;
                }
            }
            if got != count {
                return Err(FsError::Stale(format!(
                    "{path}: the UFS object has {got} bytes where {count} were expected from offset {from_block} of block {index}; it changed"
                )));
            }
            Ok(())
        }
        .await;
        let Some((id, f, tier)) = file.take() else {
            return outcome;
        };
        if let Err(e) = outcome {
            self.manager.cast(BlockMsg::Abort { block: id });
            self.ufs_abort_block(ino, id).await;
            return Err(e);
        }
        let synced = if self.blocks.syncs_kind(tier) {
            f.sync_data()
        } else {
            Ok(())
        };
        drop(f);
        if let Err(e) = synced {
            self.manager.cast(BlockMsg::Abort { block: id });
            self.ufs_abort_block(ino, id).await;
            return Err(FsError::Io(format!("caching {path}: {e}")));
        }
        let crcs = crcs_all.clone();
        let committed = self
            .manager
            .call(move |reply| BlockMsg::Commit {
                block: id,
                len: block_len,
                crcs: crcs.clone(),
                reply,
            })
            .await;
        let crc = match committed {
            Ok(crc) => crc,
            Err(e) => {
                self.ufs_abort_block(ino, id).await;
                return Err(e);
            }
        };
        debug_assert_eq!(crc, block_crc(&crcs_all));
        let info = BlockInfo {
            id,
            index,
            len: block_len,
            stored: block_len,
            crc,
            locs: vec![self.node_id.clone()],
        };
        let kept = self
            .namespace
            .call_shard(shard_of(ino), move |reply| ShardMsg::UfsCommitBlock {
                ino,
                info: info.clone(),
                expect: expect.clone(),
                reply,
            })
            .await?;
        if kept && replicas > 1 {
            let this_ino = ino;
            if let Err(e) = self.replicas.replicate_file(this_ino).await {
                tracing::debug!(path, error = %e, "replicating a cached UFS block");
            }
        }
        Ok(())
    }

    async fn ufs_abort_block(&self, ino: Ino, id: u64) {
        let r = self
            .namespace
            .call_shard(shard_of(ino), move |reply| ShardMsg::UfsAbortBlock {
                ino,
                id,
                reply,
            })
            .await;
        if let Err(e) = r {
            tracing::debug!(ino, block = id, error = %e, "giving up a cache block");
        }
    }

    /// Counts UFS errors (and logs them once, without secrets: errors never
    /// carry them).
    fn note_ufs_error(&self, path: &str, e: FsError) -> FsError {
        if matches!(e, FsError::Ufs(_) | FsError::Stale(_)) {
            tracing::warn!(path, error = %e, "UFS read failed");
        }
        e
    }

    /// Reads every block of `attr` (a file's committed content of `size`
    /// bytes) from the nodes holding them and writes it to `rel` of `ufs`.
    pub async fn upload(
        &self,
        ufs: &Ufs,
        rel: &str,
        attr: &Attr,
        blocks: &[BlockInfo],
    ) -> FsResult<UfsObject> {
        let mut writer = ufs.writer(rel).await?;
        let result = async {
            let bs = attr.block_size.max(1);
            let nodes = self.placement.live_nodes();
            let mut by_index: std::collections::BTreeMap<u32, &BlockInfo> =
                blocks.iter().map(|b| (b.index, b)).collect();
            let count = attr.size.div_ceil(bs);
            for index in 0..count {
                let want = bs.min(attr.size - index * bs);
                let mut sent = 0u64;
                if let Some(info) = by_index.remove(&(index as u32)) {
                    let node = info
                        .locs
                        .iter()
                        .find_map(|id| nodes.iter().find(|n| &n.node_id == id))
                        .ok_or_else(|| {
                            FsError::NodeDown(format!(
                                "block {index} of the file is only on node(s) {}",
                                info.locs.join(", ")
                            ))
                        })?;
                    let token = self.tokens.issue(info.id, Access::Read);
                    let have = info.len.min(want);
                    let mut chunks =
                        curvine_wire::data::BlockChunks::start(&self.pool, node, &token, have);
                    while let Some(chunk) = chunks.next().await {
                        let chunk = chunk?;
                        sent += chunk.len() as u64;
                        writer.write(Bytes::from(chunk)).await?;
                    }
                    if sent != have {
                        return Err(FsError::Io(format!(
                            "block {index}: {sent} bytes read where {have} were expected"
                        )));
                    }
                }
                // A hole, or bytes past a short block: zeros.
                while sent < want {
                    let n = (want - sent).min(MAX_CHUNK as u64);
                    writer.write(Bytes::from(vec![0u8; n as usize])).await?;
                    sent += n;
                }
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => writer.close().await,
            Err(e) => {
                writer.abort().await;
                Err(e)
            }
        }
    }

    /// Fills every block of UFS file `attr` (at `path`) not cached yet.
    pub async fn cache_whole(self: &Arc<Self>, path: &str, attr: &Attr) -> FsResult<u64> {
        let (_, blocks) = self.namespace.file_blocks_ino(attr.ino).await?;
        let have: std::collections::HashSet<u32> = blocks.iter().map(|b| b.index).collect();
        let bs = attr.block_size.max(CHECKSUM_UNIT as u64);
        let count = attr.size.div_ceil(bs) as u32;
        let mut bytes = 0u64;
        for index in 0..count {
            if have.contains(&index) {
                continue;
            }
            let mut fill = self
                .start_fill(attr.ino, path, index, 0, u64::MAX, true)
                .await?;
            while let Some(chunk) = fill.chunks.recv().await {
                let (_, data, _) = chunk?;
                bytes += data.len() as u64;
            }
        }
        Ok(bytes)
    }
}

/// The state a file has after its content was written to `obj`.
pub fn synced_state(mount: &MountInfo, obj: &UfsObject) -> UfsState {
    UfsState::synced(mount.id, obj.len, obj.mtime_ns, obj.etag.clone(), now_ns())
}

struct FillJob {
    ino: Ino,
    index: u32,
    path: String,
    block_len: u64,
    /// Block offset of the first byte read from the UFS.
    from_block: u64,
    /// Bytes read from the UFS.
    count: u64,
    /// The range the reader asked for (block offsets, unit-aligned).
    start: u64,
    end: u64,
    expect: UfsFile,
    file: Option<(u64, std::fs::File, curvine_messages::block::TierKind)>,
    replicas: u16,
}

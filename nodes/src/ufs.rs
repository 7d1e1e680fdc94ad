//! The node's UFS data work: reading UFS objects into cached blocks as a
//! reader asks for them (fills), and writing a file's cached content to its
//! UFS object (cache_mode close, fs_mode persist).

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use curvine_actors::mounts::Mounts;
use curvine_actors::ufs::UfsObject;
use curvine_messages::block::{
    block_crc, unit_crcs, Access, BlockInfo, BlockMsg, CHECKSUM_UNIT, MAX_CHUNK,
};
use curvine_messages::mount::{MountInfo, Persist, UfsFile, UfsOp, UfsState, WriteType};
use curvine_messages::shard::ShardMsg;
use curvine_messages::{now_ns, shard_of, Attr, FileKind, FsError, FsResult, Ino};

use crate::service::Service;

/// A UFS client for tools (benchmarks): the same client the nodes use.
pub use curvine_actors::ufs::{Ufs, UfsOptions, UfsUri};

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

impl Service {
    /// The mount a path is under, with the path below it.
    pub fn mount_of(&self, path: &str) -> Option<(MountInfo, String)> {
        self.mounts.find(path)
    }

    pub fn mounts(&self) -> &Arc<Mounts> {
        &self.mounts
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
        let mut found = self.mount_of(path).filter(|(m, _)| m.id == state.mount);
        if found.is_none() {
            // This node may not have heard of the mount yet.
            self.mounts.refresh(&self.namespace).await?;
            found = self.mount_of(path).filter(|(m, _)| m.id == state.mount);
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
                let reserved = self
                    .manager
                    .call(move |reply| BlockMsg::Reserve {
                        block: id,
                        tier,
                        size: block_len,
                        reply,
                    })
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
            locs: vec![self.info.node_id.clone()],
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
            if let Err(e) = self.replicate_file(this_ino).await {
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
            let nodes = self.live_nodes();
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

    /// The state a file has after its content was written to `obj`.
    pub fn synced_state(mount: &MountInfo, obj: &UfsObject) -> UfsState {
        UfsState::synced(mount.id, obj.len, obj.mtime_ns, obj.etag.clone(), now_ns())
    }
}

// ---- requests on paths under mounts ------------------------------------------

impl Service {
    /// The cache_mode mount `path` is under, with the path below it.
    fn cache_mount(&self, path: &str) -> Option<(MountInfo, String)> {
        let path = curvine_messages::path::normalize(path, "/").ok()?;
        self.mount_of(&path)
            .filter(|(m, _)| m.write_type == WriteType::CacheMode)
    }

    /// Runs `op`; when it finds nothing on a path under a cache_mode mount,
    /// brings the UFS objects on the path into the namespace and runs it
    /// again (so a name the UFS has is never missing, nor created anew).
    pub async fn through_ufs<T, F, Fut>(&self, path: &str, op: F) -> FsResult<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = FsResult<T>>,
    {
        match op().await {
            Err(FsError::NotFound(detail)) if self.cache_mount(path).is_some() => {
                match self.mounts.materialize(&self.namespace, path, false).await {
                    Ok(_) | Err(FsError::NotFound(_)) => op().await,
                    Err(e) => Err(e),
                }
                .map_err(|e| match e {
                    FsError::NotFound(d) if d.is_empty() => FsError::NotFound(detail),
                    other => other,
                })
            }
            other => other,
        }
    }

    /// Before a name is created under a cache_mode mount: brings an object
    /// the UFS already has at `path` (and the directories above it) into
    /// the namespace.
    async fn ufs_before_create(&self, path: &str) -> FsResult<()> {
        if self.cache_mount(path).is_none() {
            return Ok(());
        }
        match self.mounts.materialize(&self.namespace, path, true).await {
            Ok(_) | Err(FsError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Refuses changes to mount points themselves and to their ancestors.
    fn check_not_mount_point(&self, path: &str, what: &str) -> FsResult<()> {
        let path = curvine_messages::path::normalize(path, "/")?;
        let table = self.mounts.table();
        if let Some(m) = table.mounts.iter().find(|m| m.path == path) {
            return Err(FsError::Busy(format!(
                "{path} is the mount point of {}; umount it before {what}",
                m.ufs
            )));
        }
        if let Some(m) = table.has_mount_below(&path) {
            return Err(FsError::Busy(format!(
                "{path} holds the mount point {} ({}); umount it before {what}",
                m.path, m.ufs
            )));
        }
        Ok(())
    }

    async fn set_ufs(&self, ino: Ino, state: Option<UfsState>) -> FsResult<Attr> {
        self.namespace.set_ufs(ino, state).await
    }

    pub async fn ufs_stat(&self, path: &str) -> FsResult<Attr> {
        self.through_ufs(path, || self.namespace.stat(path, false))
            .await
    }

    pub async fn ufs_list(
        &self,
        path: &str,
        after: Option<String>,
        limit: u32,
    ) -> FsResult<curvine_messages::rpc::Listing> {
        if let Some((m, rel)) = self.cache_mount(path) {
            let attr = self
                .through_ufs(path, || self.namespace.stat(path, true))
                .await?;
            if attr.kind == FileKind::Dir && after.is_none() && self.mounts.needs_listing(&m, &attr)
            {
                let norm = curvine_messages::path::normalize(path, "/")?;
                self.mounts
                    .sync_dir(&self.namespace, &m, &rel, &attr, &norm)
                    .await?;
            }
        }
        self.through_ufs(path, || self.namespace.list(path, after.clone(), limit))
            .await
    }

    pub async fn ufs_mkdir(&self, r: &curvine_messages::rpc::Mkdir) -> FsResult<Attr> {
        let Some((m, rel)) = self.cache_mount(&r.path) else {
            return self
                .namespace
                .mkdir(&r.path, r.parents, r.mode, r.uid, r.gid)
                .await;
        };
        self.ufs_before_create(&r.path).await?;
        if let Ok(existing) = self.namespace.stat(&r.path, true).await {
            if r.parents && existing.kind == FileKind::Dir {
                return Ok(existing);
            }
            return Err(FsError::AlreadyExists(String::new()));
        }
        self.mounts.client(&m)?.mkdir(&rel).await?;
        let attr = self
            .namespace
            .mkdir(&r.path, r.parents, r.mode, r.uid, r.gid)
            .await?;
        self.set_ufs(
            attr.ino,
            Some(UfsState::synced(m.id, 0, now_ns(), String::new(), 0)),
        )
        .await
    }

    pub async fn ufs_touch(&self, r: &curvine_messages::rpc::Touch) -> FsResult<Attr> {
        let Some((m, rel)) = self.cache_mount(&r.path) else {
            return self
                .namespace
                .touch(&r.path, r.mode, r.exclusive, r.uid, r.gid)
                .await;
        };
        self.ufs_before_create(&r.path).await?;
        if self.namespace.stat(&r.path, true).await.is_ok() {
            return self
                .namespace
                .touch(&r.path, r.mode, r.exclusive, r.uid, r.gid)
                .await;
        }
        let obj = self.mounts.client(&m)?.write_all(&rel, Vec::new()).await?;
        let attr = self
            .namespace
            .touch(&r.path, r.mode, r.exclusive, r.uid, r.gid)
            .await?;
        self.set_ufs(attr.ino, Some(Self::synced_state(&m, &obj)))
            .await
    }

    pub async fn ufs_symlink(
        &self,
        target: &str,
        link: &str,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        if let Some((m, _)) = self.mount_of(&curvine_messages::path::normalize(link, "/")?) {
            return Err(FsError::NotSupported(format!(
                "symbolic links under mount {} ({}): the UFS cannot hold them",
                m.path, m.ufs
            )));
        }
        self.namespace.symlink(target, link, uid, gid).await
    }

    pub async fn ufs_rename(&self, src: &str, dst: &str) -> FsResult<()> {
        let (src_n, dst_n) = (
            curvine_messages::path::normalize(src, "/")?,
            curvine_messages::path::normalize(dst, "/")?,
        );
        self.check_not_mount_point(&src_n, "renaming it")?;
        let (sm, dm) = (self.mount_of(&src_n), self.mount_of(&dst_n));
        match (&sm, &dm) {
            (None, None) => return self.namespace.rename(src, dst).await,
            (Some((a, _)), Some((b, _))) if a.id == b.id => {}
            _ => {
                return Err(FsError::CrossDevice(format!(
                    "{src} and {dst} are not in the same mount; copy, then remove"
                )))
            }
        }
        let (m, src_rel) = sm.expect("checked above");
        let dst_rel = dm.expect("checked above").1;
        if m.write_type != WriteType::CacheMode {
            let attr = self.namespace.stat(&src_n, false).await?;
            self.namespace.rename(src, dst).await?;
            self.journal(
                m.id,
                vec![UfsOp::Rename {
                    from: src_n,
                    to: dst_n,
                    dir: attr.kind == FileKind::Dir,
                }],
            )
            .await;
            return Ok(());
        }
        let attr = self
            .through_ufs(src, || self.namespace.stat(src, false))
            .await?;
        self.ufs_before_create(dst).await?;
        if let Ok(existing) = self.namespace.stat(&dst_n, false).await {
            if existing.kind == FileKind::Dir && attr.kind != FileKind::Dir {
                return Err(FsError::IsADirectory(dst.to_string()));
            }
        }
        let ufs = self.mounts.client(&m)?;
        if attr.kind == FileKind::Dir {
            // Everything below must be in the UFS: list it whole first.
            ufs.rename(&src_rel, &dst_rel, true).await?;
        } else if attr.ufs.is_some() {
            ufs.rename(&src_rel, &dst_rel, false).await?;
        }
        self.namespace.rename(src, dst).await
    }

    pub async fn ufs_remove(
        &self,
        path: &str,
        recursive: bool,
        dir: bool,
    ) -> FsResult<curvine_messages::rpc::RemoveSummary> {
        self.check_not_mount_point(path, "removing it")?;
        let Some((m, rel)) = self.cache_mount(path) else {
            let norm = curvine_messages::path::normalize(path, "/")?;
            let Some((m, _)) = self.mount_of(&norm) else {
                return self.namespace.remove(path, recursive, dir).await;
            };
            // fs_mode: the cluster first, the UFS in the background.
            let attr = self.namespace.stat(&norm, false).await?;
            let summary = self.namespace.remove(path, recursive, dir).await?;
            self.journal(
                m.id,
                vec![UfsOp::Delete {
                    path: norm,
                    dir: attr.kind == FileKind::Dir,
                }],
            )
            .await;
            return Ok(summary);
        };
        let attr = self
            .through_ufs(path, || self.namespace.stat(path, false))
            .await?;
        let ufs = self.mounts.client(&m)?;
        if attr.kind == FileKind::Dir {
            if !recursive {
                // Empty here must mean empty there too.
                let page = ufs.list_page(&rel, None, 2).await?;
                if !page.entries.is_empty() {
                    return Err(FsError::NotEmpty(format!(
                        "{path}: the UFS has {} below it",
                        ufs.uri().join(&rel)
                    )));
                }
                if !dir {
                    return Err(FsError::IsADirectory(String::new()));
                }
            }
            ufs.delete_dir(&rel).await?;
        } else {
            if dir {
                return Err(FsError::NotADirectory(String::new()));
            }
            ufs.delete(&rel).await?;
        }
        match self.namespace.remove(path, recursive, dir).await {
            Err(FsError::NotFound(_)) => {
                Ok(curvine_messages::rpc::RemoveSummary { files: 0, dirs: 0 })
            }
            other => other,
        }
    }

    pub async fn ufs_setattr(
        &self,
        path: &str,
        set: curvine_messages::SetAttr,
        follow: bool,
    ) -> FsResult<Attr> {
        if set.size.is_some() && self.cache_mount(path).is_some() {
            return Err(FsError::NotSupported(format!(
                "{path}: changing the size of a cache_mode file in place; open it for writing with truncation instead"
            )));
        }
        self.through_ufs(path, || self.namespace.setattr(path, set.clone(), follow))
            .await
    }

    /// Opens a file for writing. Under a cache_mode mount an object the UFS
    /// has is brought in first, and its content cached whole when the
    /// writer keeps it (an append, an overwrite without truncation).
    pub async fn ufs_open_write(
        self: &Arc<Self>,
        r: &curvine_messages::rpc::OpenFile,
    ) -> FsResult<curvine_actors::namespace::Opened> {
        let norm = curvine_messages::path::normalize(&r.path, "/")?;
        let Some((m, _)) = self.mount_of(&norm) else {
            return self.namespace.open_write(r).await;
        };
        // New files under a mount take the mount's layout unless asked otherwise.
        let mut r = r.clone();
        if r.spec.block_size == 0 {
            r.spec.block_size = m.block_size.unwrap_or(0);
        }
        if r.spec.replicas == 0 {
            r.spec.replicas = m.replicas.unwrap_or(0);
        }
        if r.spec.storage.is_none() {
            r.spec.storage = m.storage;
        }
        let r = &r;
        if m.write_type == WriteType::CacheMode {
            self.ufs_before_create(&r.path).await?;
            if !r.truncate {
                if let Ok(attr) = self.namespace.stat(&r.path, true).await {
                    if attr.kind == FileKind::File && attr.ufs.is_some() && attr.size > 0 {
                        self.cache_whole(&r.path, &attr).await?;
                    }
                }
            }
        }
        self.namespace.open_write(r).await
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

    /// Closes a written file. Under a cache_mode mount its content goes to
    /// the UFS object first (multipart when large) and the file is only
    /// switched to it once the upload completed: a failed upload leaves the
    /// previous content, in the UFS and here.
    pub async fn ufs_complete(&self, r: curvine_messages::rpc::CompleteFile) -> FsResult<Attr> {
        let ns = &self.namespace;
        let mount = match curvine_messages::path::normalize(&r.path, "/") {
            Ok(p) if !r.abort && !r.path.is_empty() => self.mount_of(&p),
            _ => None,
        };
        let Some((m, rel)) = mount else {
            return ns.complete_file(r.ino, r.handle, r.size, r.blocks).await;
        };
        if m.write_type == WriteType::FsMode {
            // Waiting to be persisted, recorded with the close itself: a
            // crash right after still leaves the file to persist.
            let state = UfsState::pending(m.id, now_ns());
            let attr = ns
                .complete_file_ufs(r.ino, r.handle, r.size, r.blocks, Some(state))
                .await?;
            self.journal(
                m.id,
                vec![UfsOp::Put {
                    path: curvine_messages::path::normalize(&r.path, "/")?,
                    ino: attr.ino,
                }],
            )
            .await;
            return Ok(attr);
        }
        // The content after the close: the new blocks over the old ones.
        let (current, old) = ns.file_blocks_ino(r.ino).await?;
        let mut merged: std::collections::BTreeMap<u32, BlockInfo> =
            old.into_iter().map(|b| (b.index, b)).collect();
        for b in &r.blocks {
            merged.insert(b.index, b.clone());
        }
        let bs = current.block_size.max(1);
        merged.retain(|i, _| (*i as u64) * bs < r.size);
        let mut shape = current.clone();
        shape.size = r.size;
        let blocks: Vec<BlockInfo> = merged.into_values().collect();
        let ufs = self.mounts.client(&m)?;
        let obj = match self.upload(&ufs, &rel, &shape, &blocks).await {
            Ok(obj) => obj,
            Err(e) => {
                // Give the lease back; the file keeps its old content.
                let _ = ns
                    .complete_file(r.ino, r.handle, current.size, Vec::new())
                    .await;
                return Err(e.with_detail(format!(
                    "writing {} to {} (the file keeps its previous content)",
                    r.path,
                    ufs.uri().join(&rel)
                )));
            }
        };
        ns.complete_file_ufs(
            r.ino,
            r.handle,
            r.size,
            r.blocks,
            Some(Self::synced_state(&m, &obj)),
        )
        .await
    }

    /// Opens a file for reading. A cache_mode file whose check interval
    /// passed is compared with its UFS object first; a UFS file's blocks
    /// that are not cached are read through this node (or the node with room).
    pub async fn ufs_open_read(&self, path: &str) -> FsResult<curvine_messages::rpc::ReadOpen> {
        let (mut attr, mut blocks) = self
            .through_ufs(path, || self.namespace.file_blocks(path))
            .await?;
        let mut ufs = None;
        if let Some(state) = attr.ufs.clone() {
            let norm = curvine_messages::path::normalize(path, "/")?;
            if let Some((m, rel)) = self.mount_of(&norm).filter(|(m, _)| m.id == state.mount) {
                if m.write_type == WriteType::CacheMode {
                    let checked = self
                        .mounts
                        .revalidate(&self.namespace, &m, &rel, &norm, attr.clone())
                        .await?;
                    if checked.ufs.as_ref().map(|u| (&u.etag, u.len, u.mtime_ns))
                        != attr.ufs.as_ref().map(|u| (&u.etag, u.len, u.mtime_ns))
                    {
                        (attr, blocks) = self.namespace.file_blocks_ino(checked.ino).await?;
                    } else {
                        attr = checked;
                    }
                }
                if attr
                    .ufs
                    .as_ref()
                    .is_some_and(|u| u.persist == Persist::Synced)
                {
                    ufs = Some(curvine_messages::rpc::UfsRead {
                        token: self.tokens.issue(attr.ino, Access::Fill),
                        node: self.place(attr.block_size),
                    });
                }
            }
        }
        let blocks = blocks
            .into_iter()
            .map(|info| curvine_messages::block::ReadBlock {
                token: self.tokens.issue(info.id, Access::Read),
                info,
            })
            .collect();
        Ok(curvine_messages::rpc::ReadOpen {
            attr,
            blocks,
            nodes: self.live_nodes(),
            ufs,
        })
    }
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

//! `Namespace`: path operations over the shards of the cluster.
//!
//! It resolves paths one component at a time (each lookup touches the one
//! shard that holds the directory), runs single-shard operations as one
//! message, and drives cross-shard operations through their intent. It holds
//! no state of its own besides the rename lock, so any number of requests run
//! through it concurrently; it is shared by the client server and recovery.
//!
//! Cross-directory moves of directories are serialised by one lock (as Linux
//! does with its per-filesystem rename mutex) so that two concurrent moves
//! cannot build a cycle between them.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::RpcReplyPort;

use curvine_messages::block::{
    check_block_size, BlockId, BlockInfo, BlockUse, FileSpec, FreedBlock, WriteLease,
};
use curvine_messages::cluster::PeerMsg;
use curvine_messages::path::{check_name, components, join};
use curvine_messages::rpc::{FsckReport, ListEntry, Listing, OpenFile, RemoveSummary};
use curvine_messages::shard::{
    Intent, IntentOp, NewFile, OpenForWrite, RenameOutcome, ShardMsg, ShardScan, Step, StepResult,
    UnlinkOutcome,
};
use curvine_messages::{
    check_xattr, dir_shard, now_ns, shard_of, Attr, DirEntry, FileKind, FsError, FsResult, Ino,
    NewInode, OpId, SetAttr, ShardId, ShardStats, TimeSet, XattrMode, MAX_SYMLINK_LEN, ROOT_INO,
};

use crate::cluster::{ClusterView, Route};
use crate::host::ShardDirectory;
use crate::store::check_rename_kinds;

/// Most symlinks followed while resolving one path.
const MAX_SYMLINK_HOPS: usize = 40;
/// Entries read per page when a whole directory is walked.
const PAGE: u32 = 1024;

/// Defaults for files' data.
#[derive(Debug, Clone)]
pub struct FileDefaults {
    pub block_size: u64,
    pub replicas: u16,
    /// A writer's lease not renewed for this long may be taken over.
    pub lease_timeout: Duration,
}

impl Default for FileDefaults {
    fn default() -> Self {
        FileDefaults {
            block_size: curvine_messages::block::DEFAULT_BLOCK_SIZE,
            replicas: 1,
            lease_timeout: Duration::from_secs(60),
        }
    }
}

/// A file opened for writing.
#[derive(Debug, Clone)]
pub struct Opened {
    pub attr: Attr,
    /// The blocks the file has now.
    pub blocks: Vec<BlockInfo>,
    pub handle: u64,
    /// The block the writer starts in, allocated with the open.
    pub first: Option<(u32, BlockId)>,
}

pub struct Namespace {
    /// This namespace itself, so intent drivers can run in tasks of their own.
    me: Weak<Namespace>,
    files: FileDefaults,
    cluster: Arc<ClusterView>,
    shard_count: u32,
    timeout: Duration,
    rename_lock: tokio::sync::Mutex<()>,
}

/// How a path's last component is treated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// Resolve a symlink at the end too (`stat -L`, `ls`).
    All,
    /// Stop at the last component (`lstat`, `readlink`, `rm`).
    Intermediate,
}

impl Namespace {
    /// A namespace over shards that all run on this node.
    pub fn new(directory: ShardDirectory, timeout: Duration) -> Arc<Namespace> {
        Self::with_cluster(
            ClusterView::standalone(directory),
            timeout,
            FileDefaults::default(),
        )
    }

    pub fn with_cluster(
        cluster: Arc<ClusterView>,
        timeout: Duration,
        files: FileDefaults,
    ) -> Arc<Namespace> {
        let shard_count = cluster.shard_count;
        Arc::new_cyclic(|me| Namespace {
            me: me.clone(),
            files,
            cluster,
            shard_count,
            timeout,
            rename_lock: tokio::sync::Mutex::new(()),
        })
    }

    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// The block size of files that do not set one.
    pub fn default_block_size(&self) -> u64 {
        self.files.block_size
    }

    pub fn cluster(&self) -> &Arc<ClusterView> {
        &self.cluster
    }

    /// Sends a message nobody waits for to a shard, wherever it is served.
    fn cast(&self, shard: ShardId, msg: ShardMsg) {
        match self.cluster.route(shard) {
            Ok(Route::Local(actor)) => {
                self.cluster.metrics.shard_sent(shard);
                if actor.cast(crate::trace::traced(msg)).is_err() {
                    self.cluster.metrics.shard(shard).unsent();
                }
            }
            Ok(Route::Remote { gateway, .. }) => {
                let _ = gateway.cast(PeerMsg::Shard {
                    shard,
                    direct: false,
                    msg,
                    trace: crate::trace::current().map(|c| (c, now_ns())),
                });
            }
            Err(_) => {}
        }
    }

    // ---- calling shards ----------------------------------------------------

    /// Where a call goes: the node serving `shard` by the map, or the copy
    /// of the shard on node `at` whatever the map says (`direct`).
    fn target(&self, shard: ShardId, at: Option<&str>) -> FsResult<(Route, bool)> {
        match at {
            None => Ok((self.cluster.route(shard)?, false)),
            Some(node) if node == self.cluster.node_id => {
                Ok((Route::Local(self.cluster.local().get(shard)?), true))
            }
            Some(node) => Ok((
                Route::Remote {
                    node: node.to_string(),
                    gateway: self.cluster.gateway(node)?,
                },
                true,
            )),
        }
    }

    async fn call_once<T: Send + 'static>(
        &self,
        shard: ShardId,
        at: Option<&str>,
        build: &(impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync),
        wait: Duration,
    ) -> FsResult<T> {
        let (route, direct) = self.target(shard, at)?;
        let result = match route {
            Route::Local(actor) => {
                let stats = self.cluster.metrics.shard(shard);
                stats.sent();
                let r = actor
                    .call(|reply| crate::trace::traced(build(reply)), Some(wait))
                    .await;
                if matches!(r, Err(ractor::MessagingErr::SendErr(_))) {
                    stats.unsent();
                }
                r.map_err(drop)
            }
            // A node that goes down while it holds the request (a partition
            // stalls its connection) fails the request then, not at the timeout.
            Route::Remote { gateway, node } => tokio::select! {
                r = gateway.call(
                    |reply| PeerMsg::Shard {
                        shard,
                        direct,
                        msg: build(reply),
                        trace: crate::trace::current().map(|c| (c, now_ns())),
                    },
                    Some(wait),
                ) => r.map_err(drop),
                e = self.cluster.wait_down(&node) => {
                    return Err(match e {
                        FsError::NodeDown(d) => {
                            FsError::NodeDown(format!("shard {shard} is served by {d}"))
                        }
                        other => other,
                    })
                }
            },
        };
        match result {
            Ok(CallResult::Success(result)) => result,
            Ok(CallResult::Timeout) => Err(FsError::TimedOut(format!(
                "shard {shard} did not answer in {wait:?}"
            ))),
            Ok(CallResult::SenderError) | Err(_) => Err(FsError::Unavailable(format!(
                "shard {shard} stopped while handling the request"
            ))),
        }
    }

    /// Calls a shard (see [`Self::target`] for `at`), retrying while it is
    /// busy or restarting, up to `deadline`.
    async fn call_until<T: Send + 'static>(
        &self,
        shard: ShardId,
        at: Option<&str>,
        deadline: Option<Instant>,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        let mut delay = Duration::from_micros(500);
        loop {
            let wait = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
                None => self.timeout,
            };
            match self.call_once(shard, at, &build, wait).await {
                // Without a deadline (intent steps) a node that is down is
                // waited for: the step may still be applied there.
                Err(e)
                    if e.is_retryable()
                        || matches!(e, FsError::TimedOut(_))
                        || (deadline.is_none() && matches!(e, FsError::NodeDown(_))) =>
                {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(e);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    /// Sets (or clears) what inode `ino` mirrors of its UFS object.
    pub async fn set_ufs(
        &self,
        ino: Ino,
        ufs: Option<curvine_messages::mount::UfsState>,
    ) -> FsResult<Attr> {
        self.call(shard_of(ino), move |reply| ShardMsg::SetUfs {
            ino,
            ufs: ufs.clone(),
            reply,
        })
        .await
    }

    /// Calls the node serving `shard` (retrying until the request timeout).
    pub async fn call_shard<T: Send + 'static>(
        &self,
        shard: ShardId,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        self.call(shard, build).await
    }

    /// A request-scoped call: retries until the request timeout.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        shard: ShardId,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        self.call_until(shard, None, Some(Instant::now() + self.timeout), build)
            .await
    }

    /// An intent step: retried until it gets a definite answer. Steps run in
    /// a task of their own, so a request that times out does not stop them.
    async fn step(
        &self,
        shard: ShardId,
        op: OpId,
        step_no: u8,
        step: Step,
    ) -> FsResult<StepResult> {
        self.call_until(shard, None, None, move |reply| ShardMsg::ApplyStep {
            op,
            step_no,
            step: step.clone(),
            reply,
        })
        .await
    }

    async fn end_intent(&self, op: OpId) -> FsResult<()> {
        self.call_until(shard_of(op), None, None, |reply| ShardMsg::EndIntent {
            op,
            reply,
        })
        .await
    }

    async fn abort_intent(&self, op: OpId) -> FsResult<()> {
        self.call_until(shard_of(op), None, None, |reply| ShardMsg::AbortIntent {
            op,
            reply,
        })
        .await
    }

    // ---- single lookups ----------------------------------------------------

    pub async fn lookup(&self, parent: Ino, name: &str) -> FsResult<DirEntry> {
        let name = name.to_string();
        self.call(shard_of(parent), move |reply| ShardMsg::Lookup {
            parent,
            name: name.clone(),
            reply,
        })
        .await
    }

    pub async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.call(shard_of(ino), move |reply| ShardMsg::GetAttr { ino, reply })
            .await
    }

    pub async fn readdir(
        &self,
        ino: Ino,
        after: Option<String>,
        limit: u32,
    ) -> FsResult<Vec<DirEntry>> {
        self.call(shard_of(ino), move |reply| ShardMsg::ReadDir {
            ino,
            after: after.clone(),
            limit,
            reply,
        })
        .await
    }

    // ---- path resolution ---------------------------------------------------

    /// Resolves normalised path components to the inode they name.
    async fn resolve_parts(&self, parts: &[String], follow: Follow) -> FsResult<Attr> {
        let mut pending: Vec<String> = parts.iter().rev().cloned().collect();
        let mut done: Vec<String> = Vec::new();
        let mut current: Ino = ROOT_INO;
        let mut current_kind = FileKind::Dir;
        let mut hops = 0;
        // Attributes of `current` when the last lookup brought them along.
        let mut current_attr: Option<Attr> = None;
        while let Some(name) = pending.pop() {
            if current_kind != FileKind::Dir {
                return Err(FsError::NotADirectory(join(&done)));
            }
            let last = pending.is_empty();
            let (entry, attr) = if last {
                // The final inode is usually in its directory's shard: one hop.
                let name = name.clone();
                self.call(shard_of(current), move |reply| ShardMsg::LookupAttr {
                    parent: current,
                    name: name.clone(),
                    reply,
                })
                .await?
            } else {
                (self.lookup(current, &name).await?, None)
            };
            if entry.kind == FileKind::Symlink && (!last || follow == Follow::All) {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(FsError::TooManyLinks(join(parts)));
                }
                let link = match attr {
                    Some(attr) => attr,
                    None => self.getattr(entry.ino).await?,
                };
                let target = link.symlink.unwrap_or_default();
                let base = if target.starts_with('/') {
                    "/".to_string()
                } else {
                    join(&done)
                };
                let target_parts = components(&target, &base)?;
                for part in target_parts.into_iter().rev() {
                    pending.push(part);
                }
                // The target's components are absolute: continue from the root.
                done.clear();
                current = ROOT_INO;
                current_kind = FileKind::Dir;
                current_attr = None;
                continue;
            }
            done.push(name);
            current = entry.ino;
            current_kind = entry.kind;
            current_attr = attr;
        }
        match current_attr {
            Some(attr) => Ok(attr),
            None => self.getattr(current).await,
        }
    }

    pub async fn resolve(&self, path: &str) -> FsResult<Attr> {
        self.resolve_parts(&components(path, "/")?, Follow::All)
            .await
    }

    /// Resolves the parent directory of a path; returns it with the last name.
    async fn resolve_parent(&self, path: &str) -> FsResult<(Attr, String)> {
        let parts = components(path, "/")?;
        let Some((name, parent)) = parts.split_last() else {
            return Err(FsError::InvalidArgument(
                "the root directory has no parent".into(),
            ));
        };
        let parent = self.resolve_parts(parent, Follow::All).await?;
        if parent.kind != FileKind::Dir {
            return Err(FsError::NotADirectory(String::new()));
        }
        Ok((parent, name.clone()))
    }

    // ---- operations --------------------------------------------------------

    /// `stat`: follows a symlink at the end when `follow` is set.
    pub async fn stat(&self, path: &str, follow: bool) -> FsResult<Attr> {
        let follow = if follow {
            Follow::All
        } else {
            Follow::Intermediate
        };
        self.resolve_parts(&components(path, "/")?, follow).await
    }

    pub async fn mkdir(
        &self,
        path: &str,
        parents: bool,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let parts = components(path, "/")?;
        let attrs = |now| NewInode {
            kind: FileKind::Dir,
            mode,
            uid,
            gid,
            symlink: None,
            now_ns: now,
        };
        if parts.is_empty() {
            return if parents {
                self.getattr(ROOT_INO).await
            } else {
                Err(FsError::AlreadyExists(String::new()))
            };
        }
        if !parents {
            let (parent, name) = self.resolve_parent(path).await?;
            return self.mkdir_at(parent.ino, &name, attrs(now_ns())).await;
        }
        let mut current = self.getattr(ROOT_INO).await?;
        for (i, name) in parts.iter().enumerate() {
            let existing = match self.lookup(current.ino, name).await {
                Ok(entry) => Some(entry),
                Err(FsError::NotFound(_)) => None,
                Err(e) => return Err(e),
            };
            current = match existing {
                Some(entry) if entry.kind != FileKind::Symlink => self.getattr(entry.ino).await?,
                Some(_) => self.resolve_parts(&parts[..=i], Follow::All).await?,
                None => match self.mkdir_at(current.ino, name, attrs(now_ns())).await {
                    Ok(attr) => attr,
                    // Someone else made it meanwhile: fine for -p.
                    Err(FsError::AlreadyExists(_)) => {
                        self.resolve_parts(&parts[..=i], Follow::All).await?
                    }
                    Err(e) => return Err(e),
                },
            };
            if current.kind != FileKind::Dir {
                return Err(if i + 1 == parts.len() {
                    FsError::AlreadyExists(String::new())
                } else {
                    FsError::NotADirectory(join(&parts[..=i]))
                });
            }
        }
        Ok(current)
    }

    /// Creates directory `name` in `parent`; its inode goes to the shard its
    /// name hashes to.
    pub async fn mkdir_at(&self, parent: Ino, name: &str, attrs: NewInode) -> FsResult<Attr> {
        check_name(name)?;
        let home = shard_of(parent);
        let child = dir_shard(parent, name, self.shard_count);
        let name = name.to_string();
        if child == home {
            return self
                .call(home, move |reply| ShardMsg::MkdirLocal {
                    parent,
                    name: name.clone(),
                    attrs: attrs.clone(),
                    reply,
                })
                .await;
        }
        let action = IntentOp::Mkdir {
            parent,
            name,
            attrs,
            child_shard: child,
        };
        self.begin_and_drive(home, action)
            .await
            .map(|attr| attr.expect("mkdir returns the new directory"))
    }

    /// Lists a directory (or names a single file), with attributes.
    pub async fn list(&self, path: &str, after: Option<String>, limit: u32) -> FsResult<Listing> {
        let parts = components(path, "/")?;
        let attr = self.resolve_parts(&parts, Follow::All).await?;
        if attr.kind != FileKind::Dir {
            let name = parts.last().cloned().unwrap_or_else(|| "/".into());
            return Ok(Listing {
                entries: vec![ListEntry { name, attr }],
                more: false,
            });
        }
        let limit = limit.clamp(1, 100_000);
        let ino = attr.ino;
        let entries = self
            .call(shard_of(ino), move |reply| ShardMsg::ReadDirPlus {
                ino,
                after: after.clone(),
                limit: limit + 1,
                reply,
            })
            .await?;
        let more = entries.len() > limit as usize;
        let mut out = Vec::with_capacity(entries.len().min(limit as usize));
        for (entry, attr) in entries.into_iter().take(limit as usize) {
            let attr = match attr {
                Some(attr) => attr,
                // Held by another shard (a subdirectory, a moved file).
                None => match self.getattr(entry.ino).await {
                    Ok(attr) => attr,
                    // Removed between readdir and getattr: skip it, as ls does.
                    Err(FsError::NotFound(_)) => continue,
                    Err(e) => return Err(e),
                },
            };
            out.push(ListEntry {
                name: entry.name,
                attr,
            });
        }
        Ok(Listing { entries: out, more })
    }

    pub async fn touch(
        &self,
        path: &str,
        mode: u32,
        exclusive: bool,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let (parent, name) = self.resolve_parent(path).await?;
        let attrs = NewInode {
            kind: FileKind::File,
            mode,
            uid,
            gid,
            symlink: None,
            now_ns: now_ns(),
        };
        match self.create_at(parent.ino, &name, attrs).await {
            Err(FsError::AlreadyExists(_)) if !exclusive => {
                let existing = self.resolve(path).await?;
                let set = SetAttr {
                    atime: Some(TimeSet::Now),
                    mtime: Some(TimeSet::Now),
                    ..Default::default()
                };
                self.setattr_ino(existing.ino, set).await
            }
            other => other,
        }
    }

    pub async fn create_at(&self, parent: Ino, name: &str, attrs: NewInode) -> FsResult<Attr> {
        check_name(name)?;
        let name = name.to_string();
        self.call(shard_of(parent), move |reply| ShardMsg::Create {
            parent,
            name: name.clone(),
            attrs: attrs.clone(),
            file: None,
            reply,
        })
        .await
    }

    // ---- file data ---------------------------------------------------------

    /// The layout a new file gets: the writer's wishes over the defaults.
    pub fn resolve_spec(&self, spec: &FileSpec) -> FsResult<FileSpec> {
        let block_size = if spec.block_size == 0 {
            self.files.block_size
        } else {
            check_block_size(spec.block_size)?
        };
        Ok(FileSpec {
            block_size,
            replicas: if spec.replicas == 0 {
                self.files.replicas
            } else {
                spec.replicas
            },
            storage: spec.storage,
        })
    }

    /// Opens a file for writing (creating it when asked), taking its write
    /// lease. Returns the attributes, the blocks the file has now (for an
    /// append) and the writer's handle.
    pub async fn open_write(&self, open: &OpenFile) -> FsResult<Opened> {
        let spec = self.resolve_spec(&open.spec)?;
        let handle: u64 = rand::random::<u64>() | 1;
        let lease = WriteLease {
            handle,
            client: open.client.clone(),
            renewed_ns: now_ns(),
        };
        let (parent, name) = self.resolve_parent(&open.path).await?;
        check_name(&name)?;
        for _ in 0..3 {
            let found = {
                let name = name.clone();
                let parent = parent.ino;
                self.call(shard_of(parent), move |reply| ShardMsg::LookupAttr {
                    parent,
                    name: name.clone(),
                    reply,
                })
                .await
            };
            let ino = match found {
                Err(FsError::NotFound(_)) if open.create => {
                    let attrs = NewInode {
                        kind: FileKind::File,
                        mode: open.mode,
                        uid: open.uid,
                        gid: open.gid,
                        symlink: None,
                        now_ns: now_ns(),
                    };
                    let file = NewFile {
                        spec: spec.clone(),
                        lease: Some(lease.clone()),
                    };
                    let parent = parent.ino;
                    let name = name.clone();
                    match self
                        .call(shard_of(parent), move |reply| ShardMsg::CreateFile {
                            parent,
                            name: name.clone(),
                            attrs: attrs.clone(),
                            file: file.clone(),
                            reply,
                        })
                        .await
                    {
                        Ok((attr, block)) => {
                            return Ok(Opened {
                                attr,
                                blocks: Vec::new(),
                                handle,
                                first: Some((0, block)),
                            })
                        }
                        // Created by someone else meanwhile: open that one.
                        Err(FsError::AlreadyExists(_)) if !open.exclusive => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(FsError::NotFound(m)) if m.is_empty() => {
                    return Err(FsError::NotFound(open.path.clone()))
                }
                Err(e) => return Err(e),
                Ok(_) if open.exclusive => return Err(FsError::AlreadyExists(String::new())),
                Ok((entry, _)) if entry.kind == FileKind::Symlink => {
                    self.resolve(&open.path).await?.ino
                }
                Ok((entry, _)) if entry.kind == FileKind::Dir => {
                    return Err(FsError::IsADirectory(String::new()))
                }
                Ok((entry, _)) => entry.ino,
            };
            let lease = lease.clone();
            let spec = spec.clone();
            let truncate = open.truncate;
            let timeout = self.files.lease_timeout.as_nanos() as i64;
            let append = open.append;
            let (attr, blocks, first) = self
                .call(shard_of(ino), move |reply| ShardMsg::OpenWrite {
                    ino,
                    open: OpenForWrite {
                        lease: lease.clone(),
                        spec: spec.clone(),
                        truncate,
                        lease_timeout_ns: timeout,
                        first_block: Some(append),
                    },
                    reply,
                })
                .await?;
            let index = if append {
                (attr.size / attr.block_size.max(1)) as u32
            } else {
                0
            };
            return Ok(Opened {
                first: first.map(|b| (index, b)),
                attr,
                blocks,
                handle,
            });
        }
        Err(FsError::Busy(
            "the file was created and removed repeatedly while opening it".into(),
        ))
    }

    /// Allocates block `index` of a file being written.
    pub async fn add_block(&self, ino: Ino, handle: u64, index: u32) -> FsResult<BlockId> {
        self.call(shard_of(ino), move |reply| ShardMsg::AddBlock {
            ino,
            handle,
            index,
            reply,
        })
        .await
    }

    /// Closes a written file with its new blocks and size.
    pub async fn complete_file(
        &self,
        ino: Ino,
        handle: u64,
        size: u64,
        blocks: Vec<BlockInfo>,
    ) -> FsResult<Attr> {
        self.complete_file_ufs(ino, handle, size, blocks, None)
            .await
    }

    /// Closes a written file and, in the same commit, records what it now
    /// is to its UFS (persisted, or waiting to be).
    pub async fn complete_file_ufs(
        &self,
        ino: Ino,
        handle: u64,
        size: u64,
        blocks: Vec<BlockInfo>,
        ufs: Option<curvine_messages::mount::UfsState>,
    ) -> FsResult<Attr> {
        self.call(shard_of(ino), move |reply| ShardMsg::CompleteFile {
            ino,
            handle,
            size,
            blocks: blocks.clone(),
            ufs: ufs.clone(),
            reply,
        })
        .await
    }

    /// Attributes and blocks of the file at `path` (following symlinks).
    pub async fn file_blocks(&self, path: &str) -> FsResult<(Attr, Vec<BlockInfo>)> {
        let attr = self.resolve(path).await?;
        self.file_blocks_ino(attr.ino).await
    }

    pub async fn file_blocks_ino(&self, ino: Ino) -> FsResult<(Attr, Vec<BlockInfo>)> {
        self.call(shard_of(ino), move |reply| ShardMsg::FileBlocks {
            ino,
            reply,
        })
        .await
    }

    /// What blocks allocated by `shard` are used for.
    /// What blocks allocated by `shard` are used for, as seen from this node.
    pub async fn check_blocks(&self, shard: ShardId, ids: Vec<BlockId>) -> FsResult<Vec<BlockUse>> {
        let node = self.cluster.node_id.clone();
        self.call(shard, move |reply| ShardMsg::CheckBlocks {
            ids: ids.clone(),
            node: node.clone(),
            reply,
        })
        .await
    }

    /// Committed blocks of a shard after `after` (see `ShardMsg::ScanBlocks`).
    pub async fn scan_blocks(
        &self,
        shard: ShardId,
        after: Option<(Ino, u32)>,
        limit: u32,
    ) -> FsResult<Vec<(Ino, u16, BlockInfo)>> {
        self.call(shard, move |reply| ShardMsg::ScanBlocks {
            after,
            limit,
            reply,
        })
        .await
    }

    /// Compare-and-set of the cluster map held by shard 0.
    pub async fn set_map(
        &self,
        expect: u64,
        map: curvine_messages::cluster::ClusterMap,
    ) -> FsResult<curvine_messages::cluster::ClusterMap> {
        self.call(0, move |reply| ShardMsg::SetMap {
            expect,
            map: map.clone(),
            reply,
        })
        .await
    }

    /// Records the nodes of a block (see `ShardMsg::SetLocs`).
    pub async fn set_locs(
        &self,
        ino: Ino,
        index: u32,
        id: BlockId,
        locs: Vec<String>,
    ) -> FsResult<bool> {
        self.call(shard_of(ino), move |reply| ShardMsg::SetLocs {
            ino,
            index,
            id,
            locs: locs.clone(),
            reply,
        })
        .await
    }

    /// Calls `node`'s own copy of `shard`, whatever the map says (the steps
    /// of a shard move). Retries while the copy restarts, up to the request
    /// timeout.
    pub async fn call_at<T: Send + 'static>(
        &self,
        node: &str,
        shard: ShardId,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> ShardMsg + Send + Sync,
    ) -> FsResult<T> {
        self.call_until(
            shard,
            Some(node),
            Some(Instant::now() + self.timeout),
            build,
        )
        .await
    }

    /// Freed blocks of a shard, to remove from their nodes.
    pub async fn take_freed(&self, shard: ShardId, limit: u32) -> FsResult<Vec<FreedBlock>> {
        self.call(shard, move |reply| ShardMsg::TakeFreed { limit, reply })
            .await
    }

    pub fn forget_freed(&self, shard: ShardId, ids: Vec<BlockId>) {
        self.cast(shard, ShardMsg::ForgetFreed { ids });
    }

    pub async fn symlink(&self, target: &str, link: &str, uid: u32, gid: u32) -> FsResult<Attr> {
        if target.is_empty() {
            return Err(FsError::NotFound("empty symlink target".into()));
        }
        if target.len() > MAX_SYMLINK_LEN || target.contains('\0') {
            return Err(FsError::NameTooLong(format!(
                "symlink target longer than {MAX_SYMLINK_LEN} bytes or with NUL"
            )));
        }
        let (parent, name) = self.resolve_parent(link).await?;
        let attrs = NewInode {
            kind: FileKind::Symlink,
            mode: 0o777,
            uid,
            gid,
            symlink: Some(target.into()),
            now_ns: now_ns(),
        };
        self.create_at(parent.ino, &name, attrs).await
    }

    pub async fn readlink(&self, path: &str) -> FsResult<String> {
        let attr = self.stat(path, false).await?;
        attr.symlink
            .ok_or_else(|| FsError::InvalidArgument("not a symbolic link".into()))
    }

    pub async fn setattr(&self, path: &str, set: SetAttr, follow: bool) -> FsResult<Attr> {
        let attr = self.stat(path, follow).await?;
        self.setattr_ino(attr.ino, set).await
    }

    pub async fn setattr_ino(&self, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        self.call(shard_of(ino), move |reply| ShardMsg::SetAttr {
            ino,
            set: set.clone(),
            reply,
        })
        .await
    }

    pub async fn set_xattr(
        &self,
        path: &str,
        name: &str,
        value: Vec<u8>,
        mode: XattrMode,
    ) -> FsResult<()> {
        check_xattr(name, Some(&value))?;
        let ino = self.resolve(path).await?.ino;
        let name = name.to_string();
        self.call(shard_of(ino), move |reply| ShardMsg::SetXattr {
            ino,
            name: name.clone(),
            value: value.clone(),
            mode,
            reply,
        })
        .await
    }

    pub async fn get_xattr(&self, path: &str, name: &str) -> FsResult<Vec<u8>> {
        let ino = self.resolve(path).await?.ino;
        let name = name.to_string();
        self.call(shard_of(ino), move |reply| ShardMsg::GetXattr {
            ino,
            name: name.clone(),
            reply,
        })
        .await
    }

    pub async fn list_xattr(&self, path: &str) -> FsResult<Vec<String>> {
        let ino = self.resolve(path).await?.ino;
        self.call(shard_of(ino), move |reply| ShardMsg::ListXattr {
            ino,
            reply,
        })
        .await
    }

    pub async fn remove_xattr(&self, path: &str, name: &str) -> FsResult<()> {
        let ino = self.resolve(path).await?.ino;
        let name = name.to_string();
        self.call(shard_of(ino), move |reply| ShardMsg::RemoveXattr {
            ino,
            name: name.clone(),
            reply,
        })
        .await
    }

    /// POSIX rename of paths.
    pub async fn rename(&self, src: &str, dst: &str) -> FsResult<()> {
        let src_parts = components(src, "/")?;
        let dst_parts = components(dst, "/")?;
        if src_parts.is_empty() || dst_parts.is_empty() {
            return Err(FsError::Busy("cannot rename the root directory".into()));
        }
        let (src_parent, src_name) = self.resolve_parent(src).await?;
        let entry = self.lookup(src_parent.ino, &src_name).await?;
        let (dst_parent, dst_name) = self.resolve_parent(dst).await?;
        if entry.kind == FileKind::Dir && src_parent.ino != dst_parent.ino {
            // Local requests queue here; the cluster-wide lock on shard 0
            // orders them against other nodes' moves.
            let _guard = self.rename_lock.lock().await;
            let holder = self.lock_renames().await?;
            let result = async {
                self.check_not_inside(entry.ino, dst_parent.ino).await?;
                self.rename_at(src_parent.ino, &src_name, dst_parent.ino, &dst_name)
                    .await
            }
            .await;
            let h = holder.clone();
            let _ = self
                .call(0, move |reply| ShardMsg::UnlockRenames {
                    holder: h.clone(),
                    reply,
                })
                .await;
            result?;
        } else {
            self.rename_at(src_parent.ino, &src_name, dst_parent.ino, &dst_name)
                .await?;
        }
        if shard_of(entry.ino) != shard_of(dst_parent.ino) {
            // The inode lives on another shard than its new parent (a
            // directory): its ctime changes there, as the rename's own shard
            // cannot reach it in the same commit.
            if let Err(e) = self.setattr_ino(entry.ino, SetAttr::default()).await {
                tracing::debug!(ino = entry.ino, error = %e, "ctime of a renamed inode not updated");
            }
        }
        Ok(())
    }

    /// Takes the cluster's rename lock, waiting up to the request timeout.
    async fn lock_renames(&self) -> FsResult<String> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let holder = format!(
            "{}#{}",
            self.cluster.node_id,
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let deadline = Instant::now() + self.timeout;
        let lease_ms = self.timeout.as_millis().min(u32::MAX as u128) as u32;
        let mut delay = Duration::from_millis(1);
        loop {
            let h = holder.clone();
            let taken = self
                .call(0, move |reply| ShardMsg::LockRenames {
                    holder: h.clone(),
                    lease_ms,
                    reply,
                })
                .await?;
            if taken {
                return Ok(holder);
            }
            if Instant::now() >= deadline {
                return Err(FsError::Busy(
                    "another directory move held the rename lock for the whole request timeout"
                        .into(),
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(50));
        }
    }

    /// EINVAL when `dir` is `target` or one of its ancestors.
    async fn check_not_inside(&self, dir: Ino, target: Ino) -> FsResult<()> {
        let mut current = target;
        for _ in 0..100_000 {
            if current == dir {
                return Err(FsError::InvalidArgument(
                    "cannot move a directory into itself".into(),
                ));
            }
            if current == ROOT_INO {
                return Ok(());
            }
            current = self.getattr(current).await?.parent;
        }
        Err(FsError::Corrupt(format!(
            "directory {target:#x} has no path to the root"
        )))
    }

    async fn rename_at(
        &self,
        src_parent: Ino,
        src_name: &str,
        dst_parent: Ino,
        dst_name: &str,
    ) -> FsResult<()> {
        check_name(dst_name)?;
        let (sn, dn) = (src_name.to_string(), dst_name.to_string());
        let home = shard_of(src_parent);
        if home == shard_of(dst_parent) {
            let outcome = self
                .call(home, |reply| ShardMsg::RenameLocal {
                    src_parent,
                    src_name: sn.clone(),
                    dst_parent,
                    dst_name: dn.clone(),
                    reply,
                })
                .await?;
            if outcome == RenameOutcome::Done {
                return Ok(());
            }
        }
        let action = IntentOp::Rename {
            src_parent,
            src_name: sn,
            dst_parent,
            dst_name: dn,
            ino: 0,
            kind: FileKind::File,
        };
        self.begin_and_drive(home, action).await.map(|_| ())
    }

    /// Removes a path: files and symlinks; a directory when `dir` (must be
    /// empty) or `recursive` (with everything below it).
    pub async fn remove(&self, path: &str, recursive: bool, dir: bool) -> FsResult<RemoveSummary> {
        let (parent, name) = self.resolve_parent(path).await?;
        let entry = self.lookup(parent.ino, &name).await?;
        let mut summary = RemoveSummary { files: 0, dirs: 0 };
        if entry.kind == FileKind::Dir {
            if recursive {
                Box::pin(self.remove_tree(entry.ino, &mut summary)).await?;
            } else if !dir {
                return Err(FsError::IsADirectory(String::new()));
            }
            self.rmdir_at(parent.ino, &name, entry.ino).await?;
            summary.dirs += 1;
        } else {
            if dir {
                return Err(FsError::NotADirectory(String::new()));
            }
            self.unlink_at(parent.ino, &name).await?;
            summary.files += 1;
        }
        Ok(summary)
    }

    async fn remove_tree(&self, dir: Ino, summary: &mut RemoveSummary) -> FsResult<()> {
        loop {
            let entries = self.readdir(dir, None, PAGE).await?;
            if entries.is_empty() {
                return Ok(());
            }
            for entry in entries {
                if entry.kind == FileKind::Dir {
                    Box::pin(self.remove_tree(entry.ino, summary)).await?;
                    self.rmdir_at(dir, &entry.name, entry.ino).await?;
                    summary.dirs += 1;
                } else {
                    match self.unlink_at(dir, &entry.name).await {
                        Ok(()) | Err(FsError::NotFound(_)) => summary.files += 1,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }

    pub async fn unlink_at(&self, parent: Ino, name: &str) -> FsResult<()> {
        let name = name.to_string();
        let outcome = self
            .call(shard_of(parent), move |reply| ShardMsg::Unlink {
                parent,
                name: name.clone(),
                reply,
            })
            .await?;
        match outcome {
            UnlinkOutcome::Done(_) => Ok(()),
            UnlinkOutcome::Pending(_, intent) => self.drive_in_task(intent).await.map(|_| ()),
        }
    }

    pub async fn rmdir_at(&self, parent: Ino, name: &str, ino: Ino) -> FsResult<()> {
        let home = shard_of(parent);
        let name = name.to_string();
        if shard_of(ino) == home {
            return self
                .call(home, move |reply| ShardMsg::RmdirLocal {
                    parent,
                    name: name.clone(),
                    reply,
                })
                .await
                .map(|_| ());
        }
        let action = IntentOp::Rmdir {
            parent,
            name,
            ino: 0,
        };
        self.begin_and_drive(home, action).await.map(|_| ())
    }

    // ---- driving intents ---------------------------------------------------

    /// Drives an intent in a task of its own: a caller that gives up (timeout,
    /// disconnect) does not leave it half done.
    async fn drive_in_task(&self, intent: Intent) -> FsResult<Option<Attr>> {
        let this = self
            .me
            .upgrade()
            .ok_or_else(|| FsError::Unavailable("the node is stopping".into()))?;
        let nodes = self.intent_nodes(&intent);
        // The steps stay in the caller's trace.
        let ctx = crate::trace::current();
        let task = tokio::spawn(crate::trace::scope(
            ctx,
            async move { this.drive(intent).await },
        ));
        // A step waits for a node that is down (it must not be rolled back
        // while the node may still apply it); the caller learns at once.
        let down = async {
            let waits = nodes.iter().map(|n| Box::pin(self.cluster.wait_down(n)));
            match waits.len() {
                0 => std::future::pending().await,
                _ => futures_select_all(waits.collect()).await,
            }
        };
        tokio::select! {
            r = tokio::time::timeout(self.timeout, task) => match r {
                Ok(Ok(result)) => result,
                Ok(Err(join)) => Err(FsError::Io(format!("intent driver failed: {join}"))),
                Err(_) => Err(FsError::TimedOut(
                    "operation still in progress; it will complete".into(),
                )),
            },
            e = down => Err(match e {
                FsError::NodeDown(d) => FsError::NodeDown(format!(
                    "{d}; the operation completes or is undone when that node is back"
                )),
                other => other,
            }),
        }
    }

    /// The other nodes an intent's steps go to.
    fn intent_nodes(&self, intent: &Intent) -> Vec<String> {
        let shards: Vec<ShardId> = match &intent.action {
            IntentOp::Mkdir {
                parent,
                child_shard,
                ..
            } => vec![shard_of(*parent), *child_shard],
            IntentOp::Rmdir { parent, ino, .. } => vec![shard_of(*parent), shard_of(*ino)],
            IntentOp::Rename {
                src_parent,
                dst_parent,
                ino,
                ..
            } => vec![shard_of(*src_parent), shard_of(*dst_parent), shard_of(*ino)],
            IntentOp::DropLink { ino } => vec![shard_of(*ino)],
        };
        let map = self.cluster.map();
        let mut nodes: Vec<String> = shards
            .into_iter()
            .filter_map(|s| map.owner(s).map(str::to_string))
            .filter(|n| *n != self.cluster.node_id)
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Records a cross-shard operation in shard `home` and drives it.
    async fn begin_and_drive(&self, home: ShardId, action: IntentOp) -> FsResult<Option<Attr>> {
        let intent = self
            .call(home, move |reply| ShardMsg::BeginIntent {
                action: action.clone(),
                reply,
            })
            .await?;
        self.drive_in_task(intent).await
    }

    /// Drives an intent to its end from its first step (finished steps return
    /// their recorded results). Returns the created directory for mkdir.
    pub async fn drive(&self, intent: Intent) -> FsResult<Option<Attr>> {
        let op = intent.op;
        let home = shard_of(op);
        match intent.action {
            IntentOp::Mkdir {
                parent,
                name,
                attrs,
                child_shard,
            } => {
                if intent.aborting {
                    self.end_intent(op).await?;
                    return Err(FsError::Io("mkdir was rolled back".into()));
                }
                let created = match self
                    .step(child_shard, op, 1, Step::CreateDirInode { attrs, parent })
                    .await
                {
                    Ok(StepResult::Created(attr)) => *attr,
                    Ok(other) => {
                        return Err(FsError::Corrupt(format!("mkdir step 1 returned {other:?}")))
                    }
                    Err(e) => return self.abort(op, &[], e).await,
                };
                self.step(
                    home,
                    op,
                    2,
                    Step::LinkName {
                        parent,
                        name,
                        ino: created.ino,
                        kind: FileKind::Dir,
                    },
                )
                .await?;
                self.end_intent(op).await?;
                Ok(Some(created))
            }
            IntentOp::Rmdir { parent, name, ino } => {
                if intent.aborting {
                    self.end_intent(op).await?;
                    return Err(FsError::NotEmpty(String::new()));
                }
                if let Err(e) = self
                    .step(shard_of(ino), op, 1, Step::RemoveDirIfEmpty { ino })
                    .await
                {
                    return self.abort(op, &[], e).await;
                }
                self.step(home, op, 2, Step::UnlinkName { parent, name, ino })
                    .await?;
                self.end_intent(op).await?;
                Ok(None)
            }
            IntentOp::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ino,
                kind,
            } => {
                let dst_home = shard_of(dst_parent);
                let unlock_dst = (
                    dst_home,
                    Step::UnlockName {
                        parent: dst_parent,
                        name: dst_name.clone(),
                    },
                );
                if intent.aborting {
                    self.step(dst_home, op, 8, unlock_dst.1).await?;
                    self.end_intent(op).await?;
                    return Err(FsError::Io("rename was rolled back".into()));
                }
                let existing = match self
                    .step(
                        dst_home,
                        op,
                        1,
                        Step::LockName {
                            parent: dst_parent,
                            name: dst_name.clone(),
                        },
                    )
                    .await
                {
                    Ok(StepResult::Existing(e)) => e,
                    Ok(other) => {
                        return Err(FsError::Corrupt(format!(
                            "rename step 1 returned {other:?}"
                        )))
                    }
                    Err(e) => return self.abort(op, &[], e).await,
                };
                if let Some(e) = &existing {
                    if e.ino == ino {
                        // Both names are links to one inode: POSIX does nothing.
                        self.step(dst_home, op, 8, unlock_dst.1).await?;
                        self.end_intent(op).await?;
                        return Ok(None);
                    }
                    if let Err(err) = check_rename_kinds(kind, e.kind) {
                        return self.abort(op, &[unlock_dst], err).await;
                    }
                    if e.kind == FileKind::Dir {
                        if let Err(err) = self
                            .step(
                                shard_of(e.ino),
                                op,
                                2,
                                Step::RemoveDirIfEmpty { ino: e.ino },
                            )
                            .await
                        {
                            return self.abort(op, &[unlock_dst], err).await;
                        }
                    }
                }
                self.step(
                    dst_home,
                    op,
                    3,
                    Step::LinkName {
                        parent: dst_parent,
                        name: dst_name,
                        ino,
                        kind,
                    },
                )
                .await?;
                self.step(
                    home,
                    op,
                    4,
                    Step::UnlinkName {
                        parent: src_parent,
                        name: src_name,
                        ino,
                    },
                )
                .await?;
                if kind == FileKind::Dir && src_parent != dst_parent {
                    self.step(
                        shard_of(ino),
                        op,
                        5,
                        Step::SetDirParent {
                            ino,
                            parent: dst_parent,
                        },
                    )
                    .await?;
                }
                let mut touched = vec![dst_home, shard_of(ino)];
                if let Some(e) = existing.clone().filter(|e| e.kind != FileKind::Dir) {
                    self.step(shard_of(e.ino), op, 6, Step::DropLink { ino: e.ino })
                        .await?;
                    touched.push(shard_of(e.ino));
                } else if let Some(e) = &existing {
                    touched.push(shard_of(e.ino));
                }
                self.end_intent(op).await?;
                Ok(None)
            }
            IntentOp::DropLink { ino } => {
                self.step(shard_of(ino), op, 1, Step::DropLink { ino })
                    .await?;
                self.end_intent(op).await?;
                Ok(None)
            }
        }
    }

    /// Rolls an intent back before anything irreversible happened: mark it,
    /// release names on other shards, then end it. Returns `error`.
    async fn abort<T>(&self, op: OpId, unlocks: &[(ShardId, Step)], error: FsError) -> FsResult<T> {
        self.abort_intent(op).await?;
        for (shard, step) in unlocks {
            self.step(*shard, op, 8, step.clone()).await?;
        }
        self.end_intent(op).await?;
        Err(error)
    }

    /// Drives every intent recorded in `shard` (after it started). Returns how many.
    pub async fn redrive(&self, shard: ShardId) -> FsResult<usize> {
        let intents = self
            .call_until(shard, None, None, |reply| ShardMsg::ListIntents { reply })
            .await?;
        let count = intents.len();
        for intent in intents {
            let op = intent.op;
            match self.drive(intent).await {
                Ok(_) => tracing::info!(
                    shard,
                    op = format!("{op:#x}"),
                    "re-drove intent to completion"
                ),
                Err(e) => {
                    tracing::info!(shard, op = format!("{op:#x}"), outcome = %e, "re-drove intent (rolled back)")
                }
            }
        }
        Ok(count)
    }

    // ---- inspection --------------------------------------------------------

    /// Counters of the shards this node serves.
    pub async fn shard_stats(&self) -> FsResult<Vec<ShardStats>> {
        let mut out = Vec::new();
        for shard in self.cluster.map().shards_of(&self.cluster.node_id) {
            out.push(self.call(shard, |reply| ShardMsg::Stats { reply }).await?);
        }
        Ok(out)
    }

    /// Checks the namespace across all shards.
    pub async fn fsck(&self) -> FsResult<FsckReport> {
        let mut scans: Vec<ShardScan> = Vec::new();
        for shard in 0..self.shard_count as ShardId {
            scans.push(self.call(shard, |reply| ShardMsg::Scan { reply }).await?);
        }
        Ok(check_scans(&scans))
    }
}

/// Consistency rules of the namespace, checked over every shard's content.
pub fn check_scans(scans: &[ShardScan]) -> FsckReport {
    use std::collections::HashMap;
    let mut report = FsckReport::default();
    let mut inodes: HashMap<Ino, &Attr> = HashMap::new();
    for scan in scans {
        for attr in &scan.inodes {
            if shard_of(attr.ino) != scan.shard {
                report.problems.push(format!(
                    "inode {:#x} stored on shard {} but named for shard {}",
                    attr.ino,
                    scan.shard,
                    shard_of(attr.ino)
                ));
            }
            inodes.insert(attr.ino, attr);
        }
        report.pending_intents += scan.intents.len() as u64;
        report.locks += scan.locks;
    }
    report.inodes = inodes.len() as u64;
    let mut links: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    for scan in scans {
        for (parent, entry) in &scan.dentries {
            report.dentries += 1;
            if shard_of(*parent) != scan.shard {
                report.problems.push(format!(
                    "entry '{}' of directory {parent:#x} stored on shard {}",
                    entry.name, scan.shard
                ));
            }
            match inodes.get(parent) {
                Some(p) if p.kind == FileKind::Dir => {}
                Some(_) => report.problems.push(format!(
                    "entry '{}' under non-directory {parent:#x}",
                    entry.name
                )),
                None => report.problems.push(format!(
                    "entry '{}' under missing directory {parent:#x}",
                    entry.name
                )),
            }
            match inodes.get(&entry.ino) {
                None => report.problems.push(format!(
                    "dangling entry '{}' in {parent:#x} -> missing inode {:#x}",
                    entry.name, entry.ino
                )),
                Some(attr) if attr.kind != entry.kind => report.problems.push(format!(
                    "entry '{}' in {parent:#x} says {} but inode {:#x} is a {}",
                    entry.name,
                    entry.kind.name(),
                    entry.ino,
                    attr.kind.name()
                )),
                Some(attr) => {
                    if attr.kind == FileKind::Dir {
                        *subdirs.entry(*parent).or_default() += 1;
                        if attr.parent != *parent {
                            report.problems.push(format!(
                                "directory {:#x} is in {parent:#x} but its '..' is {:#x}",
                                attr.ino, attr.parent
                            ));
                        }
                    }
                }
            }
            *links.entry(entry.ino).or_default() += 1;
        }
    }
    for (ino, attr) in &inodes {
        if attr.kind == FileKind::Dir {
            report.directories += 1;
            let expected = 2 + subdirs.get(ino).copied().unwrap_or(0);
            if attr.nlink != expected {
                report.problems.push(format!(
                    "directory {ino:#x} has nlink {} but {} subdirectories",
                    attr.nlink,
                    expected - 2
                ));
            }
        }
        if *ino == ROOT_INO {
            continue;
        }
        let refs = links.get(ino).copied().unwrap_or(0);
        if refs == 0 {
            report.problems.push(format!(
                "orphan {} inode {ino:#x} (no entry points to it)",
                attr.kind.name()
            ));
        } else if attr.kind == FileKind::Dir && refs != 1 {
            report
                .problems
                .push(format!("directory {ino:#x} has {refs} entries"));
        } else if attr.kind != FileKind::Dir && refs != attr.nlink {
            report.problems.push(format!(
                "inode {ino:#x} has nlink {} but {refs} entries",
                attr.nlink
            ));
        }
    }
    if !inodes.contains_key(&ROOT_INO) {
        report.problems.push("the root directory is missing".into());
    }
    report.problems.sort();
    report
}

/// The first of several futures to finish.
async fn futures_select_all<F: std::future::Future + Unpin>(futures: Vec<F>) -> F::Output {
    let mut futures = futures;
    std::future::poll_fn(move |cx| {
        for f in futures.iter_mut() {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(f).poll(cx) {
                return std::task::Poll::Ready(out);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

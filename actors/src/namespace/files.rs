//! File data: the layout of new files, writers (open with a lease, add
//! blocks, complete), a file's blocks and their nodes, freed blocks, and a
//! file's UFS state.

use curvine_messages::block::{
    check_block_size, BlockId, BlockInfo, BlockUse, FileSpec, FreedBlock, WriteLease,
};
use curvine_messages::path::check_name;
use curvine_messages::rpc::OpenFile;
use curvine_messages::shard::{NewFile, OpenForWrite, ShardMsg};
use curvine_messages::{
    now_ns, shard_of, Attr, FileKind, FsError, FsResult, Ino, NewInode, SetAttr, ShardId,
};

use super::{Namespace, Opened};

impl Namespace {
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
        set: Option<SetAttr>,
    ) -> FsResult<Attr> {
        self.complete_file_ufs(ino, handle, size, blocks, None, set)
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
        set: Option<SetAttr>,
    ) -> FsResult<Attr> {
        self.call(shard_of(ino), move |reply| ShardMsg::CompleteFile {
            ino,
            handle,
            size,
            blocks: blocks.clone(),
            ufs: ufs.clone(),
            set: set.clone(),
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

    /// Freed blocks of a shard, to remove from their nodes.
    pub async fn take_freed(&self, shard: ShardId, limit: u32) -> FsResult<Vec<FreedBlock>> {
        self.call(shard, move |reply| ShardMsg::TakeFreed { limit, reply })
            .await
    }

    pub fn forget_freed(&self, shard: ShardId, ids: Vec<BlockId>) {
        self.cast(shard, ShardMsg::ForgetFreed { ids });
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
}

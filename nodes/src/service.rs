//! Answers client requests with the node's actors.

use std::sync::Arc;

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::namespace::Namespace;
use curvine_actors::token::TokenKey;
use curvine_messages::block::{Access, BlockId, BlockMsg, DataNode, FreeSummary, ReadBlock};
use curvine_messages::rpc::{
    BlockDetail, BlockGrant, BlockReplica, ClusterReport, FileBlocks, NodeReport, ReadOpen,
    Request, Response, WriteOpen,
};
use curvine_messages::{FileKind, FsResult};

/// What the node tells about itself in reports.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub cluster_id: String,
    pub node_id: String,
    pub rpc_addr: String,
    pub cluster_addr: String,
    pub data_dir: String,
    pub started_ns: i64,
}

pub struct Service {
    pub namespace: Arc<Namespace>,
    pub info: NodeInfo,
    pub blocks: Arc<BlockStore>,
    pub manager: BlockManagerRef,
    pub tokens: TokenKey,
    /// This node's data port, as clients reach it.
    pub data: DataNode,
}

impl Service {
    pub fn cluster_id(&self) -> &str {
        &self.info.cluster_id
    }

    pub fn node_id(&self) -> &str {
        &self.info.node_id
    }

    /// The nodes a block list names (one node for now: this one).
    fn nodes_of(&self) -> Vec<DataNode> {
        vec![self.data.clone()]
    }

    /// A new block to write on this node.
    fn grant(&self, id: BlockId, index: u32) -> BlockGrant {
        BlockGrant {
            id,
            index,
            token: self.tokens.issue(id, Access::Write),
            node: self.data.clone(),
        }
    }

    async fn free_path(&self, path: &str) -> FsResult<FreeSummary> {
        let mut ids: Vec<BlockId> = Vec::new();
        let mut stack = vec![path.to_string()];
        while let Some(p) = stack.pop() {
            let attr = self.namespace.stat(&p, false).await?;
            match attr.kind {
                FileKind::File => {
                    let (_, blocks) = self.namespace.file_blocks_ino(attr.ino).await?;
                    ids.extend(blocks.iter().map(|b| b.id));
                }
                FileKind::Dir => {
                    let mut after = None;
                    loop {
                        let page = self.namespace.list(&p, after.clone(), 1024).await?;
                        for e in &page.entries {
                            stack.push(format!("{}/{}", p.trim_end_matches('/'), e.name));
                        }
                        if !page.more {
                            break;
                        }
                        after = page.entries.last().map(|e| e.name.clone());
                    }
                }
                FileKind::Symlink => {}
            }
        }
        self.manager
            .call(move |reply| BlockMsg::Free {
                ids: ids.clone(),
                reply,
            })
            .await
    }

    async fn file_blocks(&self, path: &str) -> FsResult<FileBlocks> {
        let (attr, blocks) = self.namespace.file_blocks(path).await?;
        let mut out = Vec::with_capacity(blocks.len());
        for info in blocks {
            let replicas = info
                .locs
                .iter()
                .map(|node| {
                    let here = (node == &self.info.node_id)
                        .then(|| self.blocks.locate(info.id).ok())
                        .flatten();
                    BlockReplica {
                        node_id: node.clone(),
                        tier: here.as_ref().map(|(r, _)| r.kind),
                        path: here.map(|(_, p)| p.display().to_string()),
                    }
                })
                .collect();
            out.push(BlockDetail { info, replicas });
        }
        Ok(FileBlocks { attr, blocks: out })
    }

    pub async fn handle(&self, request: Request) -> FsResult<Response> {
        let ns = &self.namespace;
        Ok(match request {
            Request::Stat(r) => Response::Attr(ns.stat(&r.path, false).await?),
            Request::Mkdir(r) => {
                Response::Attr(ns.mkdir(&r.path, r.parents, r.mode, r.uid, r.gid).await?)
            }
            Request::List(r) => Response::Listing(ns.list(&r.path, r.after, r.limit).await?),
            Request::Touch(r) => {
                Response::Attr(ns.touch(&r.path, r.mode, r.exclusive, r.uid, r.gid).await?)
            }
            Request::Symlink(r) => {
                Response::Attr(ns.symlink(&r.target, &r.link, r.uid, r.gid).await?)
            }
            Request::Readlink(r) => Response::Target(ns.readlink(&r.path).await?),
            Request::Rename(r) => Response::Done(ns.rename(&r.src, &r.dst).await?),
            Request::Remove(r) => Response::Removed(ns.remove(&r.path, r.recursive, r.dir).await?),
            Request::SetAttrs(r) => Response::Attr(ns.setattr(&r.path, r.set).await?),
            Request::SetXattr(r) => {
                Response::Done(ns.set_xattr(&r.path, &r.name, r.value, r.mode).await?)
            }
            Request::GetXattr(r) => Response::Bytes(ns.get_xattr(&r.path, &r.name).await?),
            Request::ListXattr(r) => Response::Names(ns.list_xattr(&r.path).await?),
            Request::RemoveXattr(r) => Response::Done(ns.remove_xattr(&r.path, &r.name).await?),
            Request::Report(_) => Response::Report(ClusterReport {
                cluster_id: self.info.cluster_id.clone(),
                shard_count: ns.shard_count(),
                nodes: vec![NodeReport {
                    node_id: self.info.node_id.clone(),
                    rpc_addr: self.info.rpc_addr.clone(),
                    cluster_addr: self.info.cluster_addr.clone(),
                    started_ns: self.info.started_ns,
                    data_dir: self.info.data_dir.clone(),
                    data_addr: self.data.data_addr.clone(),
                    shards: ns.shard_stats().await?,
                    tiers: self.blocks.stats(),
                    checksum_errors: self
                        .blocks
                        .checksum_errors
                        .load(std::sync::atomic::Ordering::Relaxed),
                }],
            }),
            Request::Fsck(_) => Response::Fsck(ns.fsck().await?),
            Request::OpenFile(r) => {
                let opened = ns.open_write(&r).await?;
                Response::WriteOpen(WriteOpen {
                    first: opened.first.map(|(index, id)| self.grant(id, index)),
                    attr: opened.attr,
                    handle: opened.handle,
                    blocks: opened.blocks,
                })
            }
            Request::AddBlock(r) => {
                let id = ns.add_block(r.ino, r.handle, r.index).await?;
                Response::Grant(self.grant(id, r.index))
            }
            Request::CompleteFile(r) => {
                Response::Attr(ns.complete_file(r.ino, r.handle, r.size, r.blocks).await?)
            }
            Request::OpenRead(r) => {
                let (attr, blocks) = ns.file_blocks(&r.path).await?;
                let blocks = blocks
                    .into_iter()
                    .map(|info| ReadBlock {
                        token: self.tokens.issue(info.id, Access::Read),
                        info,
                    })
                    .collect();
                Response::ReadOpen(ReadOpen {
                    attr,
                    blocks,
                    nodes: self.nodes_of(),
                })
            }
            Request::FreePath(r) => Response::Freed(self.free_path(&r.path).await?),
            Request::Blocks(r) => Response::FileBlocks(self.file_blocks(&r.path).await?),
        })
    }
}

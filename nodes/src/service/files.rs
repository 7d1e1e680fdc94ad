//! What the CLI's `fs free` and `fs blocks` ask of files: dropping cached
//! blocks under a path, and where each block of a file is.

use std::sync::Arc;

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::namespace::Namespace;
use curvine_messages::block::{BlockId, BlockMsg, FreeSummary};
use curvine_messages::rpc::{BlockDetail, BlockReplica, FileBlocks};
use curvine_messages::{FileKind, FsResult};

pub struct Files {
    namespace: Arc<Namespace>,
    blocks: Arc<BlockStore>,
    manager: BlockManagerRef,
    node_id: String,
    metrics: curvine_actors::stats::Metrics,
}

/// What `curvine_data_bytes_local_total` counts (the data port counts
/// short-circuit opens, this service passthrough opens).
pub const LOCAL_BYTES_HELP: &str = "Block bytes this node handed to readers on its host as block files (short-circuit and passthrough reads): a block's length each time a reader opens it, so at most what they read.";

impl Files {
    pub fn new(
        namespace: Arc<Namespace>,
        blocks: Arc<BlockStore>,
        manager: BlockManagerRef,
        node_id: String,
        metrics: curvine_actors::stats::Metrics,
    ) -> Files {
        Files {
            metrics,
            namespace,
            blocks,
            manager,
            node_id,
        }
    }

    /// Drops the cached blocks of the files under `path` that can be read
    /// again (from the UFS); the only copy of data is kept.
    pub async fn free_path(&self, path: &str) -> FsResult<FreeSummary> {
        let mut ids: Vec<BlockId> = Vec::new();
        let mut stack = vec![path.to_string()];
        // Files whose content is in their UFS lose every cached block.
        let mut from_ufs = FreeSummary::default();
        while let Some(p) = stack.pop() {
            let attr = self.namespace.stat(&p, false).await?;
            match attr.kind {
                FileKind::File => {
                    let (_, blocks) = self.namespace.file_blocks_ino(attr.ino).await?;
                    let in_ufs = attr.writing.is_none()
                        && attr
                            .ufs
                            .as_ref()
                            .is_some_and(|u| u.persist == curvine_messages::mount::Persist::Synced);
                    if in_ufs {
                        let ino = attr.ino;
                        let n = self
                            .namespace
                            .call_shard(curvine_messages::shard_of(ino), move |reply| {
                                curvine_messages::shard::ShardMsg::UfsEvict { ino, reply }
                            })
                            .await?;
                        from_ufs.freed += n as u64;
                        from_ufs.freed_bytes += blocks.iter().map(|b| b.stored).sum::<u64>();
                        continue;
                    }
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
                _ => {}
            }
        }
        let mut summary = self
            .manager
            .call(move |reply| BlockMsg::Free {
                ids: ids.clone(),
                reply,
            })
            .await?;
        summary.freed += from_ufs.freed;
        summary.freed_bytes += from_ufs.freed_bytes;
        Ok(summary)
    }

    /// Blocks of this node a mount on its host read through passthrough
    /// (the kernel reads them without asking anyone): recently used for
    /// the evictors, and counted out as the data port counts what it
    /// sends (an id once per open, at the block's length); others are
    /// ignored.
    pub fn touch_blocks(&self, ids: &[curvine_messages::block::BlockId]) {
        let mut bytes = 0;
        for &id in ids {
            if let Ok(Some(record)) = self.blocks.get(id) {
                self.blocks.touch(id);
                bytes += record.len;
            }
        }
        self.metrics.add(
            "curvine_data_bytes_local_total",
            LOCAL_BYTES_HELP,
            &[],
            bytes,
        );
    }

    /// Where each block of a file is.
    pub async fn file_blocks(&self, path: &str) -> FsResult<FileBlocks> {
        let (attr, blocks) = self.namespace.file_blocks(path).await?;
        let mut out = Vec::with_capacity(blocks.len());
        for info in blocks {
            let replicas = info
                .locs
                .iter()
                .map(|node| {
                    let here = (node == &self.node_id)
                        .then(|| self.blocks.locate(info.id).ok())
                        .flatten();
                    BlockReplica {
                        node_id: node.clone(),
                        tier: here.as_ref().map(|(r, _)| r.kind),
                        offset: here.as_ref().map_or(0, |(r, _)| r.offset()),
                        path: here.map(|(_, p)| p.display().to_string()),
                    }
                })
                .collect();
            out.push(BlockDetail { info, replicas });
        }
        Ok(FileBlocks { attr, blocks: out })
    }
}

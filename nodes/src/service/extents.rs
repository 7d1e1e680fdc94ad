//! Files laid out in one extent file on this node, so that a mount on its
//! host can pass the whole file through to it: the blocks of the file this
//! node holds are copied (and verified) into the extent, and, when asked,
//! the blocks only other nodes hold are copied from their data ports into
//! it too and recorded as one more replica (see `curvine_actors::blocks`
//! for the extent files themselves). One file at a time, so the copies
//! never crowd out the readers they are for.

use std::sync::Arc;

use curvine_actors::blocks::{fill_extent, BlockManagerRef, BlockStore};
use curvine_actors::cluster::ClusterView;
use curvine_actors::namespace::Namespace;
use curvine_actors::token::TokenKey;
use curvine_messages::block::{block_crc, Access, BlockId, BlockMsg};
use curvine_messages::cluster::MemberState;
use curvine_messages::rpc::FileBlocks;
use curvine_messages::{FsError, FsResult};
use curvine_wire::data::{copy_block_into, io_err, BlockSource, DataPool};

use super::files::Files;
use super::replicas::Replicas;

/// What [`Extents`] works with.
pub struct ExtentsArgs {
    pub files: Arc<Files>,
    pub replicas: Arc<Replicas>,
    pub namespace: Arc<Namespace>,
    pub view: Arc<ClusterView>,
    pub blocks: Arc<BlockStore>,
    pub manager: BlockManagerRef,
    pub tokens: TokenKey,
    pub pool: DataPool,
}

pub struct Extents {
    a: ExtentsArgs,
    /// One file laid out at a time.
    one_at_a_time: tokio::sync::Semaphore,
}

/// A block of the file that only other nodes hold, and where it goes.
struct Fetch {
    id: BlockId,
    index: u32,
    offset: u64,
    len: u64,
    crc: u32,
    from: Vec<String>,
}

impl Extents {
    pub fn new(args: ExtentsArgs) -> Extents {
        Extents {
            a: args,
            one_at_a_time: tokio::sync::Semaphore::new(1),
        }
    }

    /// Lays the blocks of the file at `path` out in one extent file on
    /// this node, each at its offset in the file; with `copy`, blocks only
    /// other nodes hold are copied here first, else every block must be
    /// here. Answers as `Files::file_blocks`, after. A file already in one
    /// file here is left as it is.
    pub async fn assemble(&self, path: &str, copy: bool) -> FsResult<FileBlocks> {
        let _turn = self
            .one_at_a_time
            .acquire()
            .await
            .map_err(|_| FsError::Unavailable("the node is stopping".into()))?;
        let blocks = self.a.files.file_blocks(path).await?;
        if blocks.backing_file().is_some() {
            return Ok(blocks);
        }
        if blocks.attr.writing.is_some() {
            return Err(FsError::Busy(format!("{path} is open for writing")));
        }
        let Some(layout) = blocks.layout() else {
            return Err(FsError::InvalidArgument(format!(
                "the blocks of {path} do not cover it end to end (an empty file, a hole or a cut block)"
            )));
        };
        let me = &self.a.view.node_id;
        let mut here = Vec::new();
        let mut fetch = Vec::new();
        for (b, offset) in blocks.blocks.iter().zip(layout) {
            if b.replicas.iter().any(|r| r.path.is_some()) {
                here.push((b.info.id, offset));
            } else {
                fetch.push(Fetch {
                    id: b.info.id,
                    index: b.info.index,
                    offset,
                    len: b.info.stored,
                    crc: b.info.crc,
                    from: b.info.locs.iter().filter(|n| *n != me).cloned().collect(),
                });
            }
        }
        if !fetch.is_empty() && !copy {
            return Err(FsError::NotFound(format!(
                "not every block of {path} is on this node"
            )));
        }
        let planned: Vec<(BlockId, u64, u64)> =
            fetch.iter().map(|f| (f.id, f.offset, f.len)).collect();
        let plan = self
            .a
            .manager
            .call(move |reply| BlockMsg::PrepareAssemble {
                blocks: here.clone(),
                fetch: planned.clone(),
                reply,
            })
            .await?;
        let sync = self.a.blocks.syncs(plan.tier as usize);
        let extent = plan.extent;
        let tmp = plan.tmp.clone();
        let filled = async {
            let local_sync = sync && fetch.is_empty();
            tokio::task::spawn_blocking(move || fill_extent(&plan, local_sync))
                .await
                .unwrap_or_else(|e| Err(FsError::Io(format!("filling an extent file: {e}"))))?;
            let mut fetched = Vec::with_capacity(fetch.len());
            if !fetch.is_empty() {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&tmp)
                    .map_err(|e| io_err(&tmp, e))?;
                for f in &fetch {
                    fetched.push((f.id, self.fetch(f, &file, &tmp).await?));
                }
                if sync {
                    file.sync_data().map_err(|e| io_err(&tmp, e))?;
                }
            }
            Ok::<_, FsError>(fetched)
        }
        .await;
        let (ok, fetched) = match &filled {
            Ok(f) => (true, f.clone()),
            Err(_) => (false, Vec::new()),
        };
        self.a
            .manager
            .call(move |reply| BlockMsg::FinishAssemble {
                extent,
                ok,
                fetched: fetched.clone(),
                reply,
            })
            .await?;
        filled?;
        if !fetch.is_empty() {
            self.add_replicas(path, &fetch, extent).await;
        }
        self.a.files.file_blocks(path).await
    }

    /// Copies one block from a node holding it into `file` at its offset,
    /// verifying every unit on the way and the whole against the block's
    /// checksum; returns the checksums of its units.
    async fn fetch(&self, f: &Fetch, file: &std::fs::File, name: &str) -> FsResult<Vec<u32>> {
        let mut last = FsError::NodeDown(format!(
            "block {:#x}: no node holding it is up ({})",
            f.id,
            f.from.join(", ")
        ));
        for node in &f.from {
            let Some(m) = self
                .a
                .view
                .member(node)
                .filter(|m| m.state == MemberState::Up)
            else {
                continue;
            };
            let src = BlockSource {
                node: m.info.data_node(),
                token: self.a.tokens.issue(f.id, Access::Read),
                len: f.len,
                fill: None,
            };
            match self.fetch_from(f, &src, file, name).await {
                Ok(crcs) => return Ok(crcs),
                Err(e) => {
                    tracing::info!(block = format!("{:#x}", f.id), node = %node, error = %e, "copying a block here failed; trying another copy");
                    last = e;
                }
            }
        }
        Err(last)
    }

    async fn fetch_from(
        &self,
        f: &Fetch,
        src: &BlockSource,
        file: &std::fs::File,
        name: &str,
    ) -> FsResult<Vec<u32>> {
        let what = format!(
            "copy of block {:#x} from node {} into {name}",
            f.id, src.node.node_id
        );
        let crcs = copy_block_into(&self.a.pool, src, file, f.offset, &what).await?;
        if block_crc(&crcs) != f.crc {
            return Err(FsError::Corrupt(format!(
                "block {:#x} copied from node {} does not match its checksum",
                f.id, src.node.node_id
            )));
        }
        Ok(crcs)
    }

    /// Records this node as one more holder of the blocks copied here; a
    /// block whose file changed meanwhile is removed again.
    async fn add_replicas(&self, path: &str, fetch: &[Fetch], extent: u64) {
        let me = self.a.view.node_id.clone();
        let mut drop = Vec::new();
        let now = self.a.namespace.file_blocks(path).await.ok();
        for f in fetch {
            let recorded = self
                .a
                .blocks
                .locate(f.id)
                .is_ok_and(|(r, _)| r.extent.is_some_and(|e| e.id == extent));
            if !recorded {
                continue; // a copy arrived meanwhile: it is already a replica
            }
            let current = now.as_ref().and_then(|(attr, blocks)| {
                blocks
                    .iter()
                    .find(|b| b.id == f.id && b.index == f.index)
                    .map(|b| (attr.ino, b.locs.clone()))
            });
            let added = match current {
                Some((_, locs)) if locs.contains(&me) => true,
                Some((ino, mut locs)) => {
                    locs.push(me.clone());
                    self.a
                        .namespace
                        .set_locs(ino, f.index, f.id, locs)
                        .await
                        .unwrap_or(false)
                }
                None => false,
            };
            if !added {
                drop.push(f.id);
            }
        }
        if !drop.is_empty() {
            tracing::debug!(
                blocks = drop.len(),
                "blocks copied here for a file that changed meanwhile: removed"
            );
            self.a.replicas.remove_blocks_at(&me, drop).await;
        }
    }
}

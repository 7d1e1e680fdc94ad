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
//!
//! The code is split by concern: `calls` (calling shards, local or
//! remote, with retries), `resolve` (path resolution), `paths` (directory,
//! link, attribute and removal operations on paths), `rename`, `files`
//! (file data: writers, blocks, UFS state), `intents` (the intent driver)
//! and `fsck` (inspection and the namespace's consistency rules).

mod calls;
mod delegations;
mod files;
mod fsck;
mod intents;
mod paths;
mod rename;
mod resolve;

pub use fsck::check_scans;

use std::sync::{Arc, Weak};
use std::time::Duration;

use curvine_messages::block::{BlockId, BlockInfo};
use curvine_messages::Attr;

use crate::cluster::ClusterView;
use crate::host::ShardDirectory;

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
}

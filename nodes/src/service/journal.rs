//! The UFS journal of fs_mode mounts: changes recorded on shard 0 to be
//! replayed on the UFS in order (uploads of closed files, deletes, renames).

use std::sync::Arc;

use curvine_actors::cluster::ClusterView;
use curvine_actors::namespace::Namespace;
use curvine_messages::mount::{JournalEntry, UfsOp};
use curvine_messages::shard::ShardMsg;
use curvine_messages::FsResult;

/// Journal entries applied per pass.
const JOURNAL_BATCH: u32 = 512;

pub struct Journal {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
}

impl Journal {
    pub fn new(namespace: Arc<Namespace>, view: Arc<ClusterView>) -> Journal {
        Journal { namespace, view }
    }

    /// Records changes to replay on an fs_mode mount's UFS.
    pub async fn append(&self, mount: u32, ops: Vec<UfsOp>) {
        let appended = self
            .namespace
            .call_shard(0, move |reply| ShardMsg::JournalAppend {
                mount,
                ops: ops.clone(),
                reply,
            })
            .await;
        if let Err(e) = appended {
            // Written files are still found by the sweep; a lost delete or
            // rename leaves the old object in the UFS.
            tracing::warn!(mount, error = %e, "recording a change to replay on the UFS failed");
        }
    }

    /// Whether this node serves shard 0 now (the journal and load jobs live
    /// there; of a replicated shard 0, its leader).
    pub fn served_here(&self) -> bool {
        self.view.serves_now(0)
    }

    /// The oldest entries not trimmed yet.
    pub async fn read(&self) -> FsResult<Vec<JournalEntry>> {
        self.namespace
            .call_shard(0, |reply| ShardMsg::JournalRead {
                limit: JOURNAL_BATCH,
                reply,
            })
            .await
    }

    /// Drops the entries up to `upto` (applied).
    pub async fn trim(&self, upto: u64) -> FsResult<()> {
        self.namespace
            .call_shard(0, move |reply| ShardMsg::JournalTrim { upto, reply })
            .await
    }
}

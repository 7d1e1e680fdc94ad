//! Directory delegations (see `curvine_messages::delegation`): each call
//! goes to the shard that holds the directory.

use curvine_messages::delegation::{DirGrant, DirOp, DirOpDone, Renewal};
use curvine_messages::shard::ShardMsg;
use curvine_messages::{shard_of, FsResult, Ino};

use super::Namespace;

impl Namespace {
    /// Delegates directory `dir` to mount `holder` with `inos` inode
    /// numbers set aside for its creates.
    pub async fn delegate(&self, dir: Ino, holder: u64, inos: u32) -> FsResult<DirGrant> {
        self.call(shard_of(dir), move |reply| ShardMsg::Delegate {
            dir,
            holder,
            inos,
            reply,
        })
        .await
    }

    pub async fn renew_delegation(&self, dir: Ino, holder: u64) -> FsResult<Renewal> {
        self.call(shard_of(dir), move |reply| ShardMsg::RenewDelegation {
            dir,
            holder,
            reply,
        })
        .await
    }

    /// `true` once the shard wants `dir` back, `false` at the holder's
    /// next renewal.
    pub async fn await_recall(&self, dir: Ino, holder: u64) -> FsResult<bool> {
        self.call(shard_of(dir), move |reply| ShardMsg::AwaitRecall {
            dir,
            holder,
            reply,
        })
        .await
    }

    /// The holder's changes in `dir`, in order, one result each.
    pub async fn dir_ops(
        &self,
        dir: Ino,
        holder: u64,
        ops: Vec<DirOp>,
    ) -> FsResult<Vec<FsResult<DirOpDone>>> {
        self.call(shard_of(dir), move |reply| ShardMsg::DirOps {
            dir,
            holder,
            ops: ops.clone(),
            reply,
        })
        .await
    }

    pub async fn release_delegation(&self, dir: Ino, holder: u64) -> FsResult<()> {
        self.call(shard_of(dir), move |reply| ShardMsg::ReleaseDelegation {
            dir,
            holder,
            reply,
        })
        .await
    }
}

//! Directory delegations for mounts (see `curvine_messages::delegation`):
//! the grant with the layout new files in the directory get, and the
//! holder's batched creates answered like `OpenFile`.

use curvine_messages::delegation::{DirGrant, DirOpDone};
use curvine_messages::mount::WriteType;
use curvine_messages::rpc::{Delegate, DirOpReply, DirOps, WriteOpen};
use curvine_messages::{FileKind, FsError, FsResult};

use super::Service;

impl Service {
    /// Delegates the directory at `r.path`. Not under a cache_mode mount,
    /// whose creates look at the UFS first.
    pub(super) async fn delegate(&self, r: Delegate) -> FsResult<DirGrant> {
        let norm = curvine_messages::path::normalize(&r.path, "/")?;
        let mut spec = r.spec.clone();
        if let Some((m, _)) = self.mounts.find(&norm) {
            if m.write_type == WriteType::CacheMode {
                return Err(FsError::NotSupported(format!(
                    "{} is under a cache_mode mount, whose creates go to the UFS first",
                    r.path
                )));
            }
            if spec.block_size == 0 {
                spec.block_size = m.block_size.unwrap_or(0);
            }
            if spec.replicas == 0 {
                spec.replicas = m.replicas.unwrap_or(0);
            }
            if spec.storage.is_none() {
                spec.storage = m.storage;
            }
        }
        let plain = self.mounts.find(&norm).is_none();
        let spec = self.namespace.resolve_spec(&spec)?;
        let dir = self.namespace.stat(&norm, true).await?;
        if dir.kind != FileKind::Dir {
            return Err(FsError::NotADirectory(r.path.clone()));
        }
        let mut grant = self.namespace.delegate(dir.ino, r.holder, r.inos).await?;
        grant.spec = spec;
        grant.plain = plain;
        Ok(grant)
    }

    /// The holder's changes in its directory; each file it created comes
    /// back open for writing, with a grant for its first block.
    pub(super) async fn dir_ops(&self, r: DirOps) -> FsResult<Vec<FsResult<DirOpReply>>> {
        let done = self.namespace.dir_ops(r.dir, r.holder, r.ops).await?;
        Ok(done
            .into_iter()
            .map(|d| {
                d.map(|done| match done {
                    DirOpDone::Created { attr, block } => {
                        let handle = attr.writing.as_ref().map(|l| l.handle).unwrap_or(0);
                        DirOpReply::Created(Box::new(WriteOpen {
                            first: block.map(|b| self.placement.grant(b, 0, attr.block_size)),
                            attr: *attr,
                            handle,
                            blocks: Vec::new(),
                        }))
                    }
                    DirOpDone::Renamed => DirOpReply::Renamed,
                })
            })
            .collect())
    }
}

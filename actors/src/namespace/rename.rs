//! POSIX rename of paths: within one shard in one message, across shards
//! through an intent, and moves of directories between directories under
//! the cluster's rename lock; RENAME_EXCHANGE through an intent.

use std::time::{Duration, Instant};

use rand::Rng;

use curvine_messages::path::{check_name, components};
use curvine_messages::shard::{IntentOp, RenameOutcome, ShardMsg};
use curvine_messages::{shard_of, FileKind, FsError, FsResult, Ino, SetAttr, ROOT_INO};

use super::Namespace;

impl Namespace {
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
            self.unlock_renames(holder).await;
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

    /// RENAME_EXCHANGE: swaps what paths `a` and `b` name, atomically for
    /// every client (both must exist; two names of one inode swap nothing).
    /// Directories that move between directories do so under the
    /// cluster's rename lock, checked like a rename's for cycles.
    pub async fn exchange(&self, a: &str, b: &str) -> FsResult<()> {
        let (a_parent, a_name) = self.resolve_parent(a).await?;
        let a_entry = self.lookup(a_parent.ino, &a_name).await?;
        let (b_parent, b_name) = self.resolve_parent(b).await?;
        let b_entry = self.lookup(b_parent.ino, &b_name).await?;
        if a_entry.ino == b_entry.ino {
            return Ok(());
        }
        let dir_moves = a_parent.ino != b_parent.ino
            && (a_entry.kind == FileKind::Dir || b_entry.kind == FileKind::Dir);
        let exchange = || async {
            if dir_moves {
                if a_entry.kind == FileKind::Dir {
                    self.check_not_inside(a_entry.ino, b_parent.ino).await?;
                }
                if b_entry.kind == FileKind::Dir {
                    self.check_not_inside(b_entry.ino, a_parent.ino).await?;
                }
            }
            let deadline = Instant::now() + self.timeout;
            loop {
                let action = IntentOp::Exchange {
                    a_parent: a_parent.ino,
                    a_name: a_name.clone(),
                    b_parent: b_parent.ino,
                    b_name: b_name.clone(),
                    ino: 0,
                    kind: FileKind::File,
                };
                match self.begin_and_drive(shard_of(a_parent.ino), action).await {
                    Err(FsError::Busy(_)) if Instant::now() < deadline => {
                        let pause = rand::thread_rng().gen_range(1..20);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    other => return other.map(|_| ()),
                }
            }
        };
        if dir_moves {
            let _guard = self.rename_lock.lock().await;
            let holder = self.lock_renames().await?;
            let result = exchange().await;
            self.unlock_renames(holder).await;
            result?;
        } else {
            exchange().await?;
        }
        // Both inodes changed names: their ctimes move, where they live.
        for ino in [a_entry.ino, b_entry.ino] {
            if let Err(e) = self.setattr_ino(ino, SetAttr::default()).await {
                tracing::debug!(ino, error = %e, "ctime of an exchanged inode not updated");
            }
        }
        Ok(())
    }

    /// Releases the cluster's rename lock taken by `holder`.
    async fn unlock_renames(&self, holder: String) {
        let _ = self
            .call(0, move |reply| ShardMsg::UnlockRenames {
                holder: holder.clone(),
                reply,
            })
            .await;
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

    /// Renames `src_name` in `src_parent` to `dst_name` in `dst_parent`.
    /// A rename across shards that stepped back because another operation
    /// held its target name (which may have waited for this one's source)
    /// is made again after a short random pause, up to the request timeout.
    pub(super) async fn rename_at(
        &self,
        src_parent: Ino,
        src_name: &str,
        dst_parent: Ino,
        dst_name: &str,
    ) -> FsResult<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self
                .rename_once(src_parent, src_name, dst_parent, dst_name)
                .await
            {
                Err(FsError::Busy(_)) if Instant::now() < deadline => {
                    let pause = rand::thread_rng().gen_range(1..20);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                other => return other,
            }
        }
    }

    async fn rename_once(
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
}

//! Requests on paths, for paths under mounts too: under a cache_mode mount
//! a name the UFS has is brought into the namespace on first use, and
//! changes go to the UFS first; under an fs_mode mount changes are made
//! here and recorded in the UFS journal for replay.

use std::sync::Arc;

use curvine_actors::mounts::Mounts;
use curvine_actors::namespace::Namespace;
use curvine_actors::token::TokenKey;
use curvine_messages::block::{Access, BlockInfo};
use curvine_messages::mount::{MountInfo, Persist, UfsOp, UfsState, WriteType};
use curvine_messages::{names, now_ns, Attr, FileKind, FsError, FsResult, Ino};

use super::fills::{synced_state, Fills};
use super::journal::Journal;
use super::placement::Placement;

pub struct Paths {
    namespace: Arc<Namespace>,
    mounts: Arc<Mounts>,
    fills: Arc<Fills>,
    journal: Arc<Journal>,
    placement: Arc<Placement>,
    tokens: TokenKey,
}

impl Paths {
    pub fn new(
        namespace: Arc<Namespace>,
        mounts: Arc<Mounts>,
        fills: Arc<Fills>,
        journal: Arc<Journal>,
        placement: Arc<Placement>,
        tokens: TokenKey,
    ) -> Paths {
        Paths {
            namespace,
            mounts,
            fills,
            journal,
            placement,
            tokens,
        }
    }

    /// The cache_mode mount `path` is under, with the path below it.
    fn cache_mount(&self, path: &str) -> Option<(MountInfo, String)> {
        let path = curvine_messages::path::normalize(path, "/").ok()?;
        self.mounts
            .find(&path)
            .filter(|(m, _)| m.write_type == WriteType::CacheMode)
    }

    /// Runs `op`; when it finds nothing on a path under a cache_mode mount,
    /// brings the UFS objects on the path into the namespace and runs it
    /// again (so a name the UFS has is never missing, nor created anew).
    pub async fn through_ufs<T, F, Fut>(&self, path: &str, op: F) -> FsResult<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = FsResult<T>>,
    {
        match op().await {
            Err(FsError::NotFound(detail)) if self.cache_mount(path).is_some() => {
                match self.mounts.materialize(&self.namespace, path, false).await {
                    Ok(_) | Err(FsError::NotFound(_)) => op().await,
                    Err(e) => Err(e),
                }
                .map_err(|e| match e {
                    FsError::NotFound(d) if d.is_empty() => FsError::NotFound(detail),
                    other => other,
                })
            }
            other => other,
        }
    }

    /// Before a name is created under a cache_mode mount: brings an object
    /// the UFS already has at `path` (and the directories above it) into
    /// the namespace.
    async fn ufs_before_create(&self, path: &str) -> FsResult<()> {
        if self.cache_mount(path).is_none() {
            return Ok(());
        }
        match self.mounts.materialize(&self.namespace, path, true).await {
            Ok(_) | Err(FsError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Refuses changes to mount points themselves and to their ancestors.
    fn check_not_mount_point(&self, path: &str, what: &str) -> FsResult<()> {
        let path = curvine_messages::path::normalize(path, "/")?;
        let table = self.mounts.table();
        if let Some(m) = table.mounts.iter().find(|m| m.path == path) {
            return Err(FsError::Busy(format!(
                "{path} is the mount point of {}; umount it before {what}",
                m.ufs
            )));
        }
        if let Some(m) = table.has_mount_below(&path) {
            return Err(FsError::Busy(format!(
                "{path} holds the mount point {} ({}); umount it before {what}",
                m.path, m.ufs
            )));
        }
        Ok(())
    }

    async fn set_ufs(&self, ino: Ino, state: Option<UfsState>) -> FsResult<Attr> {
        self.namespace.set_ufs(ino, state).await
    }

    pub async fn stat(&self, path: &str) -> FsResult<Attr> {
        self.through_ufs(path, || self.namespace.stat(path, false))
            .await
    }

    pub async fn list(
        &self,
        path: &str,
        after: Option<String>,
        limit: u32,
    ) -> FsResult<curvine_messages::rpc::Listing> {
        if let Some((m, rel)) = self.cache_mount(path) {
            let attr = self
                .through_ufs(path, || self.namespace.stat(path, true))
                .await?;
            if attr.kind == FileKind::Dir && after.is_none() && self.mounts.needs_listing(&m, &attr)
            {
                let norm = curvine_messages::path::normalize(path, "/")?;
                self.mounts
                    .sync_dir(&self.namespace, &m, &rel, &attr, &norm)
                    .await?;
            }
        }
        self.through_ufs(path, || self.namespace.list(path, after.clone(), limit))
            .await
    }

    pub async fn mkdir(&self, r: &curvine_messages::rpc::Mkdir) -> FsResult<Attr> {
        self.utf8_under_mount(&r.path)?;
        let Some((m, rel)) = self.cache_mount(&r.path) else {
            return self
                .namespace
                .mkdir(&r.path, r.parents, r.mode, r.uid, r.gid)
                .await;
        };
        self.ufs_before_create(&r.path).await?;
        if let Ok(existing) = self.namespace.stat(&r.path, true).await {
            if r.parents && existing.kind == FileKind::Dir {
                return Ok(existing);
            }
            return Err(FsError::AlreadyExists(String::new()));
        }
        self.mounts.client(&m)?.mkdir(&rel).await?;
        let attr = self
            .namespace
            .mkdir(&r.path, r.parents, r.mode, r.uid, r.gid)
            .await?;
        self.set_ufs(
            attr.ino,
            Some(UfsState::synced(m.id, 0, now_ns(), String::new(), 0)),
        )
        .await
    }

    pub async fn touch(&self, r: &curvine_messages::rpc::Touch) -> FsResult<Attr> {
        self.utf8_under_mount(&r.path)?;
        let Some((m, rel)) = self.cache_mount(&r.path) else {
            return self
                .namespace
                .touch(&r.path, r.mode, r.exclusive, r.uid, r.gid)
                .await;
        };
        self.ufs_before_create(&r.path).await?;
        if self.namespace.stat(&r.path, true).await.is_ok() {
            return self
                .namespace
                .touch(&r.path, r.mode, r.exclusive, r.uid, r.gid)
                .await;
        }
        let obj = self.mounts.client(&m)?.write_all(&rel, Vec::new()).await?;
        let attr = self
            .namespace
            .touch(&r.path, r.mode, r.exclusive, r.uid, r.gid)
            .await?;
        self.set_ufs(attr.ino, Some(synced_state(&m, &obj))).await
    }

    /// EILSEQ for a name with bytes that are not UTF-8 under a mount: its
    /// UFS names objects by UTF-8 keys.
    fn utf8_under_mount(&self, path: &str) -> FsResult<()> {
        if !names::has_escapes(path) {
            return Ok(());
        }
        match self
            .mounts
            .find(&curvine_messages::path::normalize(path, "/")?)
        {
            Some((m, rel)) if names::has_escapes(&rel) => {
                names::utf8_only(path, &format!("mount {} ({})", m.path, m.ufs))
            }
            _ => Ok(()),
        }
    }

    /// ENOTSUP for `what` at `path` when `path` is under a mount: the
    /// UFS cannot hold symlinks, hard links, FIFOs, sockets or devices.
    fn refuse_under_mount(&self, path: &str, what: &str) -> FsResult<()> {
        match self
            .mounts
            .find(&curvine_messages::path::normalize(path, "/")?)
        {
            Some((m, _)) => Err(FsError::NotSupported(format!(
                "{what} under mount {} ({}): the UFS cannot hold them",
                m.path, m.ufs
            ))),
            None => Ok(()),
        }
    }

    pub async fn symlink(&self, target: &str, link: &str, uid: u32, gid: u32) -> FsResult<Attr> {
        self.refuse_under_mount(link, "symbolic links")?;
        self.namespace.symlink(target, link, uid, gid).await
    }

    /// Makes a hard link; not under a mount.
    pub async fn link(&self, target: &str, link: &str) -> FsResult<Attr> {
        self.refuse_under_mount(target, "hard links")?;
        self.refuse_under_mount(link, "hard links")?;
        self.namespace.link(target, link).await
    }

    /// Swaps what two paths name; not under a mount (a UFS cannot swap
    /// two objects at once).
    pub async fn exchange(&self, a: &str, b: &str) -> FsResult<()> {
        self.refuse_under_mount(a, "exchanges of names")?;
        self.refuse_under_mount(b, "exchanges of names")?;
        self.namespace.exchange(a, b).await
    }

    /// Makes a FIFO, socket or device node; not under a mount.
    pub async fn mknod(&self, r: &curvine_messages::rpc::Mknod) -> FsResult<Attr> {
        self.refuse_under_mount(&r.path, "FIFOs, sockets and device nodes")?;
        self.namespace
            .mknod(&r.path, r.kind, r.mode, r.uid, r.gid)
            .await
    }

    pub async fn rename(&self, src: &str, dst: &str) -> FsResult<()> {
        self.utf8_under_mount(dst)?;
        let (src_n, dst_n) = (
            curvine_messages::path::normalize(src, "/")?,
            curvine_messages::path::normalize(dst, "/")?,
        );
        self.check_not_mount_point(&src_n, "renaming it")?;
        let (sm, dm) = (self.mounts.find(&src_n), self.mounts.find(&dst_n));
        match (&sm, &dm) {
            (None, None) => return self.namespace.rename(src, dst).await,
            (Some((a, _)), Some((b, _))) if a.id == b.id => {}
            _ => {
                return Err(FsError::CrossDevice(format!(
                    "{src} and {dst} are not in the same mount; copy, then remove"
                )))
            }
        }
        let (m, src_rel) = sm.expect("checked above");
        let dst_rel = dm.expect("checked above").1;
        if m.write_type != WriteType::CacheMode {
            let attr = self.namespace.stat(&src_n, false).await?;
            self.namespace.rename(src, dst).await?;
            self.journal
                .append(
                    m.id,
                    vec![UfsOp::Rename {
                        from: src_n,
                        to: dst_n,
                        dir: attr.kind == FileKind::Dir,
                    }],
                )
                .await;
            return Ok(());
        }
        let attr = self
            .through_ufs(src, || self.namespace.stat(src, false))
            .await?;
        self.ufs_before_create(dst).await?;
        if let Ok(existing) = self.namespace.stat(&dst_n, false).await {
            if existing.kind == FileKind::Dir && attr.kind != FileKind::Dir {
                return Err(FsError::IsADirectory(dst.to_string()));
            }
        }
        let ufs = self.mounts.client(&m)?;
        if attr.kind == FileKind::Dir {
            // Everything below must be in the UFS: list it whole first.
            ufs.rename(&src_rel, &dst_rel, true).await?;
        } else if attr.ufs.is_some() {
            ufs.rename(&src_rel, &dst_rel, false).await?;
        }
        self.namespace.rename(src, dst).await
    }

    pub async fn remove(
        &self,
        path: &str,
        recursive: bool,
        dir: bool,
    ) -> FsResult<curvine_messages::rpc::RemoveSummary> {
        self.check_not_mount_point(path, "removing it")?;
        let Some((m, rel)) = self.cache_mount(path) else {
            let norm = curvine_messages::path::normalize(path, "/")?;
            let Some((m, _)) = self.mounts.find(&norm) else {
                return self.namespace.remove(path, recursive, dir).await;
            };
            // fs_mode: the cluster first, the UFS in the background.
            let attr = self.namespace.stat(&norm, false).await?;
            let summary = self.namespace.remove(path, recursive, dir).await?;
            self.journal
                .append(
                    m.id,
                    vec![UfsOp::Delete {
                        path: norm,
                        dir: attr.kind == FileKind::Dir,
                    }],
                )
                .await;
            return Ok(summary);
        };
        let attr = self
            .through_ufs(path, || self.namespace.stat(path, false))
            .await?;
        let ufs = self.mounts.client(&m)?;
        if attr.kind == FileKind::Dir {
            if !recursive {
                // Empty here must mean empty there too.
                let page = ufs.list_page(&rel, None, 2).await?;
                if !page.entries.is_empty() {
                    return Err(FsError::NotEmpty(format!(
                        "{path}: the UFS has {} below it",
                        ufs.uri().join(&rel)
                    )));
                }
                if !dir {
                    return Err(FsError::IsADirectory(String::new()));
                }
            }
            ufs.delete_dir(&rel).await?;
        } else {
            if dir {
                return Err(FsError::NotADirectory(String::new()));
            }
            ufs.delete(&rel).await?;
        }
        match self.namespace.remove(path, recursive, dir).await {
            Err(FsError::NotFound(_)) => {
                Ok(curvine_messages::rpc::RemoveSummary { files: 0, dirs: 0 })
            }
            other => other,
        }
    }

    pub async fn setattr(
        &self,
        path: &str,
        set: curvine_messages::SetAttr,
        follow: bool,
    ) -> FsResult<Attr> {
        if set.size.is_some() && self.cache_mount(path).is_some() {
            return Err(FsError::NotSupported(format!(
                "{path}: changing the size of a cache_mode file in place; open it for writing with truncation instead"
            )));
        }
        self.through_ufs(path, || self.namespace.setattr(path, set.clone(), follow))
            .await
    }

    /// Opens a file for writing. Under a cache_mode mount an object the UFS
    /// has is brought in first, and its content cached whole when the
    /// writer keeps it (an append, an overwrite without truncation).
    pub async fn open_write(
        &self,
        r: &curvine_messages::rpc::OpenFile,
    ) -> FsResult<curvine_actors::namespace::Opened> {
        self.utf8_under_mount(&r.path)?;
        let norm = curvine_messages::path::normalize(&r.path, "/")?;
        let Some((m, _)) = self.mounts.find(&norm) else {
            return self.namespace.open_write(r).await;
        };
        // New files under a mount take the mount's layout unless asked otherwise.
        let mut r = r.clone();
        if r.spec.block_size == 0 {
            r.spec.block_size = m.block_size.unwrap_or(0);
        }
        if r.spec.replicas == 0 {
            r.spec.replicas = m.replicas.unwrap_or(0);
        }
        if r.spec.storage.is_none() {
            r.spec.storage = m.storage;
        }
        let r = &r;
        if m.write_type == WriteType::CacheMode {
            self.ufs_before_create(&r.path).await?;
            if !r.truncate {
                if let Ok(attr) = self.namespace.stat(&r.path, true).await {
                    if attr.kind == FileKind::File && attr.ufs.is_some() && attr.size > 0 {
                        self.fills.cache_whole(&r.path, &attr).await?;
                    }
                }
            }
        }
        self.namespace.open_write(r).await
    }

    /// Closes a written file. Under a cache_mode mount its content goes to
    /// the UFS object first (multipart when large) and the file is only
    /// switched to it once the upload completed: a failed upload leaves the
    /// previous content, in the UFS and here.
    pub async fn complete(&self, r: curvine_messages::rpc::CompleteFile) -> FsResult<Attr> {
        let ns = &self.namespace;
        let mount = match curvine_messages::path::normalize(&r.path, "/") {
            Ok(p) if !r.abort && !r.path.is_empty() => self.mounts.find(&p),
            _ => None,
        };
        let Some((m, rel)) = mount else {
            return ns
                .complete_file(r.ino, r.handle, r.size, r.blocks, r.set)
                .await;
        };
        if m.write_type == WriteType::FsMode {
            // Waiting to be persisted, recorded with the close itself: a
            // crash right after still leaves the file to persist.
            let state = UfsState::pending(m.id, now_ns());
            let attr = ns
                .complete_file_ufs(r.ino, r.handle, r.size, r.blocks, Some(state), r.set)
                .await?;
            self.journal
                .append(
                    m.id,
                    vec![UfsOp::Put {
                        path: curvine_messages::path::normalize(&r.path, "/")?,
                        ino: attr.ino,
                    }],
                )
                .await;
            return Ok(attr);
        }
        // The content after the close: the new blocks over the old ones.
        let (current, old) = ns.file_blocks_ino(r.ino).await?;
        let mut merged: std::collections::BTreeMap<u32, BlockInfo> =
            old.into_iter().map(|b| (b.index, b)).collect();
        for b in &r.blocks {
            merged.insert(b.index, b.clone());
        }
        let bs = current.block_size.max(1);
        merged.retain(|i, _| (*i as u64) * bs < r.size);
        let mut shape = current.clone();
        shape.size = r.size;
        let blocks: Vec<BlockInfo> = merged.into_values().collect();
        let ufs = self.mounts.client(&m)?;
        let obj = match self.fills.upload(&ufs, &rel, &shape, &blocks).await {
            Ok(obj) => obj,
            Err(e) => {
                // Give the lease back; the file keeps its old content.
                let _ = ns
                    .complete_file(r.ino, r.handle, current.size, Vec::new(), None)
                    .await;
                return Err(e.with_detail(format!(
                    "writing {} to {} (the file keeps its previous content)",
                    r.path,
                    ufs.uri().join(&rel)
                )));
            }
        };
        ns.complete_file_ufs(
            r.ino,
            r.handle,
            r.size,
            r.blocks,
            Some(synced_state(&m, &obj)),
            r.set,
        )
        .await
    }

    /// Opens a file for reading. A cache_mode file whose check interval
    /// passed is compared with its UFS object first; a UFS file's blocks
    /// that are not cached are read through this node (or the node with room).
    pub async fn open_read(&self, path: &str) -> FsResult<curvine_messages::rpc::ReadOpen> {
        let (mut attr, mut blocks) = self
            .through_ufs(path, || self.namespace.file_blocks(path))
            .await?;
        let mut ufs = None;
        if let Some(state) = attr.ufs.clone() {
            let norm = curvine_messages::path::normalize(path, "/")?;
            if let Some((m, rel)) = self.mounts.find(&norm).filter(|(m, _)| m.id == state.mount) {
                if m.write_type == WriteType::CacheMode {
                    let checked = self
                        .mounts
                        .revalidate(&self.namespace, &m, &rel, &norm, attr.clone())
                        .await?;
                    if checked.ufs.as_ref().map(|u| (&u.etag, u.len, u.mtime_ns))
                        != attr.ufs.as_ref().map(|u| (&u.etag, u.len, u.mtime_ns))
                    {
                        (attr, blocks) = self.namespace.file_blocks_ino(checked.ino).await?;
                    } else {
                        attr = checked;
                    }
                }
                if attr
                    .ufs
                    .as_ref()
                    .is_some_and(|u| u.persist == Persist::Synced)
                {
                    ufs = Some(curvine_messages::rpc::UfsRead {
                        token: self.tokens.issue(attr.ino, Access::Fill),
                        node: self.placement.place(attr.block_size),
                    });
                }
            }
        }
        let blocks = blocks
            .into_iter()
            .map(|info| curvine_messages::block::ReadBlock {
                token: self.tokens.issue(info.id, Access::Read),
                info,
            })
            .collect();
        Ok(curvine_messages::rpc::ReadOpen {
            attr,
            blocks,
            nodes: self.placement.live_nodes(),
            ufs,
            hold: 0,
        })
    }
}

//! Mounts: the mount table as this node knows it, a UFS client per mount,
//! and the namespace work a mount needs (creating and removing mounts,
//! materialising UFS names, checking cached files against their objects).
//!
//! The table lives in shard 0 and changes only by compare-and-set; nodes
//! learn a newer version from heartbeats and fetch it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use curvine_conf::UfsConf;
use curvine_messages::block::FileSpec;
use curvine_messages::mount::{MountInfo, MountTable, Persist, UfsFile, UfsState, WriteType};
use curvine_messages::path::{components, join};
use curvine_messages::shard::ShardMsg;
use curvine_messages::{now_ns, shard_of, Attr, FileKind, FsError, FsResult, Ino, NewInode};

use crate::namespace::Namespace;
use crate::ufs::{Ufs, UfsObject, UfsOptions, UfsUri};

/// A mount to create.
#[derive(Debug, Clone)]
pub struct NewMount {
    pub info: MountInfo,
    /// The mount point's owner, when it is created.
    pub uid: u32,
    pub gid: u32,
}

pub struct Mounts {
    table: RwLock<Arc<MountTable>>,
    clients: Mutex<HashMap<u32, Ufs>>,
    opts: UfsOptions,
    check_interval: Duration,
    list_page: usize,
    refreshing: std::sync::atomic::AtomicBool,
    /// Directories being listed from the UFS in the background.
    syncing: Mutex<HashSet<Ino>>,
    /// Where the UFS clients record calls of traced requests.
    tracer: Option<crate::trace::Tracer>,
}

impl Mounts {
    pub fn new(conf: &UfsConf, tracer: Option<crate::trace::Tracer>) -> Arc<Mounts> {
        Arc::new(Mounts {
            table: RwLock::new(Arc::new(MountTable::default())),
            clients: Mutex::new(HashMap::new()),
            opts: UfsOptions::from(conf),
            check_interval: conf.check_interval.0,
            list_page: conf.list_page as usize,
            refreshing: std::sync::atomic::AtomicBool::new(false),
            syncing: Mutex::new(HashSet::new()),
            tracer,
        })
    }

    pub fn table(&self) -> Arc<MountTable> {
        self.table.read().clone()
    }

    pub fn version(&self) -> u64 {
        self.table.read().version
    }

    pub fn options(&self) -> &UfsOptions {
        &self.opts
    }

    /// Takes `table` when it is newer than the one held; drops the clients
    /// of mounts that are gone.
    pub fn adopt(&self, table: MountTable) -> bool {
        let mut held = self.table.write();
        if table.version <= held.version {
            return false;
        }
        let ids: HashSet<u32> = table.mounts.iter().map(|m| m.id).collect();
        self.clients.lock().retain(|id, _| ids.contains(id));
        *held = Arc::new(table);
        true
    }

    /// The mount `path` (normalized) is under, with the path below it.
    pub fn find(&self, path: &str) -> Option<(MountInfo, String)> {
        let table = self.table();
        table
            .find(path)
            .map(|(m, rel)| (m.clone(), rel.to_string()))
    }

    /// The UFS client of a mount (made once per mount).
    pub fn client(&self, m: &MountInfo) -> FsResult<Ufs> {
        if let Some(c) = self.clients.lock().get(&m.id) {
            return Ok(c.clone());
        }
        let ufs = Ufs::new(&UfsUri::parse(&m.ufs)?, &m.props, &self.opts)?
            .with_tracer(self.tracer.clone());
        self.clients.lock().insert(m.id, ufs.clone());
        Ok(ufs)
    }

    /// How long a cached file of `m` is trusted before its object is checked.
    pub fn check_interval(&self, m: &MountInfo) -> Duration {
        if m.read_verify_ufs {
            return Duration::ZERO;
        }
        m.check_interval_ms
            .map(Duration::from_millis)
            .unwrap_or(self.check_interval)
    }

    /// Claims the one background refresh (`false` while one runs).
    pub fn begin_refresh(&self) -> bool {
        !self
            .refreshing
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    pub fn end_refresh(&self) {
        self.refreshing
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Fetches the table from shard 0 and adopts it when newer.
    pub async fn refresh(&self, ns: &Namespace) -> FsResult<Arc<MountTable>> {
        let table = ns.call(0, |reply| ShardMsg::GetMounts { reply }).await?;
        self.adopt(table);
        Ok(self.table())
    }

    /// Changes the table by compare-and-set, retrying when another change
    /// got there first. `change` sees the current table.
    async fn change<T>(
        &self,
        ns: &Namespace,
        change: impl Fn(&MountTable) -> FsResult<(MountTable, T)>,
    ) -> FsResult<T> {
        for _ in 0..20 {
            let current = self.refresh(ns).await?;
            let (mut next, out) = change(&current)?;
            next.version = current.version + 1;
            let expect = current.version;
            let stored = ns
                .call(0, move |reply| ShardMsg::SetMounts {
                    expect,
                    table: next.clone(),
                    reply,
                })
                .await;
            match stored {
                Ok(table) => {
                    self.adopt(table);
                    return Ok(out);
                }
                Err(FsError::Busy(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(FsError::Busy(
            "the mount table kept changing; try again".into(),
        ))
    }

    /// Creates a mount: checks the UFS answers with the given properties,
    /// makes the mount point (an empty directory), then records the mount.
    pub async fn mount(&self, ns: &Namespace, new: NewMount) -> FsResult<MountInfo> {
        let mut info = new.info;
        info.path = curvine_messages::path::normalize(&info.path, "/")?;
        if info.path == "/" {
            return Err(FsError::InvalidArgument(
                "the root directory cannot be a mount point".into(),
            ));
        }
        let uri = UfsUri::parse(&info.ufs)?;
        info.ufs = uri.to_string();
        let ufs = Ufs::new(&uri, &info.props, &self.opts)?.with_tracer(self.tracer.clone());
        let table = self.refresh(ns).await?;
        check_placement(&table, &info.path)?;
        ufs.check().await.map_err(|e| match e {
            FsError::Ufs(text) => FsError::Ufs(format!("mount refused: {text}")),
            other => other,
        })?;
        // The mount point: an empty directory, made when missing.
        let point = match ns.stat(&info.path, true).await {
            Ok(attr) if attr.kind != FileKind::Dir => {
                return Err(FsError::NotADirectory(info.path.clone()))
            }
            Ok(attr) => {
                if !ns.readdir(attr.ino, None, 1).await?.is_empty() {
                    return Err(FsError::NotEmpty(format!(
                        "{}: a mount point must be an empty directory",
                        info.path
                    )));
                }
                attr
            }
            Err(FsError::NotFound(_)) => {
                ns.mkdir(&info.path, true, 0o755, new.uid, new.gid).await?
            }
            Err(e) => return Err(e),
        };
        info.created_ns = now_ns();
        let info = self
            .change(ns, |current| {
                check_placement(current, &info.path)?;
                let mut next = current.clone();
                let mut m = info.clone();
                m.id = current.next_id.max(1);
                next.next_id = m.id + 1;
                next.mounts.push(m.clone());
                Ok((next, m))
            })
            .await?;
        let state = UfsState::unlisted(info.id);
        ns.set_ufs(point.ino, Some(state)).await?;
        self.clients.lock().insert(info.id, ufs);
        tracing::info!(path = %info.path, ufs = %info.ufs, mode = %info.write_type, id = info.id, "mounted");
        Ok(info)
    }

    /// Removes the mount at `path` and what the namespace cached of it (the
    /// UFS keeps its objects). The mount point stays, empty.
    pub async fn umount(&self, ns: &Namespace, path: &str) -> FsResult<MountInfo> {
        let path = curvine_messages::path::normalize(path, "/")?;
        let removed = self
            .change(ns, |current| {
                let Some(m) = current.mounts.iter().find(|m| m.path == path) else {
                    return Err(FsError::NotFound(format!("no mount at {path}")));
                };
                let mut next = current.clone();
                next.mounts.retain(|x| x.id != m.id);
                Ok((next, m.clone()))
            })
            .await?;
        // Drop the cached tree below the mount point.
        if let Ok(point) = ns.stat(&path, true).await {
            loop {
                let entries = ns.readdir(point.ino, None, 256).await?;
                if entries.is_empty() {
                    break;
                }
                for e in entries {
                    let child = format!("{}/{}", path.trim_end_matches('/'), e.name);
                    match ns.remove(&child, true, false).await {
                        Ok(_) | Err(FsError::NotFound(_)) => {}
                        Err(err) => return Err(err),
                    }
                }
            }
            ns.set_ufs(point.ino, None).await?;
        }
        tracing::info!(path = %removed.path, ufs = %removed.ufs, "unmounted");
        Ok(removed)
    }

    // ---- materialising UFS names (cache_mode) -------------------------------

    /// The attributes of `path` under a cache_mode mount, bringing the UFS
    /// objects on its way into the namespace when they are not there yet.
    /// `NotFound` when neither has it.
    ///
    /// A directory listed whole within the check interval answers a missing
    /// name without asking the UFS, unless `ask_ufs` (before a name is
    /// created, so an object put there since is never shadowed).
    pub async fn materialize(
        self: &Arc<Self>,
        ns: &Arc<Namespace>,
        path: &str,
        ask_ufs: bool,
    ) -> FsResult<Attr> {
        let path = curvine_messages::path::normalize(path, "/")?;
        let Some((m, rel)) = self.find(&path) else {
            return ns.stat(&path, true).await;
        };
        if m.write_type != WriteType::CacheMode {
            return ns.stat(&path, true).await;
        }
        let ufs = self.client(&m)?;
        let mut attr = ns.stat(&m.path, true).await?;
        let mut done = String::new();
        for name in rel.split('/').filter(|c| !c.is_empty()) {
            if attr.kind != FileKind::Dir {
                return Err(FsError::NotADirectory(join(&components(&done, "/")?)));
            }
            let child_rel = if done.is_empty() {
                name.to_string()
            } else {
                format!("{done}/{name}")
            };
            attr = match ns.lookup(attr.ino, name).await {
                Ok(entry) => ns.getattr(entry.ino).await?,
                Err(FsError::NotFound(_)) => {
                    if !ask_ufs && self.listing_fresh(&m, &attr) {
                        return Err(FsError::NotFound(path.clone()));
                    }
                    // The rest of this directory is likely wanted too: list
                    // it in the background, so later names need no request
                    // of their own; this one is looked up now.
                    let dir_path = if done.is_empty() {
                        m.path.clone()
                    } else {
                        format!("{}/{done}", m.path.trim_end_matches('/'))
                    };
                    self.sync_in_background(ns, &m, &done, &attr, &dir_path);
                    match ufs.stat(&child_rel).await? {
                        None => return Err(FsError::NotFound(path.clone())),
                        Some(obj) => self.adopt_object(ns, &m, &attr, obj).await?,
                    }
                }
                Err(e) => return Err(e),
            };
            done = child_rel;
        }
        Ok(attr)
    }

    /// Directory `path` of mount `m` (at or below its mount point), made in
    /// the namespace with its missing parents, as directories of the UFS.
    pub async fn ensure_dir(&self, ns: &Namespace, m: &MountInfo, path: &str) -> FsResult<Attr> {
        let rel = m
            .relative(path)
            .ok_or_else(|| FsError::InvalidArgument(format!("{path} is not under {}", m.path)))?
            .to_string();
        let mut attr = ns.stat(&m.path, true).await?;
        for name in rel.split('/').filter(|c| !c.is_empty()) {
            if attr.kind != FileKind::Dir {
                return Err(FsError::NotADirectory(path.to_string()));
            }
            attr = match ns.lookup(attr.ino, name).await {
                Ok(entry) => ns.getattr(entry.ino).await?,
                Err(FsError::NotFound(_)) => {
                    let obj = UfsObject {
                        name: name.to_string(),
                        is_dir: true,
                        len: 0,
                        mtime_ns: 0,
                        etag: String::new(),
                    };
                    self.adopt_object(ns, m, &attr, obj).await?
                }
                Err(e) => return Err(e),
            };
        }
        Ok(attr)
    }

    /// Records UFS files `objs` in directory `parent` (see `ShardMsg::UfsSync`).
    pub async fn add_files(
        &self,
        ns: &Namespace,
        m: &MountInfo,
        parent: &Attr,
        objs: Vec<UfsObject>,
    ) -> FsResult<Vec<(String, Attr)>> {
        self.sync_files(ns, m, parent, objs).await
    }

    /// Whether directory `dir` was listed whole from the UFS recently
    /// enough that a name missing here is missing there too.
    fn listing_fresh(&self, m: &MountInfo, dir: &Attr) -> bool {
        let Some(u) = &dir.ufs else { return false };
        u.checked_ns > 0
            && u.mount == m.id
            && (now_ns() - u.checked_ns) < self.check_interval(m).as_nanos() as i64
    }

    /// Puts UFS object `obj` into directory `parent` (a file without
    /// cached blocks, or a directory not listed yet); returns it.
    async fn adopt_object(
        &self,
        ns: &Namespace,
        m: &MountInfo,
        parent: &Attr,
        obj: UfsObject,
    ) -> FsResult<Attr> {
        let now = now_ns();
        if obj.is_dir {
            let attrs = NewInode {
                kind: FileKind::Dir,
                mode: 0o755,
                uid: parent.uid,
                gid: parent.gid,
                symlink: None,
                now_ns: now,
            };
            let dir = match ns.mkdir_at(parent.ino, &obj.name, attrs).await {
                Ok(a) => a,
                Err(FsError::AlreadyExists(_)) => {
                    let e = ns.lookup(parent.ino, &obj.name).await?;
                    return ns.getattr(e.ino).await;
                }
                Err(e) => return Err(e),
            };
            let state = UfsState {
                mount: m.id,
                len: 0,
                mtime_ns: obj.mtime_ns,
                etag: String::new(),
                checked_ns: 0,
                persist: Persist::Synced,
            };
            return ns.set_ufs(dir.ino, Some(state)).await;
        }
        let name = obj.name.clone();
        let synced = self.sync_files(ns, m, parent, vec![obj]).await?;
        match synced.into_iter().find(|(n, _)| *n == name) {
            Some((_, attr)) => Ok(attr),
            // A directory or an operation in progress holds the name.
            None => {
                let e = ns.lookup(parent.ino, &name).await?;
                ns.getattr(e.ino).await
            }
        }
    }

    async fn sync_files(
        &self,
        ns: &Namespace,
        m: &MountInfo,
        parent: &Attr,
        objs: Vec<UfsObject>,
    ) -> FsResult<Vec<(String, Attr)>> {
        let files: Vec<UfsFile> = objs
            .into_iter()
            .map(|o| UfsFile {
                name: o.name,
                len: o.len,
                mtime_ns: o.mtime_ns,
                etag: o.etag,
            })
            .collect();
        let owner = NewInode {
            kind: FileKind::File,
            mode: 0o644,
            uid: parent.uid,
            gid: parent.gid,
            symlink: None,
            now_ns: now_ns(),
        };
        let spec = ns.resolve_spec(&FileSpec {
            block_size: m.block_size.unwrap_or(0),
            replicas: m.replicas.unwrap_or(0),
            storage: m.storage,
        })?;
        let (pino, mount) = (parent.ino, m.id);
        ns.call(shard_of(pino), move |reply| ShardMsg::UfsSync {
            parent: pino,
            mount,
            files: files.clone(),
            owner: owner.clone(),
            spec: spec.clone(),
            reply,
        })
        .await
    }

    /// Lists directory `rel` of mount `m` from the UFS page by page and
    /// brings directory `dir` in line: new names are added, changed files
    /// lose their cached blocks, names the UFS no longer has are removed
    /// (files being written here are kept). Holds only the names of the
    /// directory in memory, never the whole listing.
    pub async fn sync_dir(
        &self,
        ns: &Namespace,
        m: &MountInfo,
        rel: &str,
        dir: &Attr,
        dir_path: &str,
    ) -> FsResult<()> {
        let ufs = self.client(m)?;
        let started = now_ns();
        let mut names: HashSet<String> = HashSet::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = ufs
                .list_page(rel, cursor.as_deref(), self.list_page)
                .await?;
            let mut files = Vec::new();
            for obj in page.entries {
                if !names.insert(obj.name.clone()) {
                    continue;
                }
                if curvine_messages::path::check_name(&obj.name).is_err() {
                    tracing::warn!(mount = %m.path, name = %obj.name, "skipping a UFS name the namespace cannot hold");
                    continue;
                }
                if obj.is_dir {
                    match ns.lookup(dir.ino, &obj.name).await {
                        Ok(_) => {}
                        Err(FsError::NotFound(_)) => {
                            self.adopt_object(ns, m, dir, obj).await?;
                        }
                        Err(e) => return Err(e),
                    }
                } else {
                    files.push(obj);
                }
            }
            if !files.is_empty() {
                self.sync_files(ns, m, dir, files).await?;
            }
            cursor = page.next;
            if cursor.is_none() {
                break;
            }
        }
        // Names the UFS no longer has.
        let mut after: Option<String> = None;
        loop {
            let page = ns.list(dir_path, after.clone(), 1024).await?;
            for e in &page.entries {
                if names.contains(&e.name) {
                    continue;
                }
                let from_ufs = matches!(
                    &e.attr.ufs,
                    Some(u) if u.mount == m.id && u.persist == Persist::Synced
                ) && e.attr.writing.is_none();
                if !from_ufs {
                    continue;
                }
                let child = format!("{}/{}", dir_path.trim_end_matches('/'), e.name);
                match ns.remove(&child, true, false).await {
                    Ok(_) | Err(FsError::NotFound(_)) => {}
                    Err(err) => return Err(err),
                }
            }
            if !page.more {
                break;
            }
            after = page.entries.last().map(|e| e.name.clone());
        }
        let mut state = dir.ufs.clone().unwrap_or(UfsState::unlisted(m.id));
        state.checked_ns = started;
        ns.set_ufs(dir.ino, Some(state)).await?;
        Ok(())
    }

    /// Starts listing directory `dir` from the UFS in a task (one at a time
    /// per directory).
    fn sync_in_background(
        self: &Arc<Self>,
        ns: &Arc<Namespace>,
        m: &MountInfo,
        rel: &str,
        dir: &Attr,
        dir_path: &str,
    ) {
        if !self.syncing.lock().insert(dir.ino) {
            return;
        }
        let (this, ns, m, rel, dir, dir_path) = (
            self.clone(),
            ns.clone(),
            m.clone(),
            rel.to_string(),
            dir.clone(),
            dir_path.to_string(),
        );
        tokio::spawn(async move {
            if let Err(e) = this.sync_dir(&ns, &m, &rel, &dir, &dir_path).await {
                tracing::debug!(dir = %dir_path, error = %e, "listing a directory from the UFS");
            }
            this.syncing.lock().remove(&dir.ino);
        });
    }

    /// Whether a directory of a cache_mode mount should be listed from the
    /// UFS before it is read.
    pub fn needs_listing(&self, m: &MountInfo, dir: &Attr) -> bool {
        m.write_type == WriteType::CacheMode && !self.listing_fresh(m, dir)
    }

    /// A cache_mode file checked against its UFS object when the check
    /// interval passed: a changed object replaces the cached content, a
    /// deleted one removes the file (`NotFound`).
    pub async fn revalidate(
        &self,
        ns: &Namespace,
        m: &MountInfo,
        rel: &str,
        path: &str,
        attr: Attr,
    ) -> FsResult<Attr> {
        let Some(state) = attr.ufs.clone() else {
            return Ok(attr);
        };
        if m.write_type != WriteType::CacheMode
            || state.mount != m.id
            || state.persist != Persist::Synced
            || attr.writing.is_some()
            || attr.kind != FileKind::File
        {
            return Ok(attr);
        }
        let interval = self.check_interval(m).as_nanos() as i64;
        if interval > 0 && now_ns() - state.checked_ns < interval {
            return Ok(attr);
        }
        let ufs = self.client(m)?;
        match ufs.stat(rel).await? {
            Some(obj) if !obj.is_dir => {
                let file = UfsFile {
                    name: obj.name,
                    len: obj.len,
                    mtime_ns: obj.mtime_ns,
                    etag: obj.etag,
                };
                let (ino, mount) = (attr.ino, m.id);
                ns.call(shard_of(ino), move |reply| ShardMsg::UfsRefresh {
                    ino,
                    mount,
                    file: file.clone(),
                    now_ns: now_ns(),
                    reply,
                })
                .await
            }
            _ => {
                // Gone from the UFS (or now a directory): the cached file goes too.
                match ns.remove(path, false, false).await {
                    Ok(_) | Err(FsError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
                Err(FsError::NotFound(format!(
                    "{path}: removed from {}",
                    ufs.uri().join(rel)
                )))
            }
        }
    }

    /// Parent inode of a path (helper for callers that hold a path).
    pub async fn parent_of(ns: &Namespace, path: &str) -> FsResult<Ino> {
        let parts = components(path, "/")?;
        let parent = join(&parts[..parts.len().saturating_sub(1)]);
        Ok(ns.stat(&parent, true).await?.ino)
    }
}

/// A new mount point may not be, or be inside, or contain another.
fn check_placement(table: &MountTable, path: &str) -> FsResult<()> {
    if let Some((m, _)) = table.find(path) {
        return Err(if m.path == path {
            FsError::AlreadyExists(format!("{path} is already a mount point ({})", m.ufs))
        } else {
            FsError::InvalidArgument(format!(
                "{path} is inside mount {} ({}); mounts do not nest",
                m.path, m.ufs
            ))
        });
    }
    if let Some(m) = table.has_mount_below(path) {
        return Err(FsError::InvalidArgument(format!(
            "{path} contains mount {} ({}); mounts do not nest",
            m.path, m.ufs
        )));
    }
    Ok(())
}

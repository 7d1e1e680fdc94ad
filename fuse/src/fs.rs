//! The file system the kernel talks to: fuser's [`Filesystem`] over the
//! client library.
//!
//! Each request is answered from a tokio task: the fuser thread that read it
//! only copies its arguments and spawns, so a slow request (a UFS miss, a
//! commit) never holds the others. A reply dropped unanswered (a panic in a
//! task) reaches the caller as EIO.
//!
//! Invariants:
//! - Every request gets exactly one reply.
//! - Writes of a file go through its writer task (see [`crate::write`]);
//!   reads of a file with uncommitted writes too.
//! - Attributes the kernel gets of a file open for writing here include the
//!   writes not yet committed (size, mtime).
//! - What the cluster does not support answers with an errno that says so
//!   (ENOTSUP, EINVAL), never with wrong data.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use curvine_conf::FuseConf;
use curvine_messages::rpc::{self, ListEntry};
use curvine_messages::{Attr, FileKind, FsError, FsResult, SetAttr, TimeSet, XattrMode};
use curvine_node::io::{FileReader, FileWriter, WriteOptions};
use curvine_node::Client;

use crate::inodes::{Inodes, HIDDEN_PREFIX, ROOT};
use crate::write::{self, Writer};

/// The errno of an error.
pub fn errno(e: &FsError) -> Errno {
    crate::traces::answered_error(e);
    curvine_actors::stats::process().add(
        "curvine_fuse_errors_total",
        "Kernel requests the FUSE mount answered with an error, per error kind.",
        &[("error", e.kind_name())],
        1,
    );
    Errno::from_i32(e.errno())
}

/// An I/O error of a local file, keeping ENOSPC and EDQUOT.
pub fn io_error(what: &str, e: std::io::Error) -> FsError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => FsError::NoSpace(format!("{what}: {e}")),
        _ => FsError::Io(format!("{what}: {e}")),
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => TimeSet::Ns(d.as_nanos().min(i64::MAX as u128) as i64),
            Err(e) => TimeSet::Ns(-(e.duration().as_nanos().min(i64::MAX as u128) as i64)),
        },
    }
}

/// A name the namespace can hold (UTF-8).
fn name_str(name: &OsStr) -> FsResult<&str> {
    name.to_str().ok_or_else(|| {
        FsError::InvalidArgument(format!("{}: names must be UTF-8", name.to_string_lossy()))
    })
}

/// Errno for a name that is not UTF-8: "invalid multibyte sequence".
fn name_errno(e: &FsError) -> Errno {
    match e {
        FsError::InvalidArgument(m) if m.ends_with("names must be UTF-8") => {
            Errno::from_i32(libc::EILSEQ)
        }
        other => errno(other),
    }
}

/// Supplementary groups of a process (for chown and utimens rules).
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Who made a request.
#[derive(Clone, Copy)]
struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
}

impl Caller {
    fn of(req: &Request) -> Caller {
        Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        }
    }

    fn root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || groups_of(self.pid).contains(&gid)
    }

    /// Whether the caller may access `attr` for `mask` (R_OK, W_OK, X_OK).
    fn may(&self, attr: &Attr, mask: i32) -> bool {
        if mask == 0 {
            return true;
        }
        if self.root() {
            // Root may do anything but execute a file nobody may execute.
            return mask & libc::X_OK == 0 || attr.kind == FileKind::Dir || attr.mode & 0o111 != 0;
        }
        let bits = if self.uid == attr.uid {
            (attr.mode >> 6) & 7
        } else if self.in_group(attr.gid) {
            (attr.mode >> 3) & 7
        } else {
            attr.mode & 7
        };
        (bits as i32) & mask == mask
    }
}

struct FileHandleState {
    ino: u64,
    writer: Option<Arc<Writer>>,
    /// The handle's reader and the inode generation it was opened at.
    reader: tokio::sync::Mutex<Option<(FileReader, u64)>>,
    /// Kept while the kernel reads the file through passthrough.
    backing: Option<Arc<fuser::BackingId>>,
}

struct DirState {
    loaded: bool,
    entries: Vec<ListEntry>,
    more: bool,
}

struct DirHandleState {
    ino: u64,
    state: tokio::sync::Mutex<DirState>,
}

enum Handle {
    File(Box<FileHandleState>),
    Dir(DirHandleState),
}

/// The mount's state, shared by the fuser threads and the tasks.
pub struct Fs {
    pub client: Client,
    pub conf: FuseConf,
    pub inodes: Inodes,
    rt: tokio::runtime::Handle,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    /// Writer tasks by FUSE inode.
    writers: Mutex<HashMap<u64, Arc<Writer>>>,
    /// Commits made through this mount by inode: readers opened before the
    /// latest reopen.
    generations: Mutex<HashMap<u64, u64>>,
    /// Handles open per inode (files unlinked while open stay readable).
    open: Mutex<HashMap<u64, u32>>,
    statfs: Mutex<Option<(Instant, (u64, u64))>>,
    entry_ttl: Duration,
    attr_ttl: Duration,
    negative_ttl: Duration,
    /// Passthrough was agreed with the kernel.
    passthrough: std::sync::atomic::AtomicBool,
    /// Tells the kernel when attributes it cached changed here.
    notifier: std::sync::OnceLock<fuser::Notifier>,
    /// Extended attributes found absent, with when (see `xattr_absent`).
    absent_xattrs: Mutex<HashMap<(u64, String), Instant>>,
    /// Locks of opens deciding on passthrough, by inode.
    open_locks: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    /// Passthrough handles open per inode, and the backing file they share
    /// (the kernel wants every open of such an inode to use it).
    passthrough_handles: Mutex<HashMap<u64, (u32, Arc<fuser::BackingId>)>>,
    /// Sampled requests' traces.
    pub traces: Arc<crate::traces::FuseTraces>,
}

impl Fs {
    pub fn new(
        client: Client,
        conf: FuseConf,
        root: Attr,
        rt: tokio::runtime::Handle,
        traces: Arc<crate::traces::FuseTraces>,
    ) -> Fs {
        let inodes = Inodes::new(&conf.fs_path, root, conf.meta_cache_ttl.0);
        Fs {
            client,
            inodes,
            rt,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            writers: Mutex::new(HashMap::new()),
            generations: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            statfs: Mutex::new(None),
            entry_ttl: conf.entry_timeout.0,
            attr_ttl: conf.attr_timeout.0,
            negative_ttl: conf.negative_timeout.0,
            passthrough: std::sync::atomic::AtomicBool::new(false),
            notifier: std::sync::OnceLock::new(),
            passthrough_handles: Mutex::new(HashMap::new()),
            open_locks: Mutex::new(HashMap::new()),
            absent_xattrs: Mutex::new(HashMap::new()),
            traces,
            conf,
        }
    }

    /// Whether an extended attribute was found absent within the TTL.
    fn xattr_absent(&self, ino: u64, name: &str) -> bool {
        let ttl = self.conf.meta_cache_ttl.0;
        self.absent_xattrs
            .lock()
            .get(&(ino, name.to_string()))
            .is_some_and(|at| at.elapsed() < ttl)
    }

    fn remember_absent_xattr(&self, ino: u64, name: &str) {
        if self.conf.meta_cache_ttl.0.is_zero() {
            return;
        }
        let mut absent = self.absent_xattrs.lock();
        if absent.len() > 100_000 {
            absent.clear();
        }
        absent.insert((ino, name.to_string()), Instant::now());
    }

    fn forget_absent_xattrs(&self, ino: u64) {
        self.absent_xattrs.lock().retain(|(i, _), _| *i != ino);
    }

    /// The runtime the mount's tasks run on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.rt
    }

    pub fn stage_dir(&self) -> PathBuf {
        if self.conf.stage_dir.is_empty() {
            std::env::temp_dir()
        } else {
            PathBuf::from(&self.conf.stage_dir)
        }
    }

    /// The size of a file as last known here.
    pub fn known_size(&self, ino: u64) -> u64 {
        self.inodes.attr(ino).map(|a| a.size).unwrap_or(0)
    }

    /// Connects the kernel notifier of the session.
    pub fn set_notifier(&self, notifier: fuser::Notifier) {
        let _ = self.notifier.set(notifier);
    }

    /// A writer task committed (or truncated) a file.
    pub fn committed(&self, ino: u64, attr: Option<Attr>) {
        *self.generations.lock().entry(ino).or_default() += 1;
        if let Some(n) = self.notifier.get() {
            // The kernel's cached attributes (ctime, mtime) are those of the
            // open; it asks again. Offset -1: its page cache stays.
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
        match attr {
            Some(a) => self.inodes.set_attr(ino, a),
            None => self.inodes.expire(ino),
        }
    }

    fn generation(&self, ino: u64) -> u64 {
        self.generations.lock().get(&ino).copied().unwrap_or(0)
    }

    /// A writer task finished its last close: it ends unless a handle
    /// opened the file for writing meanwhile.
    pub fn writer_done(&self, ino: u64, flags: &Arc<write::Flags>) -> bool {
        let mut writers = self.writers.lock();
        if flags.handles.load(Ordering::SeqCst) > 0 {
            return false;
        }
        if writers
            .get(&ino)
            .is_some_and(|w| Arc::ptr_eq(&w.flags, flags))
        {
            writers.remove(&ino);
        }
        true
    }

    fn writer(&self, ino: u64) -> Option<Arc<Writer>> {
        self.writers.lock().get(&ino).cloned()
    }

    fn file_attr(&self, ino: u64, attr: &Attr) -> FileAttr {
        let kind = match attr.kind {
            FileKind::File => FileType::RegularFile,
            FileKind::Dir => FileType::Directory,
            FileKind::Symlink => FileType::Symlink,
        };
        let size = match attr.kind {
            FileKind::File => attr.size,
            FileKind::Dir => 4096,
            FileKind::Symlink => attr.symlink.as_ref().map(|s| s.len() as u64).unwrap_or(0),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(attr.atime_ns),
            mtime: time(attr.mtime_ns),
            ctime: time(attr.ctime_ns),
            crtime: time(attr.ctime_ns),
            kind,
            perm: (attr.mode & 0o7777) as u16,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            rdev: 0,
            blksize: self.conf.max_write.0 as u32,
            flags: 0,
        }
    }

    /// Attributes of an inode with this mount's uncommitted writes.
    fn with_writes(&self, ino: u64, mut attr: Attr) -> Attr {
        if let Some(w) = self.writer(ino) {
            w.overlay(&mut attr);
        }
        attr
    }

    /// Attributes of a known inode: cached within the TTL, else fetched.
    async fn getattr(&self, ino: u64) -> FsResult<Attr> {
        if let Some(attr) = self.inodes.fresh_attr(ino) {
            return Ok(self.with_writes(ino, attr));
        }
        let path = self.inodes.path(ino)?;
        let attr = self.client.call(rpc::Stat { path: path.clone() }).await?;
        if self.inodes.fuse_ino(attr.ino) != ino {
            if self.inodes.is_hidden(ino) || self.open_count(ino) > 0 {
                // Renamed or removed by another client while open here.
                if let Some(a) = self.inodes.attr(ino) {
                    return Ok(self.with_writes(ino, a));
                }
            }
            return Err(FsError::Stale(format!("{path} now names another file")));
        }
        self.inodes.set_attr(ino, attr.clone());
        Ok(self.with_writes(ino, attr))
    }

    fn open_count(&self, ino: u64) -> u32 {
        self.open.lock().get(&ino).copied().unwrap_or(0)
    }

    /// A handle of an open file (writer and backing file when it has them).
    fn add_file_handle(
        &self,
        ino: u64,
        writer: Option<Arc<Writer>>,
        backing: Option<Arc<fuser::BackingId>>,
    ) -> u64 {
        self.add_handle(Handle::File(Box::new(FileHandleState {
            ino,
            writer,
            reader: tokio::sync::Mutex::new(None),
            backing,
        })))
    }

    fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if let Handle::File(f) = &handle {
            *self.open.lock().entry(f.ino).or_default() += 1;
            self.inodes.pin(f.ino);
        }
        self.handles.lock().insert(fh, Arc::new(handle));
        fh
    }

    fn handle(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.handles
            .lock()
            .get(&fh)
            .cloned()
            .ok_or_else(|| FsError::InvalidArgument(format!("file handle {fh} is not open")))
    }

    /// Looks a name up: the name cache, else the cluster.
    async fn lookup(&self, parent: u64, name: &str) -> FsResult<(u64, Attr)> {
        if let Some((ino, attr)) = self.inodes.fresh_name(parent, name) {
            return Ok((ino, self.with_writes(ino, attr)));
        }
        let path = self.inodes.child_path(parent, name)?;
        let attr = self.client.call(rpc::Stat { path }).await?;
        let ino = self.inodes.fuse_ino(attr.ino);
        Ok((ino, self.with_writes(ino, attr)))
    }

    fn reply_entry(&self, reply: ReplyEntry, parent: u64, name: &str, attr: Attr) {
        let ino = self.inodes.remember(parent, name, attr.clone());
        let fattr = self.file_attr(ino, &self.with_writes(ino, attr));
        reply.entry_with_ttls(&self.attr_ttl, &self.entry_ttl, &fattr, Generation(0));
    }

    /// Owner of something a caller creates in `parent`: its gid comes from
    /// a set-group-ID directory (and a new directory inherits the bit).
    async fn new_owner(
        &self,
        parent: u64,
        caller: Caller,
        mode: u32,
        dir: bool,
    ) -> FsResult<(u32, u32, u32)> {
        let pattr = self.getattr(parent).await?;
        if pattr.mode & libc::S_ISGID != 0 {
            let mode = if dir { mode | libc::S_ISGID } else { mode };
            return Ok((caller.uid, pattr.gid, mode));
        }
        Ok((caller.uid, caller.gid, mode))
    }

    /// Path, owner and mode of something a caller creates as `name` in
    /// `parent` (a directory when `dir`).
    async fn new_entry(
        &self,
        parent: u64,
        name: &str,
        caller: Caller,
        mode: u32,
        dir: bool,
    ) -> FsResult<(String, u32, u32, u32)> {
        let path = self.inodes.child_path(parent, name)?;
        let (uid, gid, mode) = self.new_owner(parent, caller, mode & 0o7777, dir).await?;
        Ok((path, uid, gid, mode))
    }

    /// Checks the rules of chmod, chown and utimens for a caller.
    fn check_setattr(&self, caller: Caller, attr: &Attr, set: &mut SetAttr) -> FsResult<()> {
        let owner = caller.root() || caller.uid == attr.uid;
        if let Some(mode) = set.mode {
            if !owner {
                return Err(FsError::NotPermitted(
                    "only the owner may change the mode".into(),
                ));
            }
            let gid = set.gid.unwrap_or(attr.gid);
            if !caller.root()
                && attr.kind != FileKind::Dir
                && mode & libc::S_ISGID != 0
                && !caller.in_group(gid)
            {
                // Not a member of the file's group: the set-group-ID bit is dropped.
                set.mode = Some(mode & !libc::S_ISGID);
            }
        }
        let uid_change = set.uid.is_some_and(|u| u != attr.uid);
        let gid_change = set.gid.is_some_and(|g| g != attr.gid);
        if uid_change && !caller.root() {
            return Err(FsError::NotPermitted(
                "only root may change the owner".into(),
            ));
        }
        if let Some(g) = set.gid {
            if !caller.root() && (caller.uid != attr.uid || (gid_change && !caller.in_group(g))) {
                return Err(FsError::NotPermitted(
                    "only the owner may change the group, to a group they are in".into(),
                ));
            }
        }
        if (set.uid.is_some() || set.gid.is_some()) && attr.kind != FileKind::Dir {
            // A change of owner or group drops set-user-ID, and set-group-ID
            // when group execution is allowed.
            let mut mode = set.mode.unwrap_or(attr.mode);
            let before = mode;
            mode &= !libc::S_ISUID;
            if mode & libc::S_IXGRP != 0 {
                mode &= !libc::S_ISGID;
            }
            if mode != before || set.mode.is_some() {
                set.mode = Some(mode);
            }
        }
        for t in [set.atime, set.mtime].into_iter().flatten() {
            match t {
                TimeSet::Now if !owner && !caller.may(attr, libc::W_OK) => {
                    return Err(FsError::PermissionDenied(
                        "setting times to now needs write access".into(),
                    ))
                }
                TimeSet::Ns(_) if !owner => {
                    return Err(FsError::NotPermitted("only the owner may set times".into()))
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn setattr(&self, ino: u64, caller: Caller, mut set: SetAttr) -> FsResult<Attr> {
        let attr = self.getattr(ino).await?;
        self.check_setattr(caller, &attr, &mut set)?;
        if let Some(w) = self.writer(ino).filter(|w| w.dirty()) {
            let times_only = SetAttr {
                atime: None,
                mtime: None,
                ..set.clone()
            } == SetAttr::default();
            if times_only && set != SetAttr::default() && self.conf.writeback_cache {
                // The kernel's writeback cache sends the file's mtime while
                // its writes are still arriving: the times go with the
                // writes' commit, after them.
                match w.set_times(set.clone()).await {
                    Err(e) if write::ended(&e) => {}
                    done => return done,
                }
            } else {
                // Writes first: their commit would otherwise overwrite
                // times set now (cp -a sets them before it closes the file).
                match w.commit().await {
                    Err(e) if write::ended(&e) => {}
                    done => done?,
                }
            }
        }
        if let Some(size) = set.size.take() {
            if attr.kind == FileKind::Dir {
                return Err(FsError::IsADirectory("cannot truncate a directory".into()));
            }
            let by_writer = match self.writer(ino) {
                Some(w) => match w.truncate(size).await {
                    Err(e) if write::ended(&e) => false,
                    done => done.map(|_| true)?,
                },
                None => false,
            };
            match by_writer {
                true => {}
                false => {
                    let path = self.inodes.path(ino)?;
                    let done = self
                        .client
                        .call(rpc::SetAttrs {
                            path,
                            set: SetAttr {
                                size: Some(size),
                                ..Default::default()
                            },
                            follow: false,
                        })
                        .await?;
                    self.committed(ino, Some(done));
                }
            }
            self.inodes.drop_cached(ino);
        }
        if set == SetAttr::default() {
            let attr = self.getattr_fresh(ino).await?;
            return Ok(attr);
        }
        let path = self.inodes.path(ino)?;
        let attr = self
            .client
            .call(rpc::SetAttrs {
                path,
                set,
                follow: false,
            })
            .await?;
        self.inodes.set_attr(ino, attr.clone());
        Ok(self.with_writes(ino, attr))
    }

    async fn getattr_fresh(&self, ino: u64) -> FsResult<Attr> {
        self.inodes.expire(ino);
        self.getattr(ino).await
    }

    /// Capacity and free bytes of the cluster (cached for a second).
    async fn capacity(&self) -> FsResult<(u64, u64)> {
        if let Some((at, v)) = *self.statfs.lock() {
            if at.elapsed() < Duration::from_secs(1) {
                return Ok(v);
            }
        }
        let report = self.client.report().await?;
        let (mut cap, mut used) = (0u64, 0u64);
        for node in &report.nodes {
            for tier in &node.tiers {
                cap += tier.capacity;
                used += tier.used + tier.reserved;
            }
        }
        let v = (cap, cap.saturating_sub(used));
        *self.statfs.lock() = Some((Instant::now(), v));
        Ok(v)
    }

    /// Fetches the next page of a directory listing.
    async fn load_dir(&self, dir: &DirHandleState, st: &mut DirState) -> FsResult<()> {
        let path = self.inodes.path(dir.ino)?;
        let after = st.entries.last().map(|e| e.name.clone());
        let page = self
            .client
            .call(rpc::List {
                path,
                after,
                limit: 1000,
            })
            .await?;
        st.loaded = true;
        st.more = page.more && !page.entries.is_empty();
        st.entries.extend(page.entries);
        Ok(())
    }

    /// Entry `i` of a listing (after "." and ".."), fetching pages as needed.
    async fn dir_entry(
        &self,
        dir: &DirHandleState,
        st: &mut DirState,
        i: usize,
    ) -> FsResult<Option<ListEntry>> {
        while !st.loaded || (i >= st.entries.len() && st.more) {
            self.load_dir(dir, st).await?;
        }
        Ok(st.entries.get(i).cloned())
    }

    /// A read answered at once from a block file the handle's reader has
    /// open, or `None` (the reader is busy, or the bytes need the node).
    /// Answers a read from a block file of this host the handle has open,
    /// on the calling (fuser) thread, into that thread's reusable buffer;
    /// gives the reply back when the read needs a task.
    fn read_now(
        &self,
        ino: u64,
        fh: u64,
        off: u64,
        size: u32,
        reply: ReplyData,
    ) -> Result<(), ReplyData> {
        thread_local! {
            // One buffer per fuser thread, kept between requests: a fresh
            // zeroed 1 MiB per read cost page faults, zeroing and page-table
            // work that showed up as a quarter of the mount's CPU.
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let Ok(handle) = self.handle(fh) else {
            return Err(reply);
        };
        let Handle::File(file) = &*handle else {
            return Err(reply);
        };
        let gen = self.generation(ino);
        let Ok(mut slot) = file.reader.try_lock() else {
            return Err(reply);
        };
        let Some((reader, g)) = slot.as_mut() else {
            return Err(reply);
        };
        if *g != gen {
            return Err(reply);
        }
        let len = (size as u64).min(reader.size().saturating_sub(off)) as usize;
        BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            if buf.len() < len {
                buf.resize(len, 0);
            }
            let mut done = 0;
            while done < len {
                match reader.read_local_now(off + done as u64, &mut buf[done..len]) {
                    None => return Err(reply),
                    Some(Ok(0)) => break,
                    Some(Ok(n)) => done += n,
                    Some(Err(e)) => {
                        reply.error(errno(&e));
                        return Ok(());
                    }
                }
            }
            reply.data(&buf[..done]);
            Ok(())
        })
    }

    async fn read(&self, ino: u64, fh: u64, off: u64, size: u32) -> FsResult<Vec<u8>> {
        let handle = self.handle(fh)?;
        let Handle::File(file) = &*handle else {
            return Err(FsError::IsADirectory("read of a directory handle".into()));
        };
        let gen = self.generation(ino);
        let mut slot = file.reader.lock().await;
        if slot.as_ref().is_none_or(|(_, g)| *g != gen) {
            let path = self.inodes.path(ino)?;
            *slot = Some((FileReader::open(&self.client, &path).await?, gen));
        }
        let Some((reader, _)) = slot.as_mut() else {
            return Err(FsError::Io("no reader".into()));
        };
        let len = (size as u64).min(reader.size().saturating_sub(off)) as usize;
        let mut buf = vec![0u8; len];
        reader.seek(off);
        let mut done = 0;
        while done < len {
            let n = reader.read(&mut buf[done..]).await?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Opens (or joins) the writer task of a file for a new handle.
    fn join_writer(
        self: &Arc<Self>,
        ino: u64,
        owner: (u32, u32),
        opened: Option<FileWriter>,
    ) -> Arc<Writer> {
        let mut writers = self.writers.lock();
        if let Some(w) = writers.get(&ino) {
            w.flags.handles.fetch_add(1, Ordering::SeqCst);
            if opened.is_some() {
                tracing::warn!(ino, "a file created while open for writing here");
            }
            return w.clone();
        }
        let size = opened
            .as_ref()
            .map(|w| w.size())
            .unwrap_or_else(|| self.known_size(ino));
        let w = write::start(self.clone(), ino, owner, opened, size);
        writers.insert(ino, w.clone());
        w
    }

    fn open_flags(&self, ino: u64, attr: &Attr) -> FopenFlags {
        let mut flags = FopenFlags::empty();
        if self.conf.direct_io {
            flags |= FopenFlags::FOPEN_DIRECT_IO;
        } else if self.conf.keep_cache && self.inodes.keep_cache(ino, attr) {
            flags |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        flags
    }

    /// Removes a file, or hides it while it is open here.
    async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        let path = self.inodes.child_path(parent, name)?;
        let known = self.inodes.known_child(parent, name);
        if let Some(ino) = known.filter(|i| self.open_count(*i) > 0) {
            let hidden = format!("{HIDDEN_PREFIX}{ino:x}");
            let to = self.inodes.child_path(parent, &hidden)?;
            self.client.rename(&path, &to).await?;
            self.inodes.drop_name(parent, name);
            self.inodes.hide(ino, parent, &hidden);
            return Ok(());
        }
        self.client
            .call(rpc::Remove {
                path,
                recursive: false,
                dir: false,
            })
            .await?;
        self.inodes.drop_name(parent, name);
        if let Some(ino) = known {
            self.inodes.unlinked(ino);
        }
        Ok(())
    }

    async fn rename(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: RenameFlags,
    ) -> FsResult<()> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return Err(FsError::InvalidArgument(
                "RENAME_EXCHANGE and RENAME_WHITEOUT are not supported".into(),
            ));
        }
        let src = self.inodes.child_path(parent, name)?;
        let dst = self.inodes.child_path(newparent, newname)?;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            match self.client.stat(&dst).await {
                Ok(_) => return Err(FsError::AlreadyExists(dst)),
                Err(FsError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        // A file open here that the rename replaces stays readable.
        let replaced = self.inodes.known_child(newparent, newname);
        if let Some(ino) = replaced
            .filter(|i| self.open_count(*i) > 0 && self.inodes.kind(*i) == Some(FileKind::File))
        {
            if self.inodes.known_child(parent, name) != Some(ino) {
                let hidden = format!("{HIDDEN_PREFIX}{ino:x}");
                let to = self.inodes.child_path(newparent, &hidden)?;
                self.client.rename(&dst, &to).await?;
                self.inodes.hide(ino, newparent, &hidden);
            }
        } else if let Some(ino) = replaced {
            self.inodes.unlinked(ino);
        }
        self.client.rename(&src, &dst).await?;
        self.inodes.renamed(parent, name, newparent, newname);
        Ok(())
    }

    /// The last handle of a file was released.
    async fn released(&self, ino: u64) {
        if !self.inodes.is_hidden(ino) {
            return;
        }
        let Ok(path) = self.inodes.path(ino) else {
            return;
        };
        if let Err(e) = self
            .client
            .call(rpc::Remove {
                path: path.clone(),
                recursive: false,
                dir: false,
            })
            .await
        {
            tracing::warn!(path, error = %e, "cannot remove a file unlinked while open");
        }
    }

    /// The lock under which opens of an inode choose passthrough or not.
    fn open_lock(&self, ino: u64) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.open_locks.lock();
        if locks.len() > 4096 {
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        locks.entry(ino).or_default().clone()
    }

    /// Passthrough handles of an inode open now.
    fn passthrough_open(&self, ino: u64) -> u32 {
        self.passthrough_handles
            .lock()
            .get(&ino)
            .map(|(n, _)| *n)
            .unwrap_or(0)
    }

    /// Opens a handle whose reads the kernel serves from the file's block
    /// file on this host (the inode's shared one, or a new one); `None` when
    /// the file is not one block on this host.
    async fn open_passthrough(
        &self,
        ino: u64,
        reply: &ReplyOpen,
    ) -> Option<(u64, Arc<fuser::BackingId>)> {
        let shared = self
            .passthrough_handles
            .lock()
            .get(&ino)
            .map(|(_, b)| b.clone());
        let backing = match shared {
            Some(b) => b,
            None => {
                let path = self.inodes.path(ino).ok()?;
                let file = self.passthrough_file(&path).await?;
                match reply.open_backing(&file) {
                    Ok(b) => Arc::new(b),
                    Err(e) => {
                        tracing::debug!(path, error = %e, "passthrough refused by the kernel");
                        return None;
                    }
                }
            }
        };
        self.passthrough_handles
            .lock()
            .entry(ino)
            .or_insert_with(|| (0, backing.clone()))
            .0 += 1;
        let fh = self.add_file_handle(ino, None, Some(backing.clone()));
        Some((fh, backing))
    }

    /// Opens the block file of a file whose data is one block on this host
    /// for passthrough.
    async fn passthrough_file(&self, path: &str) -> Option<std::fs::File> {
        let blocks = self.client.blocks(path).await.ok()?;
        if blocks.blocks.len() != 1 || blocks.attr.size == 0 || blocks.attr.writing.is_some() {
            return None;
        }
        let block = &blocks.blocks[0];
        if block.info.len != blocks.attr.size {
            return None;
        }
        let replica = block.replicas.iter().find_map(|r| r.path.clone())?;
        std::fs::File::open(replica).ok()
    }
}

/// fuser's entry point: each method copies what it needs and answers from a task.
pub struct CurvineFs(pub Arc<Fs>);

impl CurvineFs {
    /// Runs the answer to a kernel request of kind `op` in a task, counting
    /// it and its latency (`curvine_fuse_operations_total`,
    /// `curvine_fuse_operation_duration_seconds`).
    fn spawn<F>(&self, op: &'static str, f: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let metrics = curvine_actors::stats::process();
        metrics.add(
            "curvine_fuse_operations_total",
            "Kernel requests the FUSE mount answered, per operation.",
            &[("op", op)],
            1,
        );
        let latency = metrics.histogram(
            "curvine_fuse_operation_duration_seconds",
            "Time the FUSE mount took to answer a kernel request, per operation.",
            &[("op", op)],
        );
        let started = std::time::Instant::now();
        // The sampling draw happens here, so an untraced request's task
        // holds nothing but its own future.
        if self.0.traces.sampled() {
            let traces = self.0.traces.clone();
            self.0.rt.spawn(async move {
                traces.run(op, f).await;
                latency.observe(started.elapsed());
            });
        } else {
            self.0.rt.spawn(async move {
                f.await;
                latency.observe(started.elapsed());
            });
        }
    }
}

macro_rules! try_reply {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error(name_errno(&e));
                return;
            }
        }
    };
}

/// A reply that can answer an error (each of fuser's replies can; they
/// share no trait for it).
trait ErrorReply: Send + 'static {
    fn error(self, err: Errno);
}

impl ErrorReply for ReplyEntry {
    fn error(self, err: Errno) {
        ReplyEntry::error(self, err)
    }
}

impl ErrorReply for ReplyCreate {
    fn error(self, err: Errno) {
        ReplyCreate::error(self, err)
    }
}

/// A request to make an entry (mknod, mkdir, symlink, create), its
/// arguments copied from the kernel's.
struct NewRequest {
    parent: u64,
    name: OsString,
    caller: Caller,
    /// The mode asked for (with the file type bits) and the umask to apply.
    mode: u32,
    umask: u32,
}

impl NewRequest {
    fn of(req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32) -> NewRequest {
        NewRequest {
            parent: parent.0,
            name: name.to_os_string(),
            caller: Caller::of(req),
            mode,
            umask,
        }
    }
}

/// What a request makes; a symlink's target as the kernel sent it
/// (`OsString`), then checked (`String`).
enum NewKind<T> {
    File,
    Dir,
    Symlink(T),
}

/// An entry about to be made: its checked name, what it is, and its path,
/// owner and mode (`Fs::new_entry`).
struct NewEntry {
    parent: u64,
    name: String,
    kind: NewKind<String>,
    path: String,
    uid: u32,
    gid: u32,
    mode: u32,
}

impl CurvineFs {
    /// Answers a request that makes an entry, from a task: checks its name
    /// (and a symlink's target), picks its path, owner and mode
    /// (`Fs::new_entry`), then `make` makes it and answers.
    fn spawn_new<R, F, Fut>(
        &self,
        op: &'static str,
        new: NewRequest,
        kind: NewKind<OsString>,
        reply: R,
        make: F,
    ) where
        R: ErrorReply,
        F: FnOnce(Arc<Fs>, NewEntry, R) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let fs = self.0.clone();
        self.spawn(op, async move {
            let name = try_reply!(reply, name_str(&new.name)).to_string();
            let kind = match kind {
                NewKind::File => NewKind::File,
                NewKind::Dir => NewKind::Dir,
                NewKind::Symlink(target) => {
                    NewKind::Symlink(try_reply!(reply, name_str(&target)).to_string())
                }
            };
            let dir = matches!(kind, NewKind::Dir);
            let mode = new.mode & !new.umask;
            let (path, uid, gid, mode) = try_reply!(
                reply,
                fs.new_entry(new.parent, &name, new.caller, mode, dir).await
            );
            let entry = NewEntry {
                parent: new.parent,
                name,
                kind,
                path,
                uid,
                gid,
                mode,
            };
            make(fs, entry, reply).await;
        });
    }

    /// Answers mknod, mkdir and symlink: the entry made, or why not.
    fn make_entry(
        &self,
        op: &'static str,
        new: NewRequest,
        kind: NewKind<OsString>,
        reply: ReplyEntry,
    ) {
        self.spawn_new(op, new, kind, reply, |fs, new, reply| async move {
            let made = match new.kind {
                NewKind::File => {
                    let touch = rpc::Touch {
                        path: new.path,
                        mode: new.mode,
                        exclusive: true,
                        uid: new.uid,
                        gid: new.gid,
                    };
                    fs.client.call(touch).await
                }
                NewKind::Dir => {
                    let mkdir = rpc::Mkdir {
                        path: new.path,
                        parents: false,
                        mode: new.mode,
                        uid: new.uid,
                        gid: new.gid,
                    };
                    fs.client.call(mkdir).await
                }
                NewKind::Symlink(target) => {
                    let symlink = rpc::Symlink {
                        target,
                        link: new.path,
                        uid: new.uid,
                        gid: new.gid,
                    };
                    fs.client.call(symlink).await
                }
            };
            let attr = try_reply!(reply, made);
            fs.inodes.expire(new.parent);
            fs.reply_entry(reply, new.parent, &new.name, attr);
        });
    }
}

/// Answers a create: opens the new file for writing (its `FileWriter`) and
/// a handle on it.
async fn open_created(fs: Arc<Fs>, new: NewEntry, flags: i32, reply: ReplyCreate) {
    let options = WriteOptions {
        create: true,
        exclusive: flags & libc::O_EXCL != 0,
        truncate: flags & libc::O_TRUNC != 0,
        mode: new.mode,
        owner: Some((new.uid, new.gid)),
        spec: curvine_messages::block::FileSpec {
            block_size: fs.conf.block_size.0,
            ..Default::default()
        },
        ..Default::default()
    };
    let w = try_reply!(
        reply,
        FileWriter::open(&fs.client, &new.path, &options).await
    );
    let attr = w.attr.clone();
    fs.inodes.expire(new.parent);
    let ino = fs.inodes.remember(new.parent, &new.name, attr.clone());
    fs.inodes.drop_cached(ino);
    let writer = fs.join_writer(ino, (new.uid, new.gid), Some(w));
    let fh = fs.add_file_handle(ino, Some(writer), None);
    let mut open_flags = FopenFlags::empty();
    if fs.conf.direct_io {
        open_flags |= FopenFlags::FOPEN_DIRECT_IO;
    }
    let fattr = fs.file_attr(ino, &fs.with_writes(ino, attr));
    reply.created(
        &fs.entry_ttl,
        &fattr,
        Generation(0),
        FileHandle(fh),
        open_flags,
    );
}

impl Filesystem for CurvineFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let conf = &self.0.conf;
        let want = conf.max_write.0 as u32;
        if let Err(max) = config.set_max_write(want) {
            let _ = config.set_max_write(max);
        }
        let ra = conf.max_readahead.0.min(u32::MAX as u64) as u32;
        if let Err(max) = config.set_max_readahead(ra) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        let mut wanted = InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_AUTO_INVAL_DATA
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_BIG_WRITES;
        if conf.async_read {
            wanted |= InitFlags::FUSE_ASYNC_READ;
        }
        if conf.readdirplus {
            wanted |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        if conf.parallel_dirops {
            wanted |= InitFlags::FUSE_PARALLEL_DIROPS;
        }
        if conf.writeback_cache {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        for flag in wanted.iter() {
            if let Err(e) = config.add_capabilities(flag) {
                tracing::info!(?e, "the kernel does not offer a FUSE capability");
            }
        }
        if conf.passthrough {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if ok {
                self.0.passthrough.store(true, Ordering::SeqCst);
            } else {
                tracing::warn!("fuse.passthrough is on but the kernel does not offer passthrough; reads go through the mount");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let fs = self.0.clone();
        let parent = parent.0;
        // A name the mount knows, fetched within the TTL: answered here.
        if let Some(n) = name.to_str() {
            if let Some((ino, attr)) = fs.inodes.fresh_name(parent, n) {
                let attr = fs.with_writes(ino, attr);
                fs.reply_entry(reply, parent, n, attr);
                return;
            }
        }
        let name = name.to_os_string();
        self.spawn("lookup", async move {
            let name = try_reply!(reply, name_str(&name));
            match fs.lookup(parent, name).await {
                Ok((_, attr)) => fs.reply_entry(reply, parent, name, attr),
                Err(FsError::NotFound(_)) if !fs.negative_ttl.is_zero() => {
                    // A negative entry: the kernel remembers the name is absent.
                    let none = fs.file_attr(0, &empty_attr());
                    reply.entry_with_ttls(&fs.negative_ttl, &fs.negative_ttl, &none, Generation(0));
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.inodes.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let fs = self.0.clone();
        if let Some(attr) = fs.inodes.fresh_attr(ino.0) {
            let attr = fs.with_writes(ino.0, attr);
            reply.attr(&fs.attr_ttl, &fs.file_attr(ino.0, &attr));
            return;
        }
        self.spawn("getattr", async move {
            let attr = try_reply!(reply, fs.getattr(ino.0).await);
            reply.attr(&fs.attr_ttl, &fs.file_attr(ino.0, &attr));
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let fs = self.0.clone();
        let caller = Caller::of(req);
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid: uid.filter(|u| *u != u32::MAX),
            gid: gid.filter(|g| *g != u32::MAX),
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
        };
        self.spawn("setattr", async move {
            let attr = try_reply!(reply, fs.setattr(ino.0, caller, set).await);
            reply.attr(&fs.attr_ttl, &fs.file_attr(ino.0, &attr));
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = self.0.clone();
        self.spawn("readlink", async move {
            if let Some(target) = fs.inodes.attr(ino.0).and_then(|a| a.symlink) {
                reply.data(target.as_bytes());
                return;
            }
            let path = try_reply!(reply, fs.inodes.path(ino.0));
            let target = try_reply!(reply, fs.client.readlink(&path).await);
            reply.data(target.as_bytes());
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            reply.error(Errno::from_i32(libc::ENOTSUP));
            return;
        }
        let new = NewRequest::of(req, parent, name, mode, umask);
        self.make_entry("mknod", new, NewKind::File, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let new = NewRequest::of(req, parent, name, mode, umask);
        self.make_entry("mkdir", new, NewKind::Dir, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let fs = self.0.clone();
        let name = name.to_os_string();
        self.spawn("unlink", async move {
            let name = try_reply!(reply, name_str(&name));
            try_reply!(reply, fs.unlink(parent.0, name).await);
            fs.inodes.expire(parent.0);
            reply.ok();
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let fs = self.0.clone();
        let name = name.to_os_string();
        self.spawn("rmdir", async move {
            let name = try_reply!(reply, name_str(&name));
            let path = try_reply!(reply, fs.inodes.child_path(parent.0, name));
            try_reply!(
                reply,
                fs.client
                    .call(rpc::Remove {
                        path,
                        recursive: false,
                        dir: true,
                    })
                    .await
            );
            if let Some(ino) = fs.inodes.known_child(parent.0, name) {
                fs.inodes.unlinked(ino);
            }
            fs.inodes.drop_name(parent.0, name);
            fs.inodes.expire(parent.0);
            reply.ok();
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let new = NewRequest::of(req, parent, link_name, 0o777, 0);
        let target = target.as_os_str().to_os_string();
        self.make_entry("symlink", new, NewKind::Symlink(target), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let fs = self.0.clone();
        let name = name.to_os_string();
        let newname = newname.to_os_string();
        self.spawn("rename", async move {
            let name = try_reply!(reply, name_str(&name));
            let newname = try_reply!(reply, name_str(&newname));
            try_reply!(
                reply,
                fs.rename(parent.0, name, newparent.0, newname, flags).await
            );
            fs.inodes.expire(parent.0);
            fs.inodes.expire(newparent.0);
            reply.ok();
        });
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // The namespace has one name per file.
        reply.error(Errno::from_i32(libc::ENOTSUP));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.0.clone();
        let owner = (req.uid(), req.gid());
        let writes = flags.acc_mode() != OpenAccMode::O_RDONLY;
        // A read-only open of a file whose attributes are cached is answered
        // here, without a hand-off to a task (the common case of reading
        // many small files).
        if !writes && !fs.passthrough.load(Ordering::SeqCst) {
            if let Some(attr) = fs.inodes.fresh_attr(ino.0) {
                if attr.kind != FileKind::Dir {
                    let attr = fs.with_writes(ino.0, attr);
                    let open_flags = fs.open_flags(ino.0, &attr) | FopenFlags::FOPEN_NOFLUSH;
                    let fh = fs.add_file_handle(ino.0, None, None);
                    reply.opened(FileHandle(fh), open_flags);
                    return;
                }
            }
        }
        self.spawn("open", async move {
            let ino = ino.0;
            let attr = try_reply!(reply, fs.getattr(ino).await);
            if attr.kind == FileKind::Dir {
                reply.error(Errno::from_i32(libc::EISDIR));
                return;
            }
            // With passthrough, opens of one inode decide one at a time: the
            // kernel wants all of them on the same backing file, or none.
            let _decide = match fs.passthrough.load(Ordering::SeqCst) {
                true => Some(fs.open_lock(ino).lock_owned().await),
                false => None,
            };
            if writes && fs.passthrough_open(ino) > 0 {
                // The kernel reads the file from its block file now, which
                // is never written in place.
                reply.error(Errno::from_i32(libc::ETXTBSY));
                return;
            }
            let mut attr = attr;
            let writer = if writes {
                let w = fs.join_writer(ino, owner, None);
                if flags.0 & libc::O_TRUNC != 0 {
                    match w.open_truncate().await {
                        Ok(a) => attr = a,
                        Err(e) => {
                            fs.release_writer(&w);
                            reply.error(errno(&e));
                            return;
                        }
                    }
                }
                Some(w)
            } else {
                None
            };
            let mut open_flags = fs.open_flags(ino, &attr);
            if writer.is_some() {
                fs.inodes.drop_cached(ino);
                open_flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
            } else {
                // Closing a read-only handle has nothing to flush (locks
                // are the kernel's): no FLUSH request at each close.
                open_flags |= FopenFlags::FOPEN_NOFLUSH;
            }
            let passthrough = !writes
                && fs.passthrough.load(Ordering::SeqCst)
                && !fs.conf.direct_io
                && fs.writer(ino).is_none()
                && fs.open_count(ino) == fs.passthrough_open(ino);
            if passthrough || fs.passthrough_open(ino) > 0 {
                if let Some((fh, backing)) = fs.open_passthrough(ino, &reply).await {
                    // Page-cache flags do not go with passthrough.
                    reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &backing);
                    return;
                }
            }
            let fh = fs.add_file_handle(ino, writer, None);
            reply.opened(FileHandle(fh), open_flags);
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.0.clone();
        if let Some(w) = fs.writer(ino.0).filter(|w| w.dirty()) {
            // Uncommitted writes: the writer task answers, in order with them.
            w.read(offset, size, reply);
            return;
        }
        // Data in a block file of this host the handle has open: answered
        // here, without a hand-off to a task (one wake-up less per read).
        let Err(reply) = fs.read_now(ino.0, fh.0, offset, size, reply) else {
            return;
        };
        self.spawn("read", async move {
            let data = try_reply!(reply, fs.read(ino.0, fh.0, offset, size).await);
            reply.data(&data);
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let metrics = curvine_actors::stats::process();
        metrics.add(
            "curvine_fuse_operations_total",
            "Kernel requests the FUSE mount answered, per operation.",
            &[("op", "write")],
            1,
        );
        metrics.add(
            "curvine_fuse_written_bytes_total",
            "Bytes written through the FUSE mount.",
            &[],
            data.len() as u64,
        );
        let handle = match self.0.handle(fh.0) {
            Ok(h) => h,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        match &*handle {
            Handle::File(f) if f.writer.is_some() => {
                if let Some(w) = &f.writer {
                    w.write(offset, data, reply)
                }
            }
            _ => reply.error(Errno::from_i32(libc::EBADF)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        let fs = self.0.clone();
        self.spawn("flush", async move {
            let handle = try_reply!(reply, fs.handle(fh.0));
            if let Handle::File(f) = &*handle {
                if let Some(w) = &f.writer {
                    try_reply!(reply, w.commit().await);
                }
            }
            reply.ok();
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush(_req, _ino, fh, LockOwner(0), reply);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.0.clone();
        let handle = fs.handles.lock().remove(&fh.0);
        let Some(handle) = handle else {
            reply.ok();
            return;
        };
        let last = {
            let mut open = fs.open.lock();
            let n = open.entry(ino.0).or_default();
            *n = n.saturating_sub(1);
            let last = *n == 0;
            if last {
                open.remove(&ino.0);
            }
            last
        };
        if let Handle::File(f) = &*handle {
            if let Some(w) = &f.writer {
                fs.release_writer(w);
            }
            if f.backing.is_some() {
                let mut pt = fs.passthrough_handles.lock();
                if let Some((n, _)) = pt.get_mut(&ino.0) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        pt.remove(&ino.0);
                    }
                }
            }
        }
        reply.ok();
        if last && fs.inodes.is_hidden(ino.0) {
            self.spawn("release", async move {
                fs.released(ino.0).await;
                fs.inodes.unpin(ino.0);
            });
        } else {
            fs.inodes.unpin(ino.0);
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.0.add_handle(Handle::Dir(DirHandleState {
            ino: ino.0,
            state: tokio::sync::Mutex::new(DirState {
                loaded: false,
                entries: Vec::new(),
                more: true,
            }),
        }));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let fs = self.0.clone();
        self.spawn("readdir", async move {
            let handle = try_reply!(reply, fs.handle(fh.0));
            let Handle::Dir(dir) = &*handle else {
                reply.error(Errno::from_i32(libc::ENOTDIR));
                return;
            };
            let mut st = dir.state.lock().await;
            let mut off = offset;
            loop {
                let (child, kind, name) = match off {
                    0 => (ino.0, FileType::Directory, ".".to_string()),
                    1 => {
                        let parent = fs
                            .inodes
                            .attr(ino.0)
                            .map(|a| fs.inodes.fuse_ino(a.parent))
                            .unwrap_or(ROOT);
                        (parent.max(1), FileType::Directory, "..".to_string())
                    }
                    n => {
                        match try_reply!(reply, fs.dir_entry(dir, &mut st, (n - 2) as usize).await)
                        {
                            None => break,
                            Some(e) if e.name.starts_with(HIDDEN_PREFIX) => {
                                off += 1;
                                continue;
                            }
                            Some(e) => {
                                let kind = match e.attr.kind {
                                    FileKind::File => FileType::RegularFile,
                                    FileKind::Dir => FileType::Directory,
                                    FileKind::Symlink => FileType::Symlink,
                                };
                                (fs.inodes.fuse_ino(e.attr.ino), kind, e.name)
                            }
                        }
                    }
                };
                if reply.add(INodeNo(child), off + 1, kind, &name) {
                    break;
                }
                off += 1;
            }
            reply.ok();
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let fs = self.0.clone();
        self.spawn("readdirplus", async move {
            let handle = try_reply!(reply, fs.handle(fh.0));
            let Handle::Dir(dir) = &*handle else {
                reply.error(Errno::from_i32(libc::ENOTDIR));
                return;
            };
            let mut st = dir.state.lock().await;
            let mut off = offset;
            loop {
                let full = match off {
                    0 | 1 => {
                        let attr = try_reply!(reply, fs.getattr(ino.0).await);
                        let name = if off == 0 { "." } else { ".." };
                        reply.add(
                            INodeNo(ino.0),
                            off + 1,
                            name,
                            &fs.entry_ttl,
                            &fs.file_attr(ino.0, &attr),
                            Generation(0),
                        )
                    }
                    n => {
                        match try_reply!(reply, fs.dir_entry(dir, &mut st, (n - 2) as usize).await)
                        {
                            None => break,
                            Some(e) if e.name.starts_with(HIDDEN_PREFIX) => false,
                            Some(e) => {
                                let child = fs.inodes.fuse_ino(e.attr.ino);
                                let attr = fs.with_writes(child, e.attr.clone());
                                let full = reply.add(
                                    INodeNo(child),
                                    off + 1,
                                    &e.name,
                                    &fs.entry_ttl,
                                    &fs.file_attr(child, &attr),
                                    Generation(0),
                                );
                                if !full {
                                    // The kernel counts a lookup for each entry it gets.
                                    fs.inodes.remember(ino.0, &e.name, e.attr);
                                }
                                full
                            }
                        }
                    }
                };
                if full {
                    break;
                }
                off += 1;
            }
            reply.ok();
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.0.handles.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Namespace changes are durable when they are acknowledged.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let fs = self.0.clone();
        self.spawn("statfs", async move {
            let (cap, free) = try_reply!(reply, fs.capacity().await);
            const BS: u64 = 4096;
            reply.statfs(
                cap / BS,
                free / BS,
                free / BS,
                u32::MAX as u64,
                u32::MAX as u64 - fs.inodes.len() as u64,
                BS as u32,
                255,
                BS as u32,
            );
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let fs = self.0.clone();
        let name = name.to_os_string();
        let value = value.to_vec();
        self.spawn("setxattr", async move {
            let name = try_reply!(reply, name_str(&name));
            if name.starts_with("system.") {
                reply.error(Errno::from_i32(libc::ENOTSUP));
                return;
            }
            let mode = if flags & libc::XATTR_CREATE != 0 {
                XattrMode::Create
            } else if flags & libc::XATTR_REPLACE != 0 {
                XattrMode::Replace
            } else {
                XattrMode::Any
            };
            let path = try_reply!(reply, fs.inodes.path(ino.0));
            fs.forget_absent_xattrs(ino.0);
            let result = fs.client.set_xattr(&path, name, &value, mode).await;
            fs.forget_absent_xattrs(ino.0);
            try_reply!(reply, result);
            fs.inodes.expire(ino.0);
            reply.ok();
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let fs = self.0.clone();
        // The kernel asks for security.capability before every write: a
        // known absence is answered here, without a task.
        if name.to_str().is_some_and(|n| fs.xattr_absent(ino.0, n)) {
            reply.error(Errno::from_i32(libc::ENODATA));
            return;
        }
        let name = name.to_os_string();
        self.spawn("getxattr", async move {
            let name = try_reply!(reply, name_str(&name));
            if name.starts_with("system.posix_acl") {
                reply.error(Errno::from_i32(libc::ENODATA));
                return;
            }
            let path = try_reply!(reply, fs.inodes.path(ino.0));
            match fs.client.get_xattr(&path, name).await {
                Ok(value) => xattr_reply(reply, size, &value),
                Err(e) => {
                    if matches!(e, FsError::NoData(_)) {
                        fs.remember_absent_xattr(ino.0, name);
                    }
                    reply.error(errno(&e));
                }
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let fs = self.0.clone();
        self.spawn("listxattr", async move {
            let path = try_reply!(reply, fs.inodes.path(ino.0));
            let names = try_reply!(reply, fs.client.list_xattr(&path).await);
            let mut out = Vec::new();
            for n in names {
                out.extend_from_slice(n.as_bytes());
                out.push(0);
            }
            xattr_reply(reply, size, &out);
        });
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let fs = self.0.clone();
        let name = name.to_os_string();
        self.spawn("removexattr", async move {
            let name = try_reply!(reply, name_str(&name));
            let path = try_reply!(reply, fs.inodes.path(ino.0));
            let result = fs.client.remove_xattr(&path, name).await;
            fs.forget_absent_xattrs(ino.0);
            try_reply!(reply, result);
            fs.inodes.expire(ino.0);
            reply.ok();
        });
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let fs = self.0.clone();
        let caller = Caller::of(req);
        self.spawn("access", async move {
            let attr = try_reply!(reply, fs.getattr(ino.0).await);
            if caller.may(&attr, mask.bits()) {
                reply.ok();
            } else {
                reply.error(Errno::from_i32(libc::EACCES));
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let new = NewRequest::of(req, parent, name, mode, umask);
        self.spawn_new(
            "create",
            new,
            NewKind::File,
            reply,
            move |fs, new, reply| open_created(fs, new, flags, reply),
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        // The kernel's own lseek applies (no SEEK_DATA/SEEK_HOLE knowledge of holes).
        reply.error(Errno::ENOSYS);
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if (size as usize) < value.len() {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(value);
    }
}

/// Attributes of nothing (a negative entry's).
pub(crate) fn empty_attr() -> Attr {
    Attr {
        ino: 0,
        kind: FileKind::File,
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        nlink: 0,
        symlink: None,
        block_size: 0,
        replicas: 0,
        parent: 0,
        storage: None,
        writing: None,
        ufs: None,
    }
}

impl Fs {
    /// A handle that wrote a file was released.
    fn release_writer(&self, w: &Arc<Writer>) {
        let _writers = self.writers.lock();
        if w.flags.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            w.close();
        }
    }
}

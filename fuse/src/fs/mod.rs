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
//! - Writes of a file go through its writer task (see [`write`](self::write));
//!   reads of a file with uncommitted writes too.
//! - Attributes the kernel gets of a file open for writing here include the
//!   writes not yet committed (size, mtime).
//! - What the cluster does not support answers with an errno that says so
//!   (ENOTSUP, EINVAL), never with wrong data.
//!
//! Layout: this module holds [`CurvineFs`], whose fuser callbacks each hand
//! over to the module of their concern: `attrs` (lookup, getattr, setattr,
//! readlink, statfs), `entries` (mknod, mkdir, symlink, create, link),
//! `names` (unlink, rmdir, rename), `files` (open, read, write, flush,
//! release), `passthrough`, `dirs` (opendir, readdir, readdirplus),
//! `xattrs`, `perms` (access, the chmod/chown/utimens rules), `init`; the
//! mount's state is [`Fs`] (declared here, kept by `state`), `write` runs
//! the writer tasks of files open for writing, `delegated` keeps the
//! directories the cluster delegated to the mount (lookups of new names and
//! creates answered here), and `replies` turns errors and attributes into
//! the kernel's terms.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, FileHandle, Filesystem, INodeNo, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use parking_lot::Mutex;

use curvine_client::io::FileReader;
use curvine_client::Client;
use curvine_conf::FuseConf;
use curvine_messages::SetAttr;

use crate::inodes::Inodes;

macro_rules! try_reply {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error($crate::fs::replies::errno(&e));
                return;
            }
        }
    };
}

mod acl;
mod attrs;
mod delegated;
mod dirs;
mod entries;
mod files;
mod init;
mod names;
mod passthrough;
mod perms;
mod replies;
mod stage;
mod state;
mod write;
mod xattrs;

pub use replies::{errno, io_error};

use dirs::DirHandleState;
use entries::NewRequest;
use write::Writer;

struct FileHandleState {
    ino: u64,
    writer: Option<Arc<Writer>>,
    /// The handle's reader and the inode generation it was opened at.
    reader: tokio::sync::Mutex<Option<(FileReader, u64)>>,
    /// Kept while the kernel reads the file through passthrough.
    backing: Option<Arc<fuser::BackingId>>,
    /// A FLUSH came (a descriptor of it was closed): its RELEASE, which the
    /// kernel sends after `close` returned, is likely on its way.
    flushed: std::sync::atomic::AtomicBool,
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
    /// Handles a program was started from (opens with `__FMODE_EXEC`),
    /// with their inode: see `files::open`.
    exec_handles: Mutex<HashMap<u64, u64>>,
    statfs: Mutex<Option<(Instant, (u64, u64))>>,
    entry_ttl: Duration,
    attr_ttl: Duration,
    negative_ttl: Duration,
    /// Passthrough was agreed with the kernel.
    passthrough: std::sync::atomic::AtomicBool,
    /// POSIX ACLs agreed with the kernel (`fuse.acl`).
    acl: std::sync::atomic::AtomicBool,
    /// Write-only handles bypass the kernel's page cache
    /// (`fuse.direct_writes`, agreed at init: see `init::direct_writes`).
    direct_writes: std::sync::atomic::AtomicBool,
    /// Tells the kernel when attributes it cached changed here.
    notifier: std::sync::OnceLock<fuser::Notifier>,
    /// Extended attributes found absent, with when (see `xattr_absent`).
    absent_xattrs: Mutex<HashMap<(u64, String), Instant>>,
    /// Locks of opens deciding on passthrough, by inode.
    open_locks: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
    /// Passthrough handles open per inode and the block files found.
    pt: passthrough::Passthrough,
    /// Sampled requests' traces.
    pub traces: Arc<crate::traces::FuseTraces>,
    /// Directories the cluster delegated to this mount.
    delegations: Arc<delegated::Delegations>,
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
        count_operation(op);
        let metrics = curvine_runtime::stats::process();
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

/// Counts a kernel request the mount answered (in a task or in place).
pub(super) fn count_operation(op: &'static str) {
    curvine_runtime::stats::process().add(
        "curvine_fuse_operations_total",
        "Kernel requests the FUSE mount answered, per operation.",
        &[("op", op)],
        1,
    );
}

impl Filesystem for CurvineFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        init::init(&self.0, config)
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        attrs::lookup(self, parent, name, reply)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.inodes.forget(ino.0, nlookup)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attrs::getattr(self, ino, reply)
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
        // What the kernel asks to change (`u32::MAX`: an owner or group
        // left as it is).
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid: uid.filter(|u| *u != u32::MAX),
            gid: gid.filter(|g| *g != u32::MAX),
            size,
            atime: atime.map(attrs::time_set),
            mtime: mtime.map(attrs::time_set),
        };
        attrs::setattr(self, req, ino, set, reply)
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        attrs::readlink(self, ino, reply)
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        entries::mknod(
            self,
            NewRequest::of(req, parent, name, mode, umask),
            rdev,
            reply,
        )
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
        entries::mkdir(self, NewRequest::of(req, parent, name, mode, umask), reply)
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        names::unlink(self, parent, name, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        names::rmdir(self, parent, name, reply)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        entries::symlink(self, req, parent, link_name, target, reply)
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
        names::rename(self, parent, name, newparent, newname, flags, reply)
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entries::link(self, ino, newparent, newname, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        files::open(self, req, ino, flags, reply)
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
        files::read(self, ino, fh, offset, size, reply)
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if wf.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.0.kill_suid_sgid_for_write(ino.0);
        }
        files::write(self, fh, offset, data, reply)
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        files::flush(self, fh, true, reply)
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        files::flush(self, fh, false, reply)
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
        files::release(self, ino, fh, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        dirs::opendir(self, ino, reply)
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        dirs::readdir(self, ino, fh, offset, reply)
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        dirs::readdirplus(self, ino, fh, offset, reply)
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        dirs::releasedir(self, fh, reply)
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        dirs::fsyncdir(self, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        attrs::statfs(self, reply)
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
        xattrs::setxattr(self, ino, name, value, flags, reply)
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattrs::getxattr(self, ino, name, size, reply)
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattrs::listxattr(self, ino, size, reply)
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        xattrs::removexattr(self, ino, name, reply)
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        perms::access(self, req, ino, mask, reply)
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
        entries::create(
            self,
            NewRequest::of(req, parent, name, mode, umask),
            flags,
            reply,
        )
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        files::fallocate(self, req, ino, offset, length, mode, reply)
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
        files::lseek(reply)
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        files::ioctl(reply)
    }
}

//! The mount's state (`Fs`, declared in the parent module with its handle
//! types), shared by the fuser threads and the tasks: the inode table, open
//! handles, writer tasks, open counts and commit generations per inode, the
//! kernel's TTLs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fuser::INodeNo;
use parking_lot::Mutex;

use curvine_client::Client;
use curvine_conf::FuseConf;
use curvine_messages::{Attr, FsError, FsResult};

use crate::inodes::Inodes;

use super::write::{self, Writer};
use super::{FileHandleState, Fs, Handle};

impl Fs {
    pub fn new(
        client: Client,
        conf: FuseConf,
        root: Attr,
        rt: tokio::runtime::Handle,
        traces: Arc<crate::traces::FuseTraces>,
    ) -> Fs {
        let inodes = Inodes::new(&conf.fs_path, root, conf.meta_cache_ttl.0);
        let delegations = Arc::new(super::delegated::Delegations::new(
            client.clone(),
            conf.delegations,
            conf.block_size.0,
        ));
        Fs {
            delegations,
            client,
            inodes,
            rt,
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            writers: Mutex::new(HashMap::new()),
            generations: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            exec_handles: Mutex::new(HashMap::new()),
            statfs: Mutex::new(None),
            entry_ttl: conf.entry_timeout.0,
            attr_ttl: conf.attr_timeout.0,
            negative_ttl: conf.negative_timeout.0,
            passthrough: std::sync::atomic::AtomicBool::new(false),
            acl: std::sync::atomic::AtomicBool::new(false),
            direct_writes: std::sync::atomic::AtomicBool::new(false),
            notifier: std::sync::OnceLock::new(),
            pt: Default::default(),
            open_locks: Mutex::new(HashMap::new()),
            absent_xattrs: Mutex::new(HashMap::new()),
            traces,
            conf,
        }
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

    /// The layout this mount asks for the files it creates, and for files
    /// it truncates to nothing (`--block-size`; zero: the cluster's).
    pub fn layout(&self) -> curvine_messages::block::FileSpec {
        curvine_messages::block::FileSpec {
            block_size: self.conf.block_size.0,
            ..Default::default()
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

    /// Another client changed a file (an open found its content newer than
    /// the attributes cached here): the cache takes the cluster's, and the
    /// kernel is told its own are stale (offset -1: its page cache stays).
    /// Its next read asks for them again (auto_inval_data), so it reads to
    /// the new size and drops the pages of the old content, instead of
    /// reading the new bytes up to the old size.
    pub(super) fn changed_elsewhere(&self, ino: u64, attr: Attr) {
        self.inodes.set_attr(ino, attr);
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }

    pub(super) fn generation(&self, ino: u64) -> u64 {
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

    pub(super) fn writer(&self, ino: u64) -> Option<Arc<Writer>> {
        self.writers.lock().get(&ino).cloned()
    }

    /// Attributes of an inode with this mount's uncommitted writes.
    pub(super) fn with_writes(&self, ino: u64, mut attr: Attr) -> Attr {
        if let Some(w) = self.writer(ino) {
            w.overlay(&mut attr);
        }
        attr
    }

    pub(super) fn open_count(&self, ino: u64) -> u32 {
        self.open.lock().get(&ino).copied().unwrap_or(0)
    }

    /// Open handles of `ino` once each of them was flushed (its
    /// descriptors closed) have been released, waiting up to `within`:
    /// the kernel sends a RELEASE after `close` returned, so an unlink
    /// right after a close would otherwise find the file still open.
    /// Read-only handles are opened without flushes: they give no sign,
    /// and one of them open means no wait. Returns the open count then.
    pub(super) async fn open_count_after_closes(
        &self,
        ino: u64,
        within: std::time::Duration,
    ) -> u32 {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let open = self.open_count(ino);
            if open == 0 || !self.all_flushed(ino) || tokio::time::Instant::now() >= deadline {
                return open;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Whether every open handle of `ino` was flushed at a close of its
    /// last descriptor and has not written since.
    fn all_flushed(&self, ino: u64) -> bool {
        self.handles.lock().values().all(|h| match &**h {
            Handle::File(f) if f.ino == ino => f.flushed.load(Ordering::SeqCst),
            _ => true,
        })
    }

    /// Whether what keeps `ino` busy here is only being closed: each of its
    /// handles flushed at a close (its RELEASE on the way), or none left
    /// while its writer task ends after the last one's release.
    pub(super) fn only_closing(&self, ino: u64) -> bool {
        self.all_flushed(ino)
    }

    /// A handle of an open file (writer and backing file when it has them).
    pub(super) fn add_file_handle(
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
            flushed: std::sync::atomic::AtomicBool::new(false),
        })))
    }

    pub(super) fn add_handle(&self, handle: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        if let Handle::File(f) = &handle {
            *self.open.lock().entry(f.ino).or_default() += 1;
            self.inodes.pin(f.ino);
        }
        self.handles.lock().insert(fh, Arc::new(handle));
        fh
    }

    pub(super) fn handle(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.handles
            .lock()
            .get(&fh)
            .cloned()
            .ok_or_else(|| FsError::InvalidArgument(format!("file handle {fh} is not open")))
    }
}

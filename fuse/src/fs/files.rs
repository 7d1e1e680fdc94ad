//! Open files: open, read, write, flush and fsync, release. Writes (and
//! reads of a file with uncommitted writes) go to the file's writer task;
//! reads of a block file of this host the handle has open are answered on
//! the fuser thread. fallocate extends files; lseek is the kernel's.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fuser::{
    Errno, FileHandle, FopenFlags, INodeNo, OpenAccMode, OpenFlags, ReplyData, ReplyEmpty,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyWrite, Request,
};

use curvine_client::io::FileReader;
use curvine_messages::{Attr, FileKind, FsError, FsResult};

use super::passthrough::ReadOpen;
use super::replies::errno;
use super::write::{self, Writer};
use super::CurvineFs;
use super::{Fs, Handle};

impl Fs {
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

    /// Reads up to `size` bytes at `off` through handle `fh`, handing them
    /// to `f` (from the reader's own chunk when it can: no copy).
    async fn read<R>(
        &self,
        ino: u64,
        fh: u64,
        off: u64,
        size: u32,
        f: impl FnOnce(&[u8]) -> R,
    ) -> FsResult<R> {
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
        // Sequential reads stream the block; random ones fetch their bytes.
        reader.pread_with(off, size as usize, f).await
    }

    /// Opens (or joins) the writer task of a file for a new handle.
    pub(super) fn join_writer(
        self: &Arc<Self>,
        ino: u64,
        owner: (u32, u32),
        opened: write::Opened,
    ) -> Arc<Writer> {
        let mut writers = self.writers.lock();
        if let Some(w) = writers.get(&ino) {
            w.flags.handles.fetch_add(1, Ordering::SeqCst);
            if !matches!(opened, write::Opened::No) {
                tracing::warn!(ino, "a file created while open for writing here");
            }
            return w.clone();
        }
        let size = match &opened {
            write::Opened::Now(w) => w.size(),
            write::Opened::Later(_) => 0,
            write::Opened::No => self.known_size(ino),
        };
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

    /// `FOPEN_DIRECT_IO` for a handle opened write-only with open flags
    /// `flags`, where direct writes were agreed at init: it cannot read or
    /// be mapped, so only its writes leave the page cache out (the kernel
    /// drops the cached pages of each write's range first).
    pub(super) fn direct_write_flag(&self, flags: i32) -> FopenFlags {
        let write_only = flags & libc::O_ACCMODE == libc::O_WRONLY;
        if write_only && self.direct_writes.load(Ordering::SeqCst) {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    /// A handle that wrote a file was released.
    fn release_writer(&self, w: &Arc<Writer>) {
        let _writers = self.writers.lock();
        if w.flags.handles.fetch_sub(1, Ordering::SeqCst) == 1 {
            w.close();
        }
    }
}

pub(super) fn open(
    cfs: &CurvineFs,
    req: &Request,
    ino: INodeNo,
    flags: OpenFlags,
    reply: ReplyOpen,
) {
    let fs = cfs.0.clone();
    let owner = (req.uid(), req.gid());
    let writes = flags.acc_mode() != OpenAccMode::O_RDONLY;
    let truncates = flags.0 & libc::O_TRUNC != 0;
    let exec = flags.0 & FMODE_EXEC != 0;
    // The kernel refuses to write a running program's file before it
    // sends a writing open, but an O_RDONLY|O_TRUNC open is checked after
    // it (with atomic O_TRUNC the kernel has emptied its cache of the
    // file by then): refused here instead, as the kernel would. (The
    // kernel's release of a program's handle comes just after the program
    // ends: this rare open may be refused in that moment.)
    if truncates && !writes && fs.executing(ino.0) {
        reply.error(Errno::from_i32(libc::ETXTBSY));
        return;
    }
    let caller = super::perms::Caller::of(req);
    let passthrough = fs.passthrough.load(Ordering::SeqCst);
    // A read-only open of a file whose attributes are cached is answered
    // here, without a hand-off to a task (the common case of reading
    // many small files).
    let reply = if !writes && !truncates {
        match open_now(&fs, ino.0, exec, passthrough, reply) {
            Some(reply) => reply,
            None => return,
        }
    } else {
        reply
    };
    cfs.spawn("open", async move {
        let ino = ino.0;
        let mut attr = try_reply!(reply, fs.getattr(ino).await);
        if attr.kind == FileKind::Dir {
            reply.error(Errno::from_i32(libc::EISDIR));
            return;
        }
        if truncates && !writes {
            // O_RDONLY|O_TRUNC empties the file as on Linux (the kernel,
            // told the open truncates, drops its cached size and pages).
            let set = curvine_messages::SetAttr {
                size: Some(0),
                ..Default::default()
            };
            attr = try_reply!(reply, fs.setattr(ino, caller, set).await);
        }
        // With passthrough, opens of one inode decide one at a time: the
        // kernel wants all of them on the same backing file, or none.
        let _decide = match passthrough {
            true => Some(fs.open_lock(ino).lock_owned().await),
            false => None,
        };
        if writes && passthrough && !fs.passthrough_closed(ino).await {
            // The kernel reads the file from its block file now, which is
            // never written in place (and takes no other open of it).
            reply.error(Errno::from_i32(libc::ETXTBSY));
            return;
        }
        let writer = if writes {
            let w = fs.join_writer(ino, owner, write::Opened::No);
            if flags.0 & libc::O_TRUNC != 0 {
                let emptied = match w.open_truncate().await {
                    // Emptied by anyone but root: set-user-ID and
                    // set-group-ID go (see `killed_suid_sgid`).
                    Ok(a) if caller.uid != 0 => fs.take_suid_sgid(ino, a).await,
                    other => other,
                };
                match emptied {
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
        if passthrough && writer.is_none() {
            let attr = fs.with_writes(ino, attr.clone());
            if let ReadOpen::Pass(backing, blocks) = fs.open_passthrough(ino, &attr, &reply).await {
                fs.opened_passthrough(ino, (backing, blocks), exec, reply);
                return;
            }
        }
        let fh = fs.add_file_handle(ino, writer, None);
        fs.note_exec(exec, fh, ino);
        let mut handle = fs.handle_flags(ino, &attr, writes);
        handle |= fs.direct_write_flag(flags.0);
        reply.opened(FileHandle(fh), handle);
    });
}

/// Answers a read-only open from cached attributes, in the calling
/// thread; gives the reply back when a task has to answer.
fn open_now(
    fs: &Arc<Fs>,
    ino: u64,
    exec: bool,
    passthrough: bool,
    reply: ReplyOpen,
) -> Option<ReplyOpen> {
    let Some(attr) = fs.inodes.fresh_attr(ino) else {
        return Some(reply);
    };
    if attr.kind == FileKind::Dir {
        return Some(reply);
    }
    let attr = fs.with_writes(ino, attr);
    // With passthrough, holds the inode's open lock until answered (one
    // deciding already sends this open to a task).
    let _decide = match passthrough {
        true => {
            let Ok(guard) = fs.open_lock(ino).try_lock_owned() else {
                return Some(reply);
            };
            match fs.open_passthrough_now(ino, &attr, &reply) {
                ReadOpen::Pass(backing, blocks) => {
                    fs.opened_passthrough(ino, (backing, blocks), exec, reply);
                    return None;
                }
                ReadOpen::Normal => {}
                ReadOpen::Ask => return Some(reply),
            }
            Some(guard)
        }
        false => None,
    };
    let fh = fs.add_file_handle(ino, None, None);
    fs.note_exec(exec, fh, ino);
    reply.opened(FileHandle(fh), fs.handle_flags(ino, &attr, false));
    None
}

impl Fs {
    /// The flags of a handle opened through the mount.
    fn handle_flags(&self, ino: u64, attr: &Attr, writes: bool) -> FopenFlags {
        let mut flags = self.open_flags(ino, attr);
        if writes {
            self.inodes.drop_cached(ino);
            flags.remove(FopenFlags::FOPEN_KEEP_CACHE);
        } else {
            // Closing a read-only handle has nothing to flush (locks
            // are the kernel's): no FLUSH request at each close.
            flags |= FopenFlags::FOPEN_NOFLUSH;
        }
        flags
    }
}

/// The kernel's `__FMODE_EXEC` in an open's flags: execve opening a program.
const FMODE_EXEC: i32 = 0x20;

impl Fs {
    /// Records handle `fh` of inode `ino` as a running program's when
    /// `exec`, before the open is answered (so any open that follows sees it).
    pub(super) fn note_exec(&self, exec: bool, fh: u64, ino: u64) {
        if exec {
            self.exec_handles.lock().insert(fh, ino);
        }
    }

    /// Whether a program runs from inode `ino` (a handle execve opened).
    fn executing(&self, ino: u64) -> bool {
        let handles = self.exec_handles.lock();
        !handles.is_empty() && handles.values().any(|&i| i == ino)
    }
}

pub(super) fn read(
    cfs: &CurvineFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: u64,
    size: u32,
    reply: ReplyData,
) {
    let fs = cfs.0.clone();
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
    cfs.spawn("read", async move {
        let mut reply = Some(reply);
        let answer = |data: &[u8]| {
            if let Some(reply) = reply.take() {
                reply.data(data);
            }
        };
        if let Err(e) = fs.read(ino.0, fh.0, offset, size, answer).await {
            tracing::warn!(ino = ino.0, offset, size, error = %e, "read failed");
            if let Some(reply) = reply.take() {
                reply.error(errno(&e));
            }
        }
    });
}

pub(super) fn write(cfs: &CurvineFs, fh: FileHandle, offset: u64, data: &[u8], reply: ReplyWrite) {
    let metrics = curvine_runtime::stats::process();
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
    let handle = match cfs.0.handle(fh.0) {
        Ok(h) => h,
        Err(e) => {
            reply.error(errno(&e));
            return;
        }
    };
    match &*handle {
        Handle::File(f) if f.writer.is_some() => {
            // Written after a close's flush (its other descriptors are
            // open): not being closed.
            if f.flushed.load(Ordering::Relaxed) {
                f.flushed.store(false, Ordering::SeqCst);
            }
            if let Some(w) = &f.writer {
                w.write(offset, data, reply)
            }
        }
        _ => reply.error(Errno::from_i32(libc::EBADF)),
    }
}

/// Also fsync (`closing` false): both commit the handle's writes.
pub(super) fn flush(cfs: &CurvineFs, fh: FileHandle, closing: bool, reply: ReplyEmpty) {
    let fs = cfs.0.clone();
    cfs.spawn("flush", async move {
        let handle = try_reply!(reply, fs.handle(fh.0));
        if let Handle::File(f) = &*handle {
            if closing {
                f.flushed.store(true, Ordering::SeqCst);
            }
            if let Some(w) = &f.writer {
                try_reply!(reply, w.commit().await);
            }
        }
        reply.ok();
    });
}

pub(super) fn release(cfs: &CurvineFs, ino: INodeNo, fh: FileHandle, reply: ReplyEmpty) {
    let fs = cfs.0.clone();
    let handle = fs.handles.lock().remove(&fh.0);
    fs.exec_handles.lock().remove(&fh.0);
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
            fs.passthrough_released(ino.0);
        }
    }
    reply.ok();
    if last && fs.inodes.is_hidden(ino.0) {
        cfs.spawn("release", async move {
            fs.released(ino.0).await;
            fs.inodes.unpin(ino.0);
        });
    } else {
        fs.inodes.unpin(ino.0);
    }
}

/// fallocate mode 0 (and `posix_fallocate`) extends a file to the end of
/// the range, as zeros; with `FALLOC_FL_KEEP_SIZE` nothing changes. No
/// space is set aside ahead of the writes (blocks take what is written),
/// and other modes (punching holes, zeroing, collapsing) are EOPNOTSUPP.
pub(super) fn fallocate(
    cfs: &CurvineFs,
    req: &Request,
    ino: INodeNo,
    offset: u64,
    length: u64,
    mode: i32,
    reply: ReplyEmpty,
) {
    if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
        reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        return;
    }
    let fs = cfs.0.clone();
    let caller = super::perms::Caller::of(req);
    cfs.spawn("fallocate", async move {
        let Some(end) = offset.checked_add(length).filter(|e| *e <= i64::MAX as u64) else {
            reply.error(Errno::from_i32(libc::EFBIG));
            return;
        };
        let attr = try_reply!(reply, fs.getattr(ino.0).await);
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > attr.size {
            let set = curvine_messages::SetAttr {
                size: Some(end),
                ..Default::default()
            };
            try_reply!(reply, fs.setattr(ino.0, caller, set).await);
        }
        reply.ok();
    });
}

/// No ioctl is a file system's own here: ENOTTY, as for a plain file
/// (Python asks `isatty` of every file it opens).
pub(super) fn ioctl(reply: ReplyIoctl) {
    reply.error(Errno::from_i32(libc::ENOTTY));
}

pub(super) fn lseek(reply: ReplyLseek) {
    // The kernel's own lseek applies (no SEEK_DATA/SEEK_HOLE knowledge of holes).
    reply.error(Errno::ENOSYS);
}

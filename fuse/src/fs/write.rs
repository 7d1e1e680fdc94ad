//! Writes through the mount: one writer task per file open for writing.
//!
//! Every handle of a file open for writing in this mount shares the file's
//! writer task; the task applies writes, reads of data not yet committed,
//! truncations and commits in the order the kernel sent them.
//!
//! - Sequential writes (from the start, at the end, or continuing the last
//!   write) stream into a [`FileWriter`]: no local copy.
//! - Any other write stages the file (`stage`): bytes wait in a sparse local file
//!   (`fuse.stage_dir`) with the ranges written, and a commit rewrites only
//!   the blocks they touch, from the old content and the staged bytes.
//! - A flush (each close), fsync, truncation or the last release commits:
//!   the new content becomes visible to every client (close-to-open).
//!
//! Invariants: a write is acknowledged to the kernel only after it is in the
//! FileWriter or the stage file; a commit error is reported by the flush or
//! fsync that asked for it; reads of a file with uncommitted writes go
//! through the task, so they see those writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use fuser::{ReplyData, ReplyWrite};
use tokio::sync::{mpsc, oneshot};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_messages::{Attr, FsError, FsResult, SetAttr, TimeSet};

use super::replies::errno;
use super::Fs;

/// Bytes of writes held ahead of a stream's position at most (see
/// [`Task::ahead`]): the kernel's writeback keeps up to 64 requests of up
/// to 1 MiB in flight.
const AHEAD_MAX: usize = 64 << 20;

pub enum WriteOp {
    Write {
        off: u64,
        data: Vec<u8>,
        reply: ReplyWrite,
    },
    Read {
        off: u64,
        size: u32,
        reply: ReplyData,
    },
    Commit {
        done: oneshot::Sender<FsResult<()>>,
    },
    Truncate {
        size: u64,
        done: oneshot::Sender<FsResult<Attr>>,
    },
    /// New attributes for the file (no size), set with the commit of the
    /// writes before them: times from the kernel's writeback cache, which
    /// sends its mtime while the writes are still arriving; mode, owner
    /// and times of a file this open created (see [`Flags::fresh`]).
    SetTimes {
        set: SetAttr,
        done: oneshot::Sender<FsResult<Attr>>,
    },
    /// An open with O_TRUNC: commit what is pending, then empty the file.
    OpenTruncate {
        done: oneshot::Sender<FsResult<Attr>>,
    },
    /// The last handle was released.
    Close,
}

/// What a writer task and the rest of the mount share about a file.
pub struct Flags {
    /// Writes queued and not yet applied.
    pending: AtomicU64,
    /// Other operations sent to the task and not yet taken by it.
    asked: AtomicU64,
    /// Writes applied and not yet committed.
    unsettled: AtomicBool,
    /// Size and mtime of the file as written here (valid while dirty).
    size: AtomicU64,
    mtime_ns: AtomicI64,
    /// The file was created by the open that started this writer and has
    /// not been committed since: its creation is not durable yet, so
    /// changes of its attributes go with its commit (tar and cp -a set
    /// owner, mode and times through the open file, then close it).
    fresh: AtomicBool,
    /// Attributes set here and held for the commit (see `SetTimes`), and
    /// when they were last changed (the file's ctime as the mount shows it).
    held: parking_lot::Mutex<Option<(SetAttr, i64)>>,
    /// Handles of this mount that hold the file open for writing.
    pub handles: AtomicU32,
}

/// What the mount's other parts see of a writer task.
pub struct Writer {
    tx: mpsc::UnboundedSender<WriteOp>,
    pub flags: Arc<Flags>,
    /// The task's state: the task holds it while it applies an operation;
    /// a fuser thread takes it for a write that needs no waiting.
    core: Arc<tokio::sync::Mutex<Task>>,
}

impl Writer {
    /// Whether the file has writes that other clients do not see yet.
    pub fn dirty(&self) -> bool {
        self.flags.pending.load(Ordering::SeqCst) > 0 || self.flags.unsettled.load(Ordering::SeqCst)
    }

    /// Whether attribute changes of the file wait for its commit (see
    /// [`Flags::fresh`]).
    pub fn fresh(&self) -> bool {
        self.flags.fresh.load(Ordering::SeqCst)
    }

    /// Size and mtime of the file with the uncommitted writes, and the
    /// attributes held for the commit.
    pub fn overlay(&self, attr: &mut Attr) {
        if self.dirty() {
            attr.size = self.flags.size.load(Ordering::SeqCst);
            attr.mtime_ns = self.flags.mtime_ns.load(Ordering::SeqCst);
            attr.ctime_ns = attr.ctime_ns.max(attr.mtime_ns);
        }
        if let Some((held, ctime_ns)) = self.flags.held.lock().as_ref() {
            apply_held(attr, held, *ctime_ns);
        }
    }

    /// Applies a write: at once when it continues a stream into a block
    /// file of this host and nothing is queued before it, else through the
    /// task (in order with what is queued).
    pub fn write(&self, off: u64, data: &[u8], reply: ReplyWrite) {
        if self.flags.pending.load(Ordering::SeqCst) == 0 {
            if let Ok(mut task) = self.core.try_lock() {
                if let Some(result) = task.write_now(off, data) {
                    match result {
                        Ok(()) => reply.written(data.len() as u32),
                        Err(e) => reply.error(errno(&e)),
                    }
                    return;
                }
            }
        }
        self.flags.pending.fetch_add(1, Ordering::SeqCst);
        let op = WriteOp::Write {
            off,
            data: data.to_vec(),
            reply,
        };
        if let Err(mpsc::error::SendError(op)) = self.tx.send(op) {
            self.flags.pending.fetch_sub(1, Ordering::SeqCst);
            if let WriteOp::Write { reply, .. } = op {
                reply.error(fuser::Errno::EIO);
            }
        }
    }

    pub fn read(&self, off: u64, size: u32, reply: ReplyData) {
        if let Err(mpsc::error::SendError(WriteOp::Read { reply, .. })) =
            self.tx.send(WriteOp::Read { off, size, reply })
        {
            reply.error(fuser::Errno::EIO);
        }
    }

    async fn ask<T>(
        &self,
        op: impl FnOnce(oneshot::Sender<FsResult<T>>) -> WriteOp,
    ) -> FsResult<T> {
        let (tx, rx) = oneshot::channel();
        self.flags.asked.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(op(tx)).is_err() {
            self.flags.asked.fetch_sub(1, Ordering::SeqCst);
            return Err(FsError::Io(TASK_ENDED.into()));
        }
        rx.await
            .map_err(|_| FsError::Io("the file's writer task ended before answering".into()))?
    }

    /// Commits the applied writes. With nothing queued before it, the
    /// caller's task commits itself (no hand-off to the writer task and
    /// back).
    pub async fn commit(&self) -> FsResult<()> {
        if self.flags.pending.load(Ordering::SeqCst) == 0
            && self.flags.asked.load(Ordering::SeqCst) == 0
        {
            if let Ok(mut task) = self.core.try_lock() {
                if !task.closed {
                    return task.commit().await;
                }
            }
        }
        self.ask(|done| WriteOp::Commit { done }).await
    }

    pub async fn truncate(&self, size: u64) -> FsResult<Attr> {
        self.ask(|done| WriteOp::Truncate { size, done }).await
    }

    /// Sets attributes (no size) with the commit of the queued writes.
    pub async fn set_times(&self, set: SetAttr) -> FsResult<Attr> {
        self.ask(|done| WriteOp::SetTimes { set, done }).await
    }

    pub async fn open_truncate(&self) -> FsResult<Attr> {
        self.ask(|done| WriteOp::OpenTruncate { done }).await
    }

    pub fn close(&self) {
        let _ = self.tx.send(WriteOp::Close);
    }
}

/// How a writer task starts.
pub enum Opened {
    /// Nothing open yet (an open of an existing file).
    No,
    /// A writer open already (a create).
    Now(Box<FileWriter>),
    /// A create this mount made in a directory it holds: the writer opens
    /// once the create's batch is back.
    Later(super::delegated::Created),
}

/// Starts the writer task of a file (FUSE inode `ino`).
pub fn start(fs: Arc<Fs>, ino: u64, owner: (u32, u32), opened: Opened, size: u64) -> Arc<Writer> {
    let (tx, rx) = mpsc::unbounded_channel();
    let flags = Arc::new(Flags {
        pending: AtomicU64::new(0),
        asked: AtomicU64::new(0),
        unsettled: AtomicBool::new(false),
        size: AtomicU64::new(size),
        mtime_ns: AtomicI64::new(curvine_messages::now_ns()),
        fresh: AtomicBool::new(!matches!(opened, Opened::No)),
        held: parking_lot::Mutex::new(None),
        handles: AtomicU32::new(1),
    });
    let task = Task {
        fs: fs.clone(),
        ino,
        owner,
        state: match opened {
            Opened::Now(w) => State::Stream(w),
            Opened::Later(created) => State::Pending(created),
            Opened::No => State::Idle,
        },
        shared: flags.clone(),
        failed: None,
        ahead: BTreeMap::new(),
        ahead_bytes: 0,
        times: None,
        closed: false,
    };
    fs.inodes.pin(ino);
    let core = Arc::new(tokio::sync::Mutex::new(task));
    tokio::spawn(run(core.clone(), rx));
    Arc::new(Writer { tx, flags, core })
}

/// The writer task: applies queued operations one at a time.
async fn run(core: Arc<tokio::sync::Mutex<Task>>, mut rx: mpsc::UnboundedReceiver<WriteOp>) {
    while let Some(op) = rx.recv().await {
        // Replies to writes and reads go out after the state is released,
        // so the kernel's next write can take the fast path.
        match op {
            WriteOp::Write { off, data, reply } => {
                let result = {
                    let mut task = core.lock().await;
                    let result = task.write(off, &data).await;
                    task.shared.pending.fetch_sub(1, Ordering::SeqCst);
                    if let Err(e) = &result {
                        tracing::warn!(ino = task.ino, off, len = data.len(), error = %e, "write failed");
                    }
                    result
                };
                match result {
                    Ok(n) => reply.written(n as u32),
                    Err(e) => reply.error(errno(&e)),
                }
            }
            WriteOp::Read { off, size, reply } => {
                tracing::debug!(off, size, "read of a file being written");
                let result = {
                    let mut task = core.lock().await;
                    let result = task.read(off, size).await;
                    if let Err(e) = &result {
                        tracing::warn!(ino = task.ino, off, size, error = %e, "read failed");
                    }
                    result
                };
                match result {
                    Ok(data) => reply.data(&data),
                    Err(e) => reply.error(errno(&e)),
                }
            }
            op => {
                let mut task = core.lock().await;
                if !matches!(op, WriteOp::Close) {
                    task.shared.asked.fetch_sub(1, Ordering::SeqCst);
                }
                if task.apply(op).await {
                    task.closed = true;
                    // Operations queued behind the last close (a truncate
                    // by path, say) are still answered; later senders are
                    // told the task ended and act without it.
                    rx.close();
                    while let Some(op) = rx.recv().await {
                        match op {
                            WriteOp::Write { reply, .. } => reply.error(fuser::Errno::EBADF),
                            WriteOp::Read { off, size, reply } => {
                                match task.read(off, size).await {
                                    Ok(data) => reply.data(&data),
                                    Err(e) => reply.error(errno(&e)),
                                }
                            }
                            WriteOp::Close => {}
                            op => {
                                task.apply(op).await;
                            }
                        }
                    }
                    return;
                }
            }
        }
    }
}

/// Whether an error says the writer task had ended (the file's last
/// handle was released meanwhile): the caller goes on without it.
pub fn ended(e: &FsError) -> bool {
    matches!(e, FsError::Io(m) if m == TASK_ENDED)
}

const TASK_ENDED: &str = "the file's writer task has ended";

enum State {
    Idle,
    /// Created here in a delegated directory; its batch is on its way.
    Pending(super::delegated::Created),
    Stream(Box<FileWriter>),
    Staged(Box<super::stage::Stage>),
}

struct Task {
    fs: Arc<Fs>,
    ino: u64,
    owner: (u32, u32),
    state: State,
    shared: Arc<Flags>,
    /// A write that failed after it was acknowledged cannot happen (writes
    /// are acknowledged when applied); this holds a commit failure of an
    /// implicit commit (a mode switch) until a flush reports it.
    failed: Option<FsError>,
    /// Writes that arrived ahead of the stream's position, by offset:
    /// disjoint, all beyond the position. The kernel sends several writes
    /// of a file at once (always with the writeback cache) and the fuser
    /// threads hand them over in any order; holding the early ones until
    /// the bytes before them arrive keeps a sequential writer streaming
    /// instead of staging.
    ahead: BTreeMap<u64, Vec<u8>>,
    ahead_bytes: usize,
    /// Times to set when the writes are next committed.
    times: Option<SetAttr>,
    /// The last close was applied: the task ends.
    closed: bool,
}

impl Task {
    /// Applies one operation; true when the task is done (last close).
    async fn apply(&mut self, op: WriteOp) -> bool {
        {
            match op {
                WriteOp::Write { .. } | WriteOp::Read { .. } => {
                    unreachable!("writes and reads are applied by the task loop")
                }
                WriteOp::Commit { done } => {
                    let _ = done.send(self.commit().await);
                }
                WriteOp::Truncate { size, done } => {
                    let _ = done.send(self.truncate(size).await);
                }
                WriteOp::OpenTruncate { done } => {
                    let _ = done.send(self.open_truncate().await);
                }
                WriteOp::SetTimes { set, done } => {
                    let _ = done.send(self.set_times(set).await);
                }
                WriteOp::Close => {
                    if let Err(e) = self.commit().await {
                        tracing::error!(ino = self.ino, error = %e, "the last close of a file could not commit its writes");
                    }
                    if self.fs.writer_done(self.ino, &self.shared) {
                        self.fs.inodes.unpin(self.ino);
                        return true;
                    }
                }
            }
        }
        false
    }

    /// A write applied without waiting (see [`Writer::write`]).
    fn write_now(&mut self, off: u64, data: &[u8]) -> Option<FsResult<()>> {
        let State::Stream(w) = &mut self.state else {
            return None;
        };
        if w.position() != off {
            return None;
        }
        let _runtime = self.fs.runtime().enter();
        let result = w.write_now(data)?;
        if result.is_err() {
            return Some(result);
        }
        // Held writes that now continue the stream, as far as they need no
        // waiting (the rest go with the next write or the commit).
        let mut drained = Ok(());
        while let Some(entry) = self.ahead.first_entry() {
            if *entry.key() != w.position() {
                break;
            }
            match w.write_now(entry.get()) {
                Some(Ok(())) => self.ahead_bytes -= entry.remove().len(),
                Some(Err(e)) => {
                    drained = Err(e);
                    break;
                }
                None => break,
            }
        }
        self.applied(off + data.len() as u64);
        if let Err(e) = drained {
            // This write is in; an earlier, acknowledged one is not: the
            // next flush reports it.
            self.failed = Some(e);
        }
        Some(Ok(()))
    }

    /// Records an applied write ending at `end`.
    fn applied(&self, end: u64) {
        let size = self.size().max(end);
        self.shared.size.store(size, Ordering::SeqCst);
        self.shared
            .mtime_ns
            .store(curvine_messages::now_ns(), Ordering::SeqCst);
        self.shared.unsettled.store(true, Ordering::SeqCst);
    }

    fn path(&self) -> FsResult<String> {
        self.fs.inodes.path(self.ino)
    }

    async fn open_writer(&self, truncate: bool) -> FsResult<FileWriter> {
        let options = WriteOptions {
            create: false,
            truncate,
            owner: Some(self.owner),
            // A file truncated to nothing takes the mount's layout.
            spec: self.fs.layout(),
            ..Default::default()
        };
        FileWriter::open(&self.fs.client, &self.path()?, &options).await
    }

    /// The size of the file with what this task applied.
    fn size(&self) -> u64 {
        match &self.state {
            State::Idle => self.fs.known_size(self.ino),
            State::Pending(_) => 0,
            State::Stream(w) => {
                let held = self.ahead.last_key_value();
                w.size().max(held.map_or(0, |(k, v)| k + v.len() as u64))
            }
            State::Staged(s) => s.size,
        }
    }

    /// Holds a write that lands beyond the stream's position, if it fits
    /// the window and overlaps nothing held; true when held.
    fn hold(&mut self, off: u64, data: &[u8]) -> bool {
        let State::Stream(w) = &self.state else {
            return false;
        };
        let end = off + data.len() as u64;
        if off <= w.position() || data.is_empty() || self.ahead_bytes + data.len() > AHEAD_MAX {
            return false;
        }
        let before = self.ahead.range(..end).next_back();
        if before.is_some_and(|(k, v)| k + v.len() as u64 > off) {
            return false;
        }
        self.ahead.insert(off, data.to_vec());
        self.ahead_bytes += data.len();
        true
    }

    /// Writes held writes that continue the stream; with `all`, every held
    /// write, in offset order (the gaps before them stay holes).
    async fn drain(&mut self, all: bool) -> FsResult<()> {
        let State::Stream(w) = &mut self.state else {
            return Ok(());
        };
        while let Some(entry) = self.ahead.first_entry() {
            let off = *entry.key();
            if off != w.position() {
                if !all {
                    break;
                }
                w.seek(off).await?;
            }
            let data = entry.remove();
            self.ahead_bytes -= data.len();
            w.write(&data).await?;
        }
        Ok(())
    }

    /// Opens the writer of a file created in a delegated directory once
    /// its create is back; a create that failed fails this and the next
    /// commit.
    async fn settle(&mut self) -> FsResult<()> {
        let State::Pending(created) = &self.state else {
            return Ok(());
        };
        let opened = match created.answer().await {
            Ok(open) => {
                let options = WriteOptions {
                    create: true,
                    owner: Some(self.owner),
                    spec: self.fs.layout(),
                    ..Default::default()
                };
                FileWriter::opened(&self.fs.client, &self.path()?, &options, open).await
            }
            Err(e) => Err(e),
        };
        match opened {
            Ok(w) => {
                self.state = State::Stream(Box::new(w));
                Ok(())
            }
            Err(e) => {
                self.state = State::Idle;
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Applies a write; returns how many of its bytes were taken: all, or
    /// fewer when the cluster had room for only those (a short write, as a
    /// full disk gives; the kernel's next write of the rest gets ENOSPC).
    async fn write(&mut self, off: u64, data: &[u8]) -> FsResult<usize> {
        if let State::Pending(created) = &self.state {
            created.writing();
        }
        self.settle().await?;
        let end = off + data.len() as u64;
        if self.hold(off, data) {
            self.applied(end);
            return Ok(data.len());
        }
        // A write at the position that reaches no held write streams on;
        // any other goes after what is held.
        let streams_on = matches!(&self.state, State::Stream(w) if w.position() == off)
            && self.ahead.range(..end).next().is_none();
        if !self.ahead.is_empty() && !streams_on {
            tracing::debug!(
                ino = self.ino,
                off,
                len = data.len(),
                held = self.ahead.len(),
                "a write the window cannot hold"
            );
            // Not a write the window can take (it overlaps held writes, or
            // lands before the position): what is held goes first, in the
            // order it arrived before this write.
            if let Err(e) = self.drain(true).await {
                self.failed = Some(e.clone());
                return Err(e);
            }
        }
        let sequential = match &self.state {
            State::Idle | State::Pending(_) => off == 0 || off >= self.fs.known_size(self.ino),
            State::Stream(w) => w.position() == off,
            State::Staged(_) => false,
        };
        if sequential {
            if matches!(self.state, State::Idle) {
                let mut w = self.open_writer(false).await?;
                let known = self.fs.known_size(self.ino);
                tracing::debug!(ino = self.ino, off, known, "a stream starts");
                if off > known {
                    // Beyond the end: the stream starts at the end and holds
                    // this write, in case the bytes before it are on their way.
                    w.seek(known).await?;
                    self.state = State::Stream(Box::new(w));
                    if self.hold(off, data) {
                        self.applied(end);
                        return Ok(data.len());
                    }
                    if let State::Stream(w) = &mut self.state {
                        w.seek(off).await?;
                    }
                } else {
                    if off != 0 {
                        w.seek(off).await?;
                    }
                    self.state = State::Stream(Box::new(w));
                }
            }
            if let State::Stream(w) = &mut self.state {
                let n = w.write_some(data).await?;
                if n < data.len() {
                    self.applied(off + n as u64);
                    return Ok(n);
                }
            }
            if let Err(e) = self.drain(false).await {
                // This write is in; an earlier, acknowledged one held
                // ahead of it is not: the next flush reports it.
                self.failed = Some(e);
            }
        } else {
            if let State::Stream(w) = &self.state {
                tracing::debug!(
                    ino = self.ino,
                    off,
                    len = data.len(),
                    position = w.position(),
                    "a write away from the stream: staging"
                );
                // A write elsewhere: what streamed so far is committed, the
                // rest is staged.
                if let Err(e) = self.commit_state().await {
                    self.failed = Some(e.clone());
                    return Err(e);
                }
            }
            if matches!(self.state, State::Idle) {
                let stage = super::stage::Stage::new(&self.fs, &self.path()?).await?;
                self.state = State::Staged(Box::new(stage));
            }
            if let State::Staged(s) = &mut self.state {
                s.write(off, data)?;
            }
        }
        self.applied(end);
        Ok(data.len())
    }

    async fn read(&mut self, off: u64, size: u32) -> FsResult<Vec<u8>> {
        self.settle().await?;
        if matches!(self.state, State::Stream(_)) {
            self.commit_state().await?;
        }
        match &mut self.state {
            State::Staged(s) => {
                let len = (size as u64).min(s.size.saturating_sub(off));
                let mut buf = vec![0u8; len as usize];
                s.read(off, &mut buf).await?;
                Ok(buf)
            }
            _ => {
                let mut reader = FileReader::open(&self.fs.client, &self.path()?).await?;
                let len = (size as u64).min(reader.size().saturating_sub(off));
                let mut buf = vec![0u8; len as usize];
                let n = reader.read_full_at(off, &mut buf).await?;
                buf.truncate(n);
                Ok(buf)
            }
        }
    }

    /// Makes every applied write visible; reports an earlier implicit
    /// commit's failure once.
    async fn commit(&mut self) -> FsResult<()> {
        let result = self.commit_state().await;
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        result
    }

    async fn commit_state(&mut self) -> FsResult<()> {
        self.shared.fresh.store(false, Ordering::SeqCst);
        if let State::Pending(created) = &self.state {
            // Nothing written yet (a write would have settled it): the
            // file may go as a complete, empty one with its create.
            if self.times.is_none() && self.fs.delegations.close_empty(created) {
                let answer = created.answer().await;
                self.state = State::Idle;
                let open = answer?;
                self.fs.committed(self.ino, Some(open.attr));
                return Ok(());
            }
        }
        if let Err(e) = self.settle().await {
            self.failed = None;
            return Err(e);
        }
        if !self.ahead.is_empty() {
            tracing::debug!(
                ino = self.ino,
                held = self.ahead.len(),
                "commit with writes held ahead"
            );
        }
        let drained = self.drain(true).await;
        if let Err(e) = &drained {
            self.ahead.clear();
            self.ahead_bytes = 0;
            // A held write the cluster had no room for is reported once
            // what was written before it is committed; any other failure
            // leaves the file as it was.
            if !matches!(e, FsError::NoSpace(_)) {
                let _ = std::mem::replace(&mut self.state, State::Idle);
                return drained;
            }
        }
        let state = std::mem::replace(&mut self.state, State::Idle);
        let mut held = self.times.take();
        let attr = match state {
            State::Idle | State::Pending(_) => {
                // Attributes held across a failed commit go with it.
                *self.shared.held.lock() = None;
                return Ok(());
            }
            // The held attributes go in the close's own commit.
            State::Stream(w) => w.close_with(held.take()).await,
            State::Staged(mut s) => match s.commit(&self.fs, &self.path()?, self.owner).await {
                // No room for them now: the staged writes stay for the
                // next commit (a flush or fsync once room is made).
                Err(e @ FsError::NoSpace(_)) => {
                    self.state = State::Staged(s);
                    self.times = held;
                    return Err(e);
                }
                attr => attr,
            },
        };
        self.shared.unsettled.store(false, Ordering::SeqCst);
        let attr = match (attr, held) {
            (Ok(_), Some(set)) => self.send_times(set).await,
            (attr, _) => attr,
        };
        *self.shared.held.lock() = None;
        self.fs.committed(self.ino, attr.as_ref().ok().cloned());
        drained.and(attr.map(|_| ()))
    }

    async fn send_times(&self, set: SetAttr) -> FsResult<Attr> {
        self.fs
            .client
            .call(curvine_messages::rpc::SetAttrs {
                path: self.path()?,
                set,
                follow: false,
            })
            .await
    }

    /// Attributes set while writes are pending go with their commit; with
    /// none pending, at once. A later change of one attribute replaces an
    /// earlier one (the mount computed each whole, set-ID bits included).
    async fn set_times(&mut self, set: SetAttr) -> FsResult<Attr> {
        if matches!(self.state, State::Idle) {
            let attr = self.send_times(set).await?;
            self.fs.committed(self.ino, Some(attr.clone()));
            return Ok(attr);
        }
        let now = |t: Option<TimeSet>| match t {
            Some(TimeSet::Now) => Some(TimeSet::Ns(curvine_messages::now_ns())),
            t => t,
        };
        let (atime, mtime) = (now(set.atime), now(set.mtime));
        let merged = match self.times.take() {
            Some(old) => SetAttr {
                mode: set.mode.or(old.mode),
                uid: set.uid.or(old.uid),
                gid: set.gid.or(old.gid),
                size: None,
                atime: atime.or(old.atime),
                mtime: mtime.or(old.mtime),
            },
            None => SetAttr {
                size: None,
                atime,
                mtime,
                ..set
            },
        };
        if let Some(TimeSet::Ns(ns)) = merged.mtime {
            self.shared.mtime_ns.store(ns, Ordering::SeqCst);
        }
        let ctime_ns = curvine_messages::now_ns();
        *self.shared.held.lock() = Some((merged.clone(), ctime_ns));
        self.times = Some(merged);
        let mut attr = self
            .fs
            .inodes
            .attr(self.ino)
            .ok_or_else(|| FsError::Stale(format!("inode {} is gone", self.ino)))?;
        attr.size = self.size();
        attr.mtime_ns = self.shared.mtime_ns.load(Ordering::SeqCst);
        if let Some(held) = self.times.as_ref() {
            apply_held(&mut attr, held, ctime_ns);
        }
        Ok(attr)
    }

    async fn truncate(&mut self, size: u64) -> FsResult<Attr> {
        self.commit_state().await?;
        let path = self.path()?;
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        let attr = self
            .fs
            .client
            .call(curvine_messages::rpc::SetAttrs {
                path,
                set,
                follow: false,
            })
            .await?;
        self.fs.committed(self.ino, Some(attr.clone()));
        Ok(attr)
    }

    async fn open_truncate(&mut self) -> FsResult<Attr> {
        self.commit_state().await?;
        let w = self.open_writer(true).await?;
        let attr = w.attr.clone();
        self.state = State::Stream(Box::new(w));
        self.shared.size.store(0, Ordering::SeqCst);
        self.shared
            .mtime_ns
            .store(curvine_messages::now_ns(), Ordering::SeqCst);
        self.shared.unsettled.store(true, Ordering::SeqCst);
        self.fs.committed(self.ino, Some(attr.clone()));
        Ok(attr)
    }
}

/// Attributes held for a commit, over the file's attributes.
/// (Held times are never `Now`: the hold made them instants.)
fn apply_held(attr: &mut Attr, held: &SetAttr, ctime_ns: i64) {
    attr.ctime_ns = attr.ctime_ns.max(ctime_ns);
    attr.apply(held, ctime_ns);
}

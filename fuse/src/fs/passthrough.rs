//! Passthrough (Linux 6.9+, CAP_SYS_ADMIN; on by default): a read-only
//! open of a file whose bytes are in one file on this host (the block file
//! of a one-block file, or the extent file the node laid a file's blocks
//! out in) has the kernel read that file itself, with no request to the
//! mount per read. A file whose blocks are all here but each in its own
//! file is read through the mount while the node lays them out in an
//! extent file (asked once, in the background); opens after that pass.
//! A file whose blocks are on other nodes, opened a second time, has the
//! node copy them here into such a file (`fuse.local_copies`): a file read
//! once costs no second copy in the cluster's memory.
//!
//! The kernel's rules, which every open here keeps: while an inode has
//! passthrough handles open, every open of it must pass through to the
//! same backing file, and while it has handles that use the page cache none
//! may pass through (either open fails with EIO). So opens of an inode
//! decide one at a time (`open_lock`), and later readers share the open
//! backing file. Block files are never written in place, so an open for
//! writing waits up to [`RELEASE_GRACE`] for the passthrough handles to be
//! released, then fails with ETXTBSY; a reader opening after another
//! client changed the file, while older passthrough handles are open,
//! shares their content (one whole older version) until they close. A
//! read-only open that finds the file's writing handles all closed but
//! not yet released waits up to [`CLOSE_SETTLE`] for their release, so a
//! read right after a write passes through.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use curvine_messages::block::BlockId;
use curvine_messages::Attr;
use fuser::{BackingId, ReplyOpen};
use parking_lot::Mutex;

use super::Fs;

use crate::inodes::{content_version as version, ContentVersion as Version};

/// How long an open for writing waits for passthrough handles being
/// closed before it is refused with ETXTBSY.
const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// How long a read-only open waits for the release of handles whose
/// descriptors were all closed (short: a handle flushed at the close of
/// one descriptor may still write through another, as a shell's
/// redirection leaves it).
const CLOSE_SETTLE: Duration = Duration::from_millis(100);

/// How long an open trusts that a file found not passable (several
/// blocks, not on this host) stays so without asking the cluster again:
/// blocks cached here since then are passed through after this.
const NOT_PASSABLE_TTL: Duration = Duration::from_secs(2);

/// How long a file the node could not copy here (no tier with room for
/// it, say) is read through the mount before it is asked again.
const COPY_RETRY: Duration = Duration::from_secs(60);

/// Files remembered at most (cleared beyond).
const MAX_FOUND: usize = 1 << 16;

/// How long the blocks of passthrough opens are gathered before the node
/// is told they were read (one request per this at most).
const TOUCH_EVERY: Duration = Duration::from_secs(1);

/// Why an open did not pass through: the `result` label of
/// `curvine_fuse_passthrough_opens_total` and the log's reason.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Fallback {
    /// The file is empty: no block to pass through.
    Empty,
    /// The file is smaller than `fuse.passthrough_min_size`.
    Small,
    /// The file's blocks do not cover it end to end (a hole or a cut
    /// block), so no one file holds it at its offsets.
    SeveralBlocks,
    /// The file's blocks are here, each in its own file: the node is
    /// asked to lay them out in one extent file.
    Assembling,
    /// The file's block is not kept on this host.
    NotLocal,
    /// The file's blocks are on other nodes and it was opened before: the
    /// node of this host is asked to copy them here (`fuse.local_copies`).
    Copying,
    /// The file is open for writing through this mount.
    BeingWritten,
    /// Other handles of the file use the page cache.
    CachedHandles,
    /// The cluster could not say where the block is, or the block file
    /// could not be opened.
    Lookup,
    /// The kernel refused the backing file.
    Refused,
}

impl Fallback {
    fn label(self) -> &'static str {
        match self {
            Fallback::Empty => "empty",
            Fallback::Small => "small",
            Fallback::SeveralBlocks => "several_blocks",
            Fallback::Assembling => "assembling",
            Fallback::NotLocal => "not_local",
            Fallback::Copying => "copying",
            Fallback::BeingWritten => "being_written",
            Fallback::CachedHandles => "cached_handles",
            Fallback::Lookup => "lookup_failed",
            Fallback::Refused => "refused",
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Fallback::Empty => "the file is empty",
            Fallback::Small => {
                "it is smaller than fuse.passthrough_min_size (its warm reads hit the page cache)"
            }
            Fallback::SeveralBlocks => {
                "its blocks do not cover it end to end (the kernel takes one backing file)"
            }
            Fallback::Assembling => {
                "its blocks are each in a file of their own; the node is laying them out in one (later opens pass through)"
            }
            Fallback::NotLocal => "its blocks are not all kept on this host",
            Fallback::Copying => {
                "its blocks are on other nodes and it was opened before; the node of this host is copying them here (later opens pass through)"
            }
            Fallback::BeingWritten => "it is open for writing through this mount",
            Fallback::CachedHandles => "other handles of it use the page cache",
            Fallback::Lookup => "its block could not be found or opened",
            Fallback::Refused => "the kernel refused the block file as a backing file",
        }
    }
}

/// Passthrough handles of an inode open now, sharing one backing file.
pub(super) struct Shared {
    count: u32,
    backing: Arc<BackingId>,
    version: Version,
    /// The blocks the backing file holds.
    blocks: Blocks,
}

/// The ids of a file's blocks.
pub(super) type Blocks = Arc<[BlockId]>;

/// What opens found of each file: its block file (and the blocks in it),
/// or why it cannot pass.
#[derive(Clone)]
enum Found {
    Block(Version, PathBuf, Blocks),
    NotPassable(Version, Fallback, Instant),
}

/// The mount's passthrough state.
#[derive(Default)]
pub(super) struct Passthrough {
    /// Handles open per inode and the backing file they share.
    shared: Mutex<HashMap<u64, Shared>>,
    /// Block files (or reasons) found per inode.
    found: Arc<Mutex<HashMap<u64, Found>>>,
    /// Inodes whose blocks the node is laying out in an extent file.
    assembling: Arc<Mutex<std::collections::HashSet<u64>>>,
    /// Inodes the node could not copy here, and when (not asked again
    /// for [`COPY_RETRY`]).
    copy_failed: Arc<Mutex<HashMap<u64, Instant>>>,
    /// Fallback reasons already logged at info (later ones go to debug).
    logged: Mutex<Vec<Fallback>>,
    /// Blocks read through passthrough handles that the node has not
    /// been told of yet (see [`Fs::note_read`]).
    touched: Arc<Mutex<Touched>>,
}

#[derive(Default)]
struct Touched {
    /// Blocks read, with how many opens read each (the node counts the
    /// bytes read through passthrough from them).
    ids: std::collections::HashMap<BlockId, u32>,
    /// A request telling the node is on its way.
    scheduled: bool,
}

/// What an open of a file for reading does.
pub(super) enum ReadOpen {
    /// Pass through this backing file, which holds these blocks (counted
    /// among the inode's handles: answer with [`Fs::opened_passthrough`]).
    Pass(Arc<BackingId>, Blocks),
    /// Read through the mount.
    Normal,
    /// The fast path cannot tell without asking the cluster.
    Ask,
}

impl Fs {
    /// The lock under which opens of an inode choose passthrough or not.
    pub(super) fn open_lock(&self, ino: u64) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.open_locks.lock();
        if locks.len() > 4096 {
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        locks.entry(ino).or_default().clone()
    }

    /// Passthrough handles of an inode open now.
    pub(super) fn passthrough_open(&self, ino: u64) -> u32 {
        self.pt
            .shared
            .lock()
            .get(&ino)
            .map(|s| s.count)
            .unwrap_or(0)
    }

    /// A read-only open decided without asking the cluster, under the
    /// inode's open lock: passes through when the file's block file is
    /// known for this content (or its passthrough handles are open), says
    /// `Normal` when the file is known not to pass, else `Ask`.
    pub(super) fn open_passthrough_now(
        &self,
        ino: u64,
        attr: &Attr,
        reply: &ReplyOpen,
    ) -> ReadOpen {
        let v = version(attr);
        if let Some(done) = self.share_backing(ino, v) {
            return done;
        }
        if attr.size > 0 && attr.size < self.conf.passthrough_min_size.0 {
            self.count(Fallback::Small);
            return ReadOpen::Normal;
        }
        let found = self.pt.found.lock().get(&ino).cloned();
        match found {
            Some(Found::Block(fv, path, blocks)) if fv == v => {
                if let Some(why) = self.busy(ino) {
                    if self.only_closing(ino) {
                        // Worth waiting for (in a task): see `settle_closes`.
                        return ReadOpen::Ask;
                    }
                    return self.fall_back(ino, None, why);
                }
                match std::fs::File::open(&path) {
                    Ok(file) => self.pass(ino, (v, blocks), &file, reply, None),
                    // Moved to another tier or evicted: ask again.
                    Err(_) => ReadOpen::Ask,
                }
            }
            Some(Found::NotPassable(fv, why, at)) if fv == v && at.elapsed() < NOT_PASSABLE_TTL => {
                if self.copies_now(ino, why) {
                    // Opened again: worth a copy here (the path is looked
                    // up only when no copy is under way already).
                    let asked = self.pt.assembling.lock().contains(&ino);
                    if !asked {
                        if let Ok(path) = self.inodes.path(ino) {
                            self.assemble(ino, &path, true);
                        }
                    }
                    self.count(Fallback::Copying);
                } else {
                    self.count(why);
                }
                ReadOpen::Normal
            }
            _ => ReadOpen::Ask,
        }
    }

    /// A read-only open that asks the cluster where the file's block is
    /// when what it knows does not tell (under the inode's open lock).
    pub(super) async fn open_passthrough(
        &self,
        ino: u64,
        attr: &Attr,
        reply: &ReplyOpen,
    ) -> ReadOpen {
        self.settle_closes(ino).await;
        match self.open_passthrough_now(ino, attr, reply) {
            ReadOpen::Ask => {}
            decided => return decided,
        }
        let Ok(path) = self.inodes.path(ino) else {
            return self.fall_back(ino, None, Fallback::Lookup);
        };
        if let Some(why) = self.busy(ino) {
            return self.fall_back(ino, Some(&path), why);
        }
        let (fv, block, ids) = match self.client.blocks(&path).await {
            Ok(b) => {
                let fv = version(&b.attr);
                if fv != version(attr) {
                    self.changed_elsewhere(ino, b.attr.clone());
                }
                (fv, block_file(&b), block_ids(&b))
            }
            Err(_) => return self.fall_back(ino, Some(&path), Fallback::Lookup),
        };
        let file = match block {
            Ok(p) => {
                self.remember(ino, Found::Block(fv, p.clone(), ids.clone()));
                std::fs::File::open(&p).map_err(|_| Fallback::Lookup)
            }
            Err(why) => {
                let before = self.pt.found.lock().get(&ino).cloned();
                self.remember(ino, Found::NotPassable(fv, why, Instant::now()));
                let again = matches!(before, Some(Found::NotPassable(bv, Fallback::NotLocal, _)) if bv == fv);
                if why == Fallback::Assembling {
                    self.assemble(ino, &path, false);
                    Err(why)
                } else if again && self.copies_now(ino, why) {
                    // A second open of a file of other nodes' blocks.
                    self.assemble(ino, &path, true);
                    Err(Fallback::Copying)
                } else {
                    Err(why)
                }
            }
        };
        match file {
            Ok(file) => self.pass(ino, (fv, ids), &file, reply, Some(&path)),
            Err(why) => self.fall_back(ino, Some(&path), why),
        }
    }

    /// Why handles of `ino` open now keep a new one from passing through
    /// (with no passthrough handle open).
    fn busy(&self, ino: u64) -> Option<Fallback> {
        if self.writer(ino).is_some() {
            Some(Fallback::BeingWritten)
        } else if self.open_count(ino) > 0 {
            Some(Fallback::CachedHandles)
        } else {
            None
        }
    }

    /// Shares the inode's open backing file when there is one (the
    /// kernel takes no other open of the inode meanwhile).
    fn share_backing(&self, ino: u64, v: Version) -> Option<ReadOpen> {
        let mut shared = self.pt.shared.lock();
        let s = shared.get_mut(&ino)?;
        s.count += 1;
        let (backing, blocks, older) = (s.backing.clone(), s.blocks.clone(), s.version != v);
        drop(shared);
        if older {
            self.count_result("older_content");
            tracing::debug!(
                ino,
                "passthrough: the file changed in the cluster while passthrough readers have it open; this open shares their content"
            );
        }
        Some(ReadOpen::Pass(backing, blocks))
    }

    /// Waits up to [`CLOSE_SETTLE`] while what keeps `ino` busy is only
    /// being closed: the kernel sends the RELEASE of a closed file after
    /// `close` returned, so a read right after a write (`cp` then a
    /// checksum, a checkpoint read back) can reach the mount before it and
    /// would read through the mount instead of passing through.
    async fn settle_closes(&self, ino: u64) {
        let until = Instant::now() + CLOSE_SETTLE;
        while self.busy(ino).is_some() && self.only_closing(ino) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Whether no passthrough handle of `ino` is open, waiting up to
    /// [`RELEASE_GRACE`] for those being closed: the kernel sends the
    /// release of a closed file without waiting for it, so an open that
    /// follows a `close` can reach the mount first.
    pub(super) async fn passthrough_closed(&self, ino: u64) -> bool {
        let until = Instant::now() + RELEASE_GRACE;
        while self.passthrough_open(ino) > 0 {
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        true
    }

    /// Registers `file` with the kernel as the inode's backing file and
    /// answers the open through it.
    fn pass(
        &self,
        ino: u64,
        (v, blocks): (Version, Blocks),
        file: &std::fs::File,
        reply: &ReplyOpen,
        path: Option<&str>,
    ) -> ReadOpen {
        let backing = match reply.open_backing(file) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                tracing::debug!(ino, error = %e, "the kernel refused a backing file");
                return self.fall_back(ino, path, Fallback::Refused);
            }
        };
        self.pt.shared.lock().insert(
            ino,
            Shared {
                count: 1,
                backing: backing.clone(),
                version: v,
                blocks: blocks.clone(),
            },
        );
        ReadOpen::Pass(backing, blocks)
    }

    /// Answers an open with the backing file [`ReadOpen::Pass`] gave.
    pub(super) fn opened_passthrough(
        &self,
        ino: u64,
        (backing, blocks): (Arc<BackingId>, Blocks),
        exec: bool,
        reply: ReplyOpen,
    ) {
        self.count_result("passthrough");
        self.note_read(&blocks);
        let fh = self.add_file_handle(ino, None, Some(backing.clone()));
        self.note_exec(exec, fh, ino);
        // Page-cache flags do not go with passthrough; closing a read-only
        // handle has nothing to flush (no FLUSH request at each close).
        reply.opened_passthrough(
            fuser::FileHandle(fh),
            fuser::FopenFlags::FOPEN_NOFLUSH,
            &backing,
        );
    }

    /// Counts and logs an open that does not pass through: the first of
    /// each reason at info, the others at debug.
    fn fall_back(&self, ino: u64, path: Option<&str>, why: Fallback) -> ReadOpen {
        self.count(why);
        let first = {
            let mut logged = self.pt.logged.lock();
            let first = !logged.contains(&why);
            if first {
                logged.push(why);
            }
            first
        };
        if !first && !tracing::enabled!(tracing::Level::DEBUG) {
            return ReadOpen::Normal;
        }
        let path = path
            .map(str::to_string)
            .or_else(|| self.inodes.path(ino).ok())
            .unwrap_or_default();
        if first {
            tracing::info!(
                path = %curvine_messages::names::shown(&path),
                "passthrough: read through the mount because {} (further opens for this reason are logged at debug)",
                why.reason()
            );
        } else {
            tracing::debug!(path = %curvine_messages::names::shown(&path), "passthrough: read through the mount because {}", why.reason());
        }
        ReadOpen::Normal
    }

    fn count(&self, why: Fallback) {
        self.count_result(why.label());
    }

    fn count_result(&self, result: &'static str) {
        curvine_runtime::stats::process().add(
            "curvine_fuse_passthrough_opens_total",
            "Read-only opens with passthrough agreed, by result: passthrough, or why the file was read through the mount.",
            &[("result", result)],
            1,
        );
    }

    fn remember(&self, ino: u64, found: Found) {
        remember(&self.pt.found, ino, found);
    }

    /// Whether a file found not passable for `why` is copied here when
    /// opened again: its blocks are on other nodes, and `fuse.local_copies`.
    /// (Not for [`COPY_RETRY`] after the node could not.)
    fn copies_now(&self, ino: u64, why: Fallback) -> bool {
        why == Fallback::NotLocal
            && self.conf.local_copies
            && self
                .pt
                .copy_failed
                .lock()
                .get(&ino)
                .is_none_or(|at| at.elapsed() >= COPY_RETRY)
    }

    /// Asks the node, in the background, to lay the blocks of `path` out
    /// in one extent file (with `copy`, copying those on other nodes here
    /// first); once it has, the file's next open passes through to it.
    /// One request per file at a time.
    fn assemble(&self, ino: u64, path: &str, copy: bool) {
        if !self.pt.assembling.lock().insert(ino) {
            return;
        }
        let client = self.client.clone();
        let found = self.pt.found.clone();
        let assembling = self.pt.assembling.clone();
        let failed = self.pt.copy_failed.clone();
        let path = path.to_string();
        self.rt.spawn(async move {
            let done = if copy {
                client.copy_here(&path).await
            } else {
                client.assemble(&path).await
            };
            match done {
                Ok(blocks) => match blocks.backing_file() {
                    Some(p) => {
                        let v = version(&blocks.attr);
                        let ids = block_ids(&blocks);
                        remember(&found, ino, Found::Block(v, PathBuf::from(p), ids));
                    }
                    None => tracing::debug!(path = %curvine_messages::names::shown(&path), "passthrough: the file changed while its blocks were laid out"),
                },
                Err(e) => {
                    tracing::info!(path = %curvine_messages::names::shown(&path), error = %e, copy, "passthrough: the node could not lay the file's blocks out in one file; it is read through the mount");
                    if copy {
                        remember(&failed, ino, Instant::now());
                    }
                }
            }
            assembling.lock().remove(&ino);
        });
    }

    /// Tells the node, within [`TOUCH_EVERY`], that `blocks` were read: the
    /// kernel reads a passthrough file's blocks without asking it, and its
    /// tier evictor would otherwise count a file read only this way as
    /// unused since it was written.
    fn note_read(&self, blocks: &[BlockId]) {
        let mut touched = self.pt.touched.lock();
        for &id in blocks {
            *touched.ids.entry(id).or_default() += 1;
        }
        if touched.scheduled || touched.ids.is_empty() {
            return;
        }
        touched.scheduled = true;
        drop(touched);
        let touched = self.pt.touched.clone();
        let client = self.client.clone();
        self.rt.spawn(async move {
            tokio::time::sleep(TOUCH_EVERY).await;
            // An id once per open (at most 1,000 in a window).
            let ids: Vec<BlockId> = {
                let mut t = touched.lock();
                t.scheduled = false;
                t.ids
                    .drain()
                    .flat_map(|(id, opens)| std::iter::repeat_n(id, opens.min(1000) as usize))
                    .collect()
            };
            let n = ids.len();
            match client.touch_blocks(ids).await {
                Ok(()) => curvine_runtime::stats::process().add(
                    "curvine_fuse_passthrough_touched_blocks_total",
                    "Blocks read through passthrough handles that the node was told of, once per open (its tier evictor counts them as recently used, and their bytes as out).",
                    &[],
                    n as u64,
                ),
                Err(e) => {
                    tracing::debug!(blocks = n, error = %e, "passthrough: cannot tell the node which blocks were read")
                }
            }
        });
    }

    /// A passthrough handle of an inode was released: the last one lets
    /// the backing file go.
    pub(super) fn passthrough_released(&self, ino: u64) {
        let mut shared = self.pt.shared.lock();
        if let Some(s) = shared.get_mut(&ino) {
            s.count = s.count.saturating_sub(1);
            if s.count == 0 {
                shared.remove(&ino);
            }
        }
    }
}

/// Remembers `value` for `ino` in a map of at most [`MAX_FOUND`] inodes
/// (cleared beyond).
fn remember<T>(all: &Mutex<HashMap<u64, T>>, ino: u64, value: T) {
    let mut all = all.lock();
    if all.len() >= MAX_FOUND {
        all.clear();
    }
    all.insert(ino, value);
}

fn block_ids(blocks: &curvine_messages::rpc::FileBlocks) -> Blocks {
    blocks.blocks.iter().map(|b| b.info.id).collect()
}

/// The one file on this host holding the whole file at its offsets (a
/// one-block file's block file, or its extent file), or why there is none.
fn block_file(blocks: &curvine_messages::rpc::FileBlocks) -> Result<PathBuf, Fallback> {
    if blocks.attr.writing.is_some() {
        return Err(Fallback::BeingWritten);
    }
    if blocks.attr.size == 0 {
        return Err(Fallback::Empty);
    }
    if let Some(p) = blocks.backing_file() {
        return Ok(PathBuf::from(p));
    }
    if blocks.layout().is_none() {
        return Err(Fallback::SeveralBlocks);
    }
    if !blocks.all_here() {
        return Err(Fallback::NotLocal);
    }
    Err(Fallback::Assembling)
}

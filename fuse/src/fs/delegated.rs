//! Directories delegated to this mount (see
//! `curvine_messages::delegation`, and `fuse.delegations`).
//!
//! When files are created one after another in a directory, the mount asks
//! the directory's shard to delegate it. While it holds the directory it
//! knows every name in it: it answers lookups of names it does not have
//! (ENOENT) and creates itself, with inode numbers the grant set aside, and
//! a sender task per directory sends the creates in batches, one batch at
//! a time, whatever queued while the previous one was on its way. Where
//! files are closed empty (the last file closed in the directory was), a
//! create waits in the queue until something needs it answered (its
//! file's first write, its close or fsync, a rename, the directory's
//! return) or for [`HOLD`] at most: a file closed before that goes as a
//! complete, empty file in the same batch, with no commit of its own.
//! Where files get written, creates go at once: their answer comes back
//! while the application prepares its first write. A file's writer
//! waits for its create's batch before its first block, and its close (or
//! fsync) before it commits, so a close that returns still means the file
//! and its content are committed.
//!
//! Invariants:
//! - A name is answered absent, or created here, only while the lease
//!   holds as this mount counts it: from the sending of the last renewal
//!   the shard accepted, less a margin. The shard counts from receiving
//!   it, so it never takes the directory back while this mount still
//!   answers for it.
//! - Once the mount stops answering for a directory (a recall, a lost or
//!   expiring lease, an operation here that the delegation does not cover)
//!   it answers nothing more locally; it sends what is queued, then
//!   releases the directory.
//! - Creates that fail at the shard (the directory was lost meanwhile)
//!   fail their file's writes and close, never silently.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use curvine_client::io::client_name;
use curvine_client::Client;
use curvine_messages::block::{FileSpec, WriteLease};
use curvine_messages::delegation::{DirOp, MAX_GRANT_INOS};
use curvine_messages::rpc::{
    AwaitRecall, Delegate, DirOpReply, DirOps, ReleaseDelegation, RenewDelegation, WriteOpen,
};
use curvine_messages::shard::{new_attr, NewFile};
use curvine_messages::{now_ns, Attr, FileKind, FsError, FsResult, NewInode};

/// Creates in one directory at most this far apart count as a run.
const RUN_GAP: Duration = Duration::from_secs(1);
/// The create of a run that asks for the directory.
const ASK_AT: u32 = 2;
/// Taken off the lease: the renewal's trip and clock rate differences.
const MARGIN: Duration = Duration::from_millis(300);
/// A directory refused or recalled is not asked for again this soon.
const PAUSE: Duration = Duration::from_secs(2);
/// A directory with no create here for this long is given back.
const IDLE: Duration = Duration::from_secs(3);
/// A create nothing waits for is sent at most this long after it queued.
const HOLD: Duration = Duration::from_millis(2);
/// Creates sent in one batch at most.
const BATCH_MAX: usize = 512;
/// Inode numbers left that make the mount ask for more.
const LOW_INOS: u64 = 512;

/// A create made here, until its batch is back with the file open for
/// writing.
pub(super) struct Created {
    pub(super) answer: watch::Receiver<Option<FsResult<DirOpReply>>>,
    /// The directory's sender, hurried when the answer is awaited.
    held: Arc<Dir>,
    /// The directory (FUSE inode) and the file's inode.
    pub(super) dir: u64,
    pub(super) ino: u64,
}

impl Created {
    /// The file is being written: creates in its directory go at once.
    pub(super) fn writing(&self) {
        self.held.state.lock().hold = false;
    }

    /// The batch's answer for this file.
    pub(super) async fn answer(&self) -> FsResult<WriteOpen> {
        self.held.hurry();
        let mut answer = self.answer.clone();
        let got = match answer.wait_for(|c| c.is_some()).await {
            Ok(c) => c.clone().unwrap_or_else(|| Err(FsError::Io(String::new()))),
            Err(_) => Err(FsError::Io(
                "the create of this file was dropped before it was sent".into(),
            )),
        };
        match got? {
            DirOpReply::Created(open) => Ok(*open),
            DirOpReply::Renamed => Err(FsError::Protocol("a rename's answer to a create".into())),
        }
    }
}

pub(super) struct Delegations {
    client: Client,
    /// This mount's id as a holder (random, per process).
    holder: u64,
    enabled: bool,
    /// The block size the mount asks for new files (0: the cluster's).
    block_size: u64,
    /// Held directories by FUSE inode.
    dirs: Mutex<HashMap<u64, Arc<Dir>>>,
    /// Runs of creates per directory not held (FUSE inode).
    runs: Mutex<HashMap<u64, Run>>,
}

struct Run {
    last: Instant,
    creates: u32,
    /// Not asked for again before this.
    pause_until: Option<Instant>,
}

struct Dir {
    fuse: u64,
    /// The directory's inode in the cluster.
    cluster: u64,
    state: Mutex<DirState>,
    /// Wakes the sender (a create queued, or the end).
    wake: Notify,
}

impl Dir {
    /// Makes the sender send what is queued now.
    fn hurry(&self) {
        let mut st = self.state.lock();
        // Nothing queued: what is awaited is on its way already.
        if !st.queue.is_empty() {
            st.urgent = true;
            self.wake.notify_one();
        }
    }
}

struct DirState {
    /// Every name in the directory, with what it is.
    names: HashMap<String, FileKind>,
    /// Inode numbers set aside for creates here: [next, end) ranges.
    inos: VecDeque<(u64, u64)>,
    asking_more: bool,
    /// Until when this mount may answer for the directory.
    valid_until: Instant,
    /// Nothing more is answered here: what is queued goes, then the release.
    stopping: bool,
    /// Released (or lost): the tasks end.
    ended: bool,
    queue: Vec<(DirOp, watch::Sender<Option<FsResult<DirOpReply>>>)>,
    /// When the oldest queued change queued.
    queued_at: Option<Instant>,
    /// Something waits for a queued change's answer: send now.
    urgent: bool,
    /// Creates wait for a need (or [`HOLD`]): the last file closed here
    /// was empty; a file's first write sets it back.
    hold: bool,
    in_flight: usize,
    spec: FileSpec,
    /// See `DirGrant::plain`.
    plain: bool,
    last_create: Instant,
}

impl DirState {
    fn answers(&self, now: Instant) -> bool {
        !self.stopping && now < self.valid_until
    }

    /// A name with bytes that are not UTF-8 goes to the cluster, which
    /// refuses it under a UFS mount (object keys are UTF-8).
    fn utf8_or_plain(&self, name: &str) -> bool {
        self.plain || !curvine_messages::names::has_escapes(name)
    }

    fn inos_left(&self) -> u64 {
        self.inos.iter().map(|(n, e)| e - n).sum()
    }

    /// Queues a change for the sender.
    fn push(&mut self, op: DirOp) -> watch::Receiver<Option<FsResult<DirOpReply>>> {
        let (tx, rx) = watch::channel(None);
        self.queue.push((op, tx));
        self.queued_at.get_or_insert_with(Instant::now);
        rx
    }

    /// When the queue is to be sent: now (`None`), or at the returned
    /// instant unless hurried before.
    fn send_at(&self) -> Option<Instant> {
        let hold = self.hold
            && !(self.urgent || self.stopping || self.ended || self.queue.len() >= BATCH_MAX);
        self.queued_at.filter(|_| hold).map(|at| at + HOLD)
    }

    fn take_ino(&mut self) -> Option<u64> {
        while let Some((next, end)) = self.inos.front_mut() {
            if next < end {
                let ino = *next;
                *next += 1;
                return Some(ino);
            }
            self.inos.pop_front();
        }
        None
    }
}

impl Delegations {
    pub(super) fn new(client: Client, enabled: bool, block_size: u64) -> Delegations {
        Delegations {
            client,
            holder: rand::random::<u64>() | 1,
            enabled,
            block_size,
            dirs: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self, dir: u64) -> Option<Arc<Dir>> {
        self.dirs.lock().get(&dir).cloned()
    }

    /// Whether `name` is known absent from directory `dir` (held here).
    pub(super) fn absent(&self, dir: u64, name: &str) -> bool {
        self.held(dir).is_some_and(|d| {
            let st = d.state.lock();
            st.answers(Instant::now()) && !st.names.contains_key(name)
        })
    }

    /// Creates file `name` in directory `dir` here when the mount holds
    /// it (asking for it when this create continues a run): its
    /// attributes now, and its open for writing once its batch is back.
    /// `None`: create it in the cluster as usual.
    pub(super) async fn create(
        self: &Arc<Self>,
        dir: u64,
        dir_path: impl Fn() -> FsResult<String>,
        name: &str,
        mode: u32,
        owner: (u32, u32),
    ) -> Option<(Attr, Created)> {
        if !self.enabled {
            return None;
        }
        if self.held(dir).is_none() {
            if !self.run_asks(dir) {
                return None;
            }
            self.ask(dir, dir_path().ok()?).await?;
        }
        self.create_now(dir, dir_path, name, mode, owner)
    }

    /// [`Self::create`] in a directory held already, without waiting (on
    /// a fuser thread, in the runtime's context).
    pub(super) fn create_now(
        self: &Arc<Self>,
        dir: u64,
        dir_path: impl Fn() -> FsResult<String>,
        name: &str,
        mode: u32,
        owner: (u32, u32),
    ) -> Option<(Attr, Created)> {
        let held = self.held(dir)?;
        let now = Instant::now();
        let (attr, rx, more, first) = {
            let mut st = held.state.lock();
            if !st.answers(now) || st.names.contains_key(name) || !st.utf8_or_plain(name) {
                return None;
            }
            let ino = st.take_ino()?;
            st.names.insert(name.to_string(), FileKind::File);
            st.last_create = now;
            let (attr, op) = new_file(ino, held.cluster, name, mode, owner, &st.spec);
            let first = st.queue.is_empty();
            let rx = st.push(op);
            let more = st.inos_left() < LOW_INOS && !st.asking_more;
            if more {
                st.asking_more = true;
            }
            (attr, rx, more, first)
        };
        if first {
            // The sender starts the queue's hold.
            held.wake.notify_one();
        }
        if more {
            let me = self.clone();
            let path = dir_path().ok();
            let held = held.clone();
            tokio::spawn(async move { me.more_inos(held, path).await });
        }
        let created = Created {
            answer: rx,
            held,
            dir,
            ino: attr.ino,
        };
        Some((attr, created))
    }

    /// A file made here is closed before anything was written to it: when
    /// its create is still queued (and no UFS mount covers the directory),
    /// it is sent as a complete, empty file, and its batch's answer is the
    /// file's commit. False when it was sent already.
    pub(super) fn close_empty(&self, created: &Created) -> bool {
        let Some(held) = self.held(created.dir) else {
            return false;
        };
        let mut st = held.state.lock();
        if !st.plain {
            return false;
        }
        st.hold = true;
        for (op, _) in st.queue.iter_mut() {
            match op {
                DirOp::Create { ino, complete, .. } if *ino == created.ino => {
                    *complete = true;
                    return true;
                }
                // Renamed before it was closed: it goes as it is.
                DirOp::Rename { ino, .. } if *ino == created.ino => return false,
                _ => {}
            }
        }
        false
    }

    /// Renames file `from` (inode `ino`) to `to` in directory `dir` when
    /// this mount holds it and `to` is absent: sent with the directory's
    /// queued creates, answered once the cluster has it. `None`: rename
    /// it in the cluster as usual.
    pub(super) async fn rename(
        &self,
        dir: u64,
        from: &str,
        to: &str,
        ino: u64,
    ) -> Option<FsResult<()>> {
        let held = self.held(dir)?;
        let mut answer = {
            let mut st = held.state.lock();
            if !st.answers(Instant::now())
                || st.names.get(from) != Some(&FileKind::File)
                || st.names.contains_key(to)
                || !st.utf8_or_plain(to)
            {
                return None;
            }
            st.names.remove(from);
            st.names.insert(to.to_string(), FileKind::File);
            st.push(DirOp::Rename {
                from: from.to_string(),
                to: to.to_string(),
                ino,
            })
        };
        held.hurry();
        let got = match answer.wait_for(|c| c.is_some()).await {
            Ok(c) => c.clone().unwrap_or_else(|| Err(FsError::Io(String::new()))),
            Err(_) => Err(FsError::Io(
                "a rename was dropped before it was sent".into(),
            )),
        };
        Some(got.map(|_| ()))
    }

    /// Counts a create in a directory not held; true when it should be
    /// asked for now.
    fn run_asks(&self, dir: u64) -> bool {
        let now = Instant::now();
        let mut runs = self.runs.lock();
        if runs.len() > 4096 {
            runs.retain(|_, r| now.duration_since(r.last) < RUN_GAP);
        }
        let run = runs.entry(dir).or_insert(Run {
            last: now,
            creates: 0,
            pause_until: None,
        });
        if now.duration_since(run.last) > RUN_GAP {
            run.creates = 0;
        }
        run.last = now;
        run.creates += 1;
        if run.pause_until.is_some_and(|p| now < p) {
            return false;
        }
        run.creates >= ASK_AT
    }

    fn pause(&self, dir: u64, pause: Duration) {
        let now = Instant::now();
        let mut runs = self.runs.lock();
        let run = runs.entry(dir).or_insert(Run {
            last: now,
            creates: 0,
            pause_until: None,
        });
        run.creates = 0;
        run.pause_until = Some(now + pause);
    }

    /// The request for the directory at `path`.
    fn delegate(&self, path: String) -> Delegate {
        Delegate {
            path,
            holder: self.holder,
            inos: MAX_GRANT_INOS,
            spec: FileSpec {
                block_size: self.block_size,
                ..Default::default()
            },
        }
    }

    /// Asks for directory `dir` (FUSE inode) at `path`; on a grant, starts
    /// its sender, renewer and recall watcher.
    async fn ask(self: &Arc<Self>, dir: u64, path: String) -> Option<Arc<Dir>> {
        let sent = Instant::now();
        let grant = match self.client.call(self.delegate(path.clone())).await {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(path, error = %e, "directory not delegated");
                let pause = match e {
                    FsError::NotSupported(_) | FsError::TooBig(_) => PAUSE * 30,
                    _ => PAUSE,
                };
                self.pause(dir, pause);
                return None;
            }
        };
        let lease = Duration::from_millis(u64::from(grant.lease_ms));
        let held = Arc::new(Dir {
            fuse: dir,
            cluster: grant.dir.ino,
            state: Mutex::new(DirState {
                names: grant
                    .entries
                    .into_iter()
                    .map(|e| (e.name, e.kind))
                    .collect(),
                inos: VecDeque::from([(grant.first_ino, grant.first_ino + u64::from(grant.inos))]),
                asking_more: false,
                valid_until: sent + lease.saturating_sub(MARGIN),
                stopping: false,
                ended: false,
                queue: Vec::new(),
                queued_at: None,
                urgent: false,
                hold: false,
                in_flight: 0,
                spec: grant.spec,
                plain: grant.plain,
                last_create: Instant::now(),
            }),
            wake: Notify::new(),
        });
        tracing::debug!(path, "directory delegated to this mount");
        self.dirs.lock().insert(dir, held.clone());
        tokio::spawn(self.clone().send_loop(held.clone()));
        tokio::spawn(self.clone().renew_loop(held.clone(), lease));
        tokio::spawn(self.clone().recall_loop(held.clone()));
        Some(held)
    }

    /// Asks the shard again for the directory this mount holds: more
    /// inode numbers (and a fresh listing, which adds nothing new).
    async fn more_inos(self: Arc<Self>, held: Arc<Dir>, path: Option<String>) {
        let grant = match path {
            Some(path) => self.client.call(self.delegate(path)).await.ok(),
            None => None,
        };
        let mut st = held.state.lock();
        st.asking_more = false;
        match grant {
            Some(g) if g.dir.ino == held.cluster => {
                st.inos
                    .push_back((g.first_ino, g.first_ino + u64::from(g.inos)));
                for e in g.entries {
                    st.names.entry(e.name).or_insert(e.kind);
                }
            }
            // Not granted: the creates go to the cluster once these run out.
            _ => {}
        }
    }

    /// Sends the directory's creates, a batch at a time, until it ends.
    async fn send_loop(self: Arc<Self>, held: Arc<Dir>) {
        loop {
            let batch: Result<Vec<_>, Option<Instant>> = {
                let mut st = held.state.lock();
                if st.queue.is_empty() {
                    if st.ended {
                        return;
                    }
                    Err(None)
                } else if let Some(at) = st.send_at() {
                    Err(Some(at))
                } else {
                    let n = st.queue.len().min(BATCH_MAX);
                    st.in_flight += n;
                    let batch = st.queue.drain(..n).collect();
                    if st.queue.is_empty() {
                        st.queued_at = None;
                        st.urgent = false;
                    }
                    Ok(batch)
                }
            };
            let batch = match batch {
                Ok(batch) => batch,
                Err(None) => {
                    held.wake.notified().await;
                    continue;
                }
                Err(Some(at)) => {
                    tokio::select! {
                        _ = held.wake.notified() => {}
                        _ = tokio::time::sleep_until(at.into()) => {}
                    }
                    continue;
                }
            };
            let ops = batch.iter().map(|(op, _)| op.clone()).collect();
            let result = self
                .client
                .call(DirOps {
                    dir: held.cluster,
                    holder: self.holder,
                    ops,
                })
                .await;
            let lost = matches!(result, Err(FsError::Stale(_)));
            let results: Vec<FsResult<DirOpReply>> = match result {
                Ok(replies) if replies.len() == batch.len() => replies,
                Ok(replies) => {
                    let e = FsError::Protocol(format!(
                        "{} answers to {} creates",
                        replies.len(),
                        batch.len()
                    ));
                    batch.iter().map(|_| Err(e.clone())).collect()
                }
                Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
            };
            let mut st = held.state.lock();
            st.in_flight -= batch.len();
            for ((op, tx), result) in batch.into_iter().zip(results) {
                if let Err(e) = &result {
                    tracing::warn!(dir = held.cluster, ?op, error = %e, "a change made in a delegated directory failed");
                    match &op {
                        DirOp::Create { name, .. } => {
                            st.names.remove(name);
                        }
                        // What the directory holds is no longer known here.
                        DirOp::Rename { .. } => st.stopping = true,
                    }
                }
                let _ = tx.send(Some(result));
            }
            if lost {
                st.stopping = true;
            }
        }
    }

    /// Renews the directory's lease a few times per lease until it is
    /// given back; gives it back when the shard recalled it, when it is
    /// lost, or when nothing was created in it for a while. While what
    /// was answered here is being sent, the renewals go on: the shard
    /// keeps a recalled directory for a holder that renews, so a slow
    /// batch does not lose creates already answered.
    async fn renew_loop(self: Arc<Self>, held: Arc<Dir>, lease: Duration) {
        let every = lease / 4;
        let mut giving_back = false;
        let give_back = |me: &Arc<Self>| {
            let me = me.clone();
            let fuse = held.fuse;
            tokio::spawn(async move { me.give_back(fuse).await });
        };
        loop {
            tokio::time::sleep(every).await;
            let (ended, stopping, idle) = {
                let st = held.state.lock();
                (st.ended, st.stopping, st.last_create.elapsed() > IDLE)
            };
            if ended {
                return;
            }
            if (stopping || idle) && !giving_back {
                giving_back = true;
                give_back(&self);
            }
            let sent = Instant::now();
            match self
                .client
                .call(RenewDelegation {
                    dir: held.cluster,
                    holder: self.holder,
                })
                .await
            {
                Ok(r) if !r.recalled => {
                    let lease = Duration::from_millis(u64::from(r.lease_ms));
                    held.state.lock().valid_until = sent + lease.saturating_sub(MARGIN);
                }
                Ok(_) if giving_back => {}
                Ok(_) => {
                    self.pause(held.fuse, PAUSE);
                    giving_back = true;
                    give_back(&self);
                }
                Err(FsError::Stale(_)) => {
                    if !giving_back {
                        self.pause(held.fuse, PAUSE);
                        give_back(&self);
                    }
                    return;
                }
                // The lease runs out unless a later renewal gets through.
                Err(e) => {
                    tracing::debug!(dir = held.cluster, error = %e, "renewing a delegation failed")
                }
            }
        }
    }

    /// Waits for the shard to recall the directory.
    async fn recall_loop(self: Arc<Self>, held: Arc<Dir>) {
        loop {
            {
                let st = held.state.lock();
                if st.ended || st.stopping {
                    return;
                }
            }
            match self
                .client
                .call(AwaitRecall {
                    dir: held.cluster,
                    holder: self.holder,
                })
                .await
            {
                Ok(false) => {}
                Ok(true) | Err(FsError::Stale(_)) => {
                    self.pause(held.fuse, PAUSE);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        self.give_back(held.fuse).await;
    }

    /// Stops answering for directory `dir` (FUSE inode), sends what is
    /// queued, and releases it. Nothing when it is not held.
    pub(super) async fn give_back(&self, dir: u64) {
        let Some(held) = self.held(dir) else {
            return;
        };
        held.state.lock().stopping = true;
        self.drained(&held).await;
        // One of concurrent callers releases it.
        if self
            .dirs
            .lock()
            .remove(&dir)
            .is_none_or(|d| !Arc::ptr_eq(&d, &held))
        {
            return;
        }
        if let Err(e) = self
            .client
            .call(ReleaseDelegation {
                dir: held.cluster,
                holder: self.holder,
            })
            .await
        {
            // It runs out at the shard instead.
            tracing::debug!(dir = held.cluster, error = %e, "releasing a delegation failed");
        }
        held.state.lock().ended = true;
        held.wake.notify_one();
        tracing::debug!(dir = held.cluster, "directory given back");
    }

    /// Waits until every create made in `held` so far was answered.
    async fn drained(&self, held: &Dir) {
        loop {
            {
                let st = held.state.lock();
                if st.queue.is_empty() && st.in_flight == 0 {
                    return;
                }
            }
            held.wake.notify_one();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The attributes and the create of a new file made here.
fn new_file(
    ino: u64,
    dir: u64,
    name: &str,
    mode: u32,
    (uid, gid): (u32, u32),
    spec: &FileSpec,
) -> (Attr, DirOp) {
    let now = now_ns();
    let lease = WriteLease {
        handle: rand::random::<u64>() | 1,
        client: client_name(),
        renewed_ns: now,
    };
    let attrs = NewInode {
        kind: FileKind::File,
        mode,
        uid,
        gid,
        symlink: None,
        now_ns: now,
    };
    let file = NewFile {
        spec: spec.clone(),
        lease: Some(lease.clone()),
    };
    let attr = new_attr(ino, &attrs, dir, Some(&file));
    let op = DirOp::Create {
        name: name.to_string(),
        ino,
        complete: false,
        attrs,
        spec: spec.clone(),
        lease,
    };
    (attr, op)
}

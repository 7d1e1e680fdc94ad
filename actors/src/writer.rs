//! The write thread of one LMDB environment, with group commit.
//!
//! LMDB write transactions must stay on one OS thread, so each environment
//! has one dedicated thread that owns every write to it, whichever shard the
//! write is for. It takes all queued mutations (up to `meta.group_commit_max`),
//! waits up to `meta.commit_delay` for more when callers are concurrent,
//! runs each in a nested transaction of one write transaction, makes the
//! group durable with one record in the environment's write-ahead log (or,
//! without a log, with LMDB's own synced commit), commits, and only then
//! answers each caller. A mutation that fails or panics is rolled back
//! alone; the others still commit. An acknowledged mutation is therefore
//! durable, but for those submitted `early` (a file's creation by its
//! open, which its close or fsync makes durable): they are answered once
//! LMDB committed them, before the record's sync.
//!
//! The thread also keeps zero-filled space ahead of the end of LMDB's data
//! file: a commit that writes inside the file costs one journal-free
//! fdatasync, while one that extends the file costs an ext4 journal commit
//! as well (measured here: 2.5k against 4.0k fdatasync/s).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use heed::{Env, WithoutTls};

use curvine_messages::wal::Change;
use curvine_messages::{now_ns, FsError, FsResult, ShardId};

use raft::eraftpb::ConfChangeV2;

use crate::clock::Clock;
use crate::replica::{
    Done, GroupMessage, Groups, MayFound, MemberChange, ShardCopy, StatusBoard, Transport,
};
use crate::store::{expire_answers, lmdb_err, ShardStore, ANSWER_EXPIRY_EVERY};
use crate::trace::{outcome_of, Span};
use crate::txn::WriteTxn;

/// Called once the transaction a mutation ran in has committed (`Ok`) or failed.
type Completion = Box<dyn FnOnce(FsResult<()>) + Send>;
/// A mutation: runs inside a nested transaction (or is refused with the
/// error, unrun); says whether it succeeded and what to do after the commit.
type Run = Box<dyn FnOnce(Result<&mut WriteTxn<'_>, FsError>) -> (bool, Completion) + Send>;

/// A mutation of one shard.
struct Job {
    shard: ShardId,
    run: Run,
    /// Answered once applied, before its change is durable.
    early: bool,
}

/// What the write thread takes.
enum Input {
    Job(Job),
    /// Raft messages from other members.
    Raft(Vec<GroupMessage>),
    /// A change of a group's members, proposed by its leader.
    Members(ShardId, ConfChangeV2, Done),
    /// A read barrier (`Groups::read_barrier`).
    Read(ShardId, Done),
    /// Wait until an entry is committed (`Groups::wait_for`).
    Seen(ShardId, u64, u64, Done),
    /// Become a new member of a group led by a member (`Groups::join`).
    Join(ShardId, u64, Done),
    /// Hand a group's leadership to a member (`Groups::transfer`).
    Transfer(ShardId, u64, Done),
}

struct Inner {
    tx: mpsc::Sender<Input>,
    status: StatusBoard,
}

/// Hands Raft messages from other members to an environment's write thread.
#[derive(Clone)]
pub struct Inbox {
    tx: mpsc::Sender<Input>,
}

impl Inbox {
    pub fn deliver(&self, messages: Vec<GroupMessage>) {
        let _ = self.tx.send(Input::Raft(messages));
    }
}

/// How often the groups' clocks tick: a leader's heartbeat every 3 ticks,
/// an election after 10 to 20 ticks without one.
pub const RAFT_TICK: Duration = Duration::from_millis(100);

/// Handle to an environment's write thread, for one shard. The thread
/// commits what is queued and exits when the last handle is dropped.
#[derive(Clone)]
pub struct Writer {
    inner: Arc<Inner>,
    shard: ShardId,
}

impl Writer {
    /// The write thread of `store`'s environment, started on first use and
    /// shared by every shard whose databases live in that environment.
    pub fn for_store(store: &ShardStore, group_max: usize, commit_delay: Duration) -> Writer {
        Self::for_store_with(store, group_max, commit_delay, None, None)
    }

    /// [`Self::for_store`], with how the groups reach other members (used
    /// when this call starts the thread).
    pub fn for_store_with(
        store: &ShardStore,
        group_max: usize,
        commit_delay: Duration,
        transport: Option<Arc<dyn Transport>>,
        may_found: Option<MayFound>,
    ) -> Writer {
        let engine = store.engine();
        let shard = store.shard;
        let mut running = engine
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(inner) = running
            .upgrade()
            .and_then(|any| any.downcast::<Inner>().ok())
        {
            return Writer { inner, shard };
        }
        let (core, tx, rx) = Self::core(
            store,
            group_max,
            transport,
            may_found,
            &StepOptions::default(),
        );
        let status = core.groups.status();
        let path = engine.path().to_path_buf();
        let name = format!(
            "lmdb-writer-{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("env")
        );
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run(core, rx, commit_delay))
            .expect("spawning a thread only fails when the OS is out of resources");
        let inner = Arc::new(Inner { tx, status });
        let any: Arc<dyn std::any::Any + Send + Sync> = inner.clone();
        *running = Arc::downgrade(&any);
        Writer { inner, shard }
    }

    /// A writer of `store`'s environment whose passes its caller runs
    /// ([`Stepper::step`]) instead of a thread; other shards of the
    /// environment get the same write side from [`Self::for_store`] while
    /// this writer lives. Refused when the environment's write side runs
    /// already.
    pub fn stepped(
        store: &ShardStore,
        transport: Option<Arc<dyn Transport>>,
        options: &StepOptions,
    ) -> FsResult<(Writer, Stepper)> {
        let engine = store.engine();
        let mut running = engine
            .writer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if running.upgrade().is_some() {
            return Err(FsError::InvalidArgument(format!(
                "the write side of {} runs already",
                engine.path().display()
            )));
        }
        let (core, tx, rx) = Self::core(store, options.group_max, transport, None, options);
        let inner = Arc::new(Inner {
            tx,
            status: core.groups.status(),
        });
        let any: Arc<dyn std::any::Any + Send + Sync> = inner.clone();
        *running = Arc::downgrade(&any);
        Ok((
            Writer {
                inner,
                shard: store.shard,
            },
            Stepper { core, rx },
        ))
    }

    fn core(
        store: &ShardStore,
        group_max: usize,
        transport: Option<Arc<dyn Transport>>,
        may_found: Option<MayFound>,
        options: &StepOptions,
    ) -> (Core, mpsc::Sender<Input>, mpsc::Receiver<Input>) {
        let engine = store.engine();
        let copy: Arc<dyn ShardCopy> = Arc::new(Copies(store.sibling(store.shard)));
        let mut groups = Groups::new(store.replica_id, store.tables(), copy, transport, may_found);
        if let Some(ticks) = options.election_tick {
            groups.set_election_tick(ticks);
        }
        if let Some(entries) = options.log_window {
            groups.set_log_window(entries);
        }
        let core = Core::new(
            engine.env().clone(),
            engine.wal().cloned(),
            groups,
            store.answers_db(),
            engine.clock().clone(),
            group_max,
        );
        let (tx, rx) = mpsc::channel::<Input>();
        (core, tx, rx)
    }

    /// Where other members' Raft messages for this environment go.
    pub fn inbox(&self) -> Inbox {
        Inbox {
            tx: self.inner.tx.clone(),
        }
    }

    /// The environment's groups as of the last pass.
    pub fn status(&self) -> StatusBoard {
        self.inner.status.clone()
    }

    /// Answers `done` once this node has confirmed with a quorum of the
    /// shard's group that it leads, and applied all that was committed
    /// then (reads after it are linearizable); refused elsewhere.
    pub fn read_barrier(&self, done: Done) {
        let _ = self.inner.tx.send(Input::Read(self.shard, done));
    }

    /// Answers `done` once the shard's entry `index` of term `term` is
    /// committed (an error if another entry replaced it): a read that saw
    /// the shard's state up to that entry may then answer.
    pub fn wait_committed(&self, index: u64, term: u64, done: Done) {
        let _ = self
            .inner
            .tx
            .send(Input::Seen(self.shard, index, term, done));
    }

    /// Proposes a change of this shard's members (this node must lead its
    /// group); `done` is answered once the change is committed.
    pub fn change_members(&self, changes: &[MemberChange], done: Done) {
        let change = crate::replica::conf_change(changes);
        let _ = self.inner.tx.send(Input::Members(self.shard, change, done));
    }

    /// Makes this node a new member of this shard's group (added by its
    /// leader with [`Self::change_members`]): it takes the leader's
    /// snapshot, then its log. `done` is told once the member waits.
    /// `leader` is the member adding this node (0: any).
    pub fn join(&self, leader: u64, done: Done) {
        let _ = self.inner.tx.send(Input::Join(self.shard, leader, done));
    }

    /// Hands this shard's leadership to member `to` (this node must lead).
    pub fn transfer_leader(&self, to: u64, done: Done) {
        let _ = self.inner.tx.send(Input::Transfer(self.shard, to, done));
    }

    /// Queues a mutation; `reply` gets its result once it is durable.
    pub fn submit<T, F, R>(&self, mutation: F, reply: R)
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteTxn<'_>) -> FsResult<T> + Send + 'static,
        R: FnOnce(FsResult<T>) + Send + 'static,
    {
        self.submit_traced(mutation, reply, None)
    }

    /// [`Self::submit`] for a message handled in a trace: `span` ends when
    /// the reply is sent, with a child span for the commit (from the
    /// mutation's start in its group to the group's commit).
    pub fn submit_traced<T, F, R>(&self, mutation: F, reply: R, span: Option<Span>)
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteTxn<'_>) -> FsResult<T> + Send + 'static,
        R: FnOnce(FsResult<T>) + Send + 'static,
    {
        self.submit_with(mutation, reply, span, false)
    }

    /// [`Self::submit_traced`]; with `early`, `reply` gets the result as
    /// soon as LMDB committed the change, before the log's sync makes it
    /// durable (and, in a replicated group, before a quorum has it). For
    /// a change that the caller's own later change in the same shard makes
    /// durable, as a file's close does for its creation: the log is one
    /// sequence, so when that later change is durable (committed) this
    /// one is too. Until then a machine crash (not a crash of the process:
    /// the record is in the page cache) or a lost leadership may take it
    /// back, and the later change then fails. A reader of a group with one
    /// member may see such a change before it is durable, as on a local
    /// file system; readers of a replicated group wait for its commit.
    pub fn submit_with<T, F, R>(&self, mutation: F, reply: R, span: Option<Span>, early: bool)
    where
        T: Send + 'static,
        F: FnOnce(&mut WriteTxn<'_>) -> FsResult<T> + Send + 'static,
        R: FnOnce(FsResult<T>) + Send + 'static,
    {
        let queued_ns = span.as_ref().map_or(0, |_| now_ns());
        let run: Run = Box::new(move |txn| {
            let start_ns = span.as_ref().map_or(0, |_| now_ns());
            let result = match txn {
                Ok(txn) => catch_unwind(AssertUnwindSafe(|| mutation(txn))).unwrap_or_else(|_| {
                    Err(FsError::Io(
                        "internal error: metadata mutation panicked".into(),
                    ))
                }),
                Err(refused) => Err(refused),
            };
            let ok = result.is_ok();
            let completion: Completion = Box::new(move |commit: FsResult<()>| {
                let result = match commit {
                    Ok(()) => result,
                    Err(e) => Err(e),
                };
                if let Some(span) = span {
                    let end_ns = now_ns();
                    let outcome = outcome_of(&result);
                    let writer = std::thread::current();
                    span.child(
                        writer.name().unwrap_or("lmdb-writer"),
                        "commit",
                        (queued_ns, start_ns, end_ns),
                        outcome.clone(),
                    );
                    span.end_at(end_ns, outcome);
                }
                reply(result)
            });
            (ok, completion)
        });
        // If the thread is gone the job is dropped with its reply, and the
        // caller sees the shard as unavailable instead of waiting forever.
        let _ = self.inner.tx.send(Input::Job(Job {
            shard: self.shard,
            run,
            early,
        }));
    }
}

/// The shards of an environment as its groups snapshot and install them.
struct Copies(ShardStore);

impl ShardCopy for Copies {
    fn read_txn(&self) -> FsResult<heed::RoTxn<'static, WithoutTls>> {
        self.0.read_txn()
    }

    fn export(
        &self,
        shard: ShardId,
        txn: &heed::RoTxn<WithoutTls>,
    ) -> FsResult<Vec<curvine_messages::shard::ShardRecord>> {
        self.0.sibling(shard).export_all(txn)
    }

    fn replace(
        &self,
        shard: ShardId,
        txn: &mut heed::RwTxn,
        records: &[curvine_messages::shard::ShardRecord],
    ) -> FsResult<()> {
        let store = self.0.sibling(shard);
        let nested = store.env().nested_write_txn(txn).map_err(lmdb_err)?;
        let mut w = WriteTxn::new(nested);
        store.drop_all(&mut w)?;
        store.import(&mut w, records)?;
        w.commit_with_undo().map_err(lmdb_err)?;
        Ok(())
    }
}

/// What one environment's write side keeps between passes: its
/// environment and log, its groups, and when they next tick. Its thread
/// ([`run`]) waits for inputs and steps it; a test or the simulation
/// steps it on its own (a [`Stepper`]), on the engine's clock.
struct Core {
    env: Env<WithoutTls>,
    wal: Option<Arc<Mutex<crate::wal::Wal>>>,
    groups: Groups,
    answers: crate::txn::Db,
    space: Headroom,
    clock: Clock,
    group_max: usize,
    /// How many callers shared the last commit.
    last_batch: usize,
    next_tick: Instant,
    next_expiry: Instant,
    pass: Pass,
}

impl Core {
    fn new(
        env: Env<WithoutTls>,
        wal: Option<Arc<Mutex<crate::wal::Wal>>>,
        mut groups: Groups,
        answers: crate::txn::Db,
        clock: Clock,
        group_max: usize,
    ) -> Core {
        groups.set_logged(wal.is_some());
        groups.set_clock(clock.clone());
        if let Err(e) = env
            .read_txn()
            .map_err(lmdb_err)
            .and_then(|txn| groups.load_stored(&txn))
        {
            tracing::error!(env = %env.path().display(), error = %e, "cannot load the shards' Raft groups");
        }
        let now = clock.now();
        Core {
            space: Headroom::new(&env),
            env,
            wal,
            groups,
            answers,
            clock,
            group_max: group_max.max(1),
            last_batch: 0,
            next_tick: now + RAFT_TICK,
            next_expiry: now,
            pass: Pass::default(),
        }
    }

    /// When the groups next need a pass without any input: a tick, or
    /// entries a follower holds back.
    fn wake(&self) -> Instant {
        self.groups
            .next_apply()
            .map_or(self.next_tick, |at| at.min(self.next_tick))
    }

    /// A checkpoint is overdue while a leader's changes wait for their
    /// commit: new mutations wait until they are committed.
    fn hold(&self) -> bool {
        self.groups.speculating()
            && self.wal.as_ref().is_some_and(|w| {
                w.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .checkpoint_overdue()
            })
    }

    /// Whether a pass has work now, without waiting for input.
    fn ready(&self, hold: bool) -> bool {
        self.groups.has_work() || (!self.pass.jobs.is_empty() && !hold)
    }

    fn full(&self) -> bool {
        self.pass.jobs.len() >= self.group_max
    }

    /// Runs one pass over what was taken, ticking the groups and expiring
    /// old answers when due. `Ok(false)`: there was nothing to do. An
    /// error leaves the groups and LMDB untrustworthy (see [`crash`]).
    fn run_pass(&mut self, hold: bool) -> FsResult<bool> {
        if self.clock.now() >= self.next_tick {
            self.groups.tick();
            self.next_tick = self.clock.now() + RAFT_TICK;
        }
        if self.clock.now() >= self.next_expiry {
            self.next_expiry = self.clock.now() + ANSWER_EXPIRY_EVERY;
            if let Err(e) = expire_answers(&self.env, self.answers) {
                tracing::warn!(env = %self.env.path().display(), error = %e, "cannot delete expired answers of calls");
            }
        }
        let pass = &mut self.pass;
        let jobs = if hold {
            Vec::new()
        } else {
            std::mem::take(&mut pass.jobs)
        };
        let others = Others {
            messages: std::mem::take(&mut pass.messages),
            members: std::mem::take(&mut pass.members),
            reads: std::mem::take(&mut pass.reads),
            seen: std::mem::take(&mut pass.seen),
            joins: std::mem::take(&mut pass.joins),
            transfers: std::mem::take(&mut pass.transfers),
        };
        if jobs.is_empty() && others.is_empty() && !self.groups.has_work() {
            return Ok(false);
        }
        self.last_batch = jobs.len();
        let pass_started = self.clock.now();
        commit_batch(&self.env, &self.wal, &mut self.groups, jobs, others)?;
        if let Some(wal) = &self.wal {
            wal.lock()
                .unwrap_or_else(|p| p.into_inner())
                .add_busy(self.clock.since(pass_started));
        }
        self.space.keep_ahead();
        Ok(true)
    }
}

/// The write thread: waits for inputs (or the groups' next tick), takes
/// what is queued and runs a pass, until every handle is gone.
fn run(mut core: Core, rx: mpsc::Receiver<Input>, commit_delay: Duration) {
    loop {
        let hold = core.hold();
        let first = if core.ready(hold) {
            rx.try_recv().ok()
        } else {
            let wait = core.wake().saturating_duration_since(core.clock.now());
            match rx.recv_timeout(wait) {
                Ok(input) => Some(input),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        };
        if let Some(input) = first {
            core.pass.take(input);
        }
        while !core.full() {
            match rx.try_recv() {
                Ok(input) => core.pass.take(input),
                Err(_) => break,
            }
        }
        // Several callers shared the last commit: they are likely sending
        // their next mutations right now. Waiting a moment for them puts
        // them in this commit instead of the next (PostgreSQL's
        // commit_delay). A lone caller never waits.
        // It stops waiting once as many have come as shared the last commit.
        if core.last_batch > 1 && !commit_delay.is_zero() && !core.pass.jobs.is_empty() {
            let deadline = Instant::now() + commit_delay;
            while core.pass.jobs.len() < core.group_max.min(core.last_batch) {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(input) => core.pass.take(input),
                    Err(_) => break,
                }
            }
        }
        if let Err(e) = core.run_pass(hold) {
            crash(&core.env, &e);
        }
    }
    tracing::debug!(env = %core.env.path().display(), "metadata writer stopped");
}

/// How a stepped write side runs ([`Writer::stepped`]).
#[derive(Debug, Clone)]
pub struct StepOptions {
    /// Mutations in one pass at most.
    pub group_max: usize,
    /// Fixes this member's election timeout in ticks
    /// ([`Groups::set_election_tick`]).
    pub election_tick: Option<usize>,
    /// Entries kept below what was applied ([`Groups::set_log_window`]).
    pub log_window: Option<u64>,
}

impl Default for StepOptions {
    fn default() -> StepOptions {
        StepOptions {
            group_max: 64,
            election_tick: None,
            log_window: None,
        }
    }
}

/// An environment's write side stepped by its caller instead of a thread
/// (tests and the simulation, on the engine's manual clock): each
/// [`Stepper::step`] takes what the environment's [`Writer`]s and
/// [`Inbox`]es queued and runs the passes due now. A failed pass is
/// returned instead of stopping the process: the caller treats the member
/// as crashed (drops its engine and opens it again).
pub struct Stepper {
    core: Core,
    rx: mpsc::Receiver<Input>,
}

impl Stepper {
    /// Runs passes until nothing is left to do at the clock's present
    /// time; how many ran.
    pub fn step(&mut self) -> FsResult<usize> {
        let mut passes = 0;
        // Bounded: a pass that leaves work behind (a follower's deferred
        // entries, a held checkpoint) is stepped again at the next time.
        while passes < 64 {
            while !self.core.full() {
                match self.rx.try_recv() {
                    Ok(input) => self.core.pass.take(input),
                    Err(_) => break,
                }
            }
            let hold = self.core.hold();
            if !self.core.run_pass(hold)? {
                break;
            }
            passes += 1;
        }
        Ok(passes)
    }

    /// When the groups next need a pass without any input.
    pub fn wake(&self) -> Instant {
        self.core.wake()
    }

    /// The environment this stepper writes.
    pub fn path(&self) -> &std::path::Path {
        self.core.env.path()
    }
}

/// The exit status of a process whose metadata pass failed (EX_IOERR).
pub const FAILED_PASS_EXIT: i32 = 74;

/// A pass failed: the groups' Raft state (raft-rs advanced by `ready()`,
/// what they applied, stepped down or installed) may be ahead of what LMDB
/// and the log hold, and a later checkpoint could make that gap permanent.
/// Nothing of it can be trusted, so the process stops, crash-only: every
/// caller of the pass was answered with the error, and a restart recovers
/// LMDB and the groups from the log alone. A leader that stayed up would
/// answer every call with the error while its heartbeats kept the other
/// members from electing another.
fn crash(env: &Env<WithoutTls>, e: &FsError) -> ! {
    tracing::error!(
        env = %env.path().display(),
        error = %e,
        "a metadata commit failed; stopping the process so that it recovers from its metadata log when started again"
    );
    std::process::exit(FAILED_PASS_EXIT);
}

/// What a pass takes besides mutations.
struct Others {
    messages: Vec<GroupMessage>,
    members: Vec<(ShardId, ConfChangeV2, Done)>,
    reads: Vec<(ShardId, Done)>,
    seen: Vec<(ShardId, u64, u64, Done)>,
    joins: Vec<(ShardId, u64, Done)>,
    transfers: Vec<(ShardId, u64, Done)>,
}

impl Others {
    fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.members.is_empty()
            && self.reads.is_empty()
            && self.seen.is_empty()
            && self.joins.is_empty()
            && self.transfers.is_empty()
    }
}

/// What one pass of the write thread takes from its queue.
#[derive(Default)]
struct Pass {
    jobs: Vec<Job>,
    messages: Vec<GroupMessage>,
    members: Vec<(ShardId, ConfChangeV2, Done)>,
    reads: Vec<(ShardId, Done)>,
    seen: Vec<(ShardId, u64, u64, Done)>,
    joins: Vec<(ShardId, u64, Done)>,
    transfers: Vec<(ShardId, u64, Done)>,
}

impl Pass {
    fn take(&mut self, input: Input) {
        match input {
            Input::Job(job) => self.jobs.push(job),
            Input::Raft(messages) => self.messages.extend(messages),
            Input::Members(shard, change, done) => self.members.push((shard, change, done)),
            Input::Read(shard, done) => self.reads.push((shard, done)),
            Input::Seen(shard, index, term, done) => self.seen.push((shard, index, term, done)),
            Input::Join(shard, leader, done) => self.joins.push((shard, leader, done)),
            Input::Transfer(shard, to, done) => self.transfers.push((shard, to, done)),
        }
    }
}

/// Runs each job in a nested transaction of `txn` (those of shards this
/// node does not lead are refused unrun): what each shard's jobs changed,
/// how to take it back, and each job's completion.
#[allow(clippy::type_complexity)]
fn run_jobs(
    env: &Env<WithoutTls>,
    txn: &mut heed::RwTxn<'_>,
    groups: &mut Groups,
    jobs: Vec<Job>,
    completions: &mut Vec<(ShardId, Completion, bool)>,
) -> FsResult<BTreeMap<ShardId, (Vec<Change>, Vec<crate::txn::Undo>)>> {
    let mut changes: BTreeMap<ShardId, (Vec<Change>, Vec<crate::txn::Undo>)> = BTreeMap::new();
    for job in jobs {
        let mut early = job.early;
        let completion = match groups.check_leader(txn, job.shard) {
            Ok(()) => {
                let nested = env.nested_write_txn(txn).map_err(lmdb_err)?;
                let mut nested = if groups.needs_undo(job.shard) {
                    WriteTxn::with_undo(nested)
                } else {
                    WriteTxn::new(nested)
                };
                nested.set_id_floor(groups.id_floor(job.shard));
                let (ok, completion) = (job.run)(Ok(&mut nested));
                if ok {
                    let (made, undo) = nested.commit_with_undo().map_err(lmdb_err)?;
                    if !made.is_empty() {
                        let entry = changes.entry(job.shard).or_default();
                        entry.0.extend(made);
                        entry.1.extend(undo);
                    }
                } else {
                    nested.abort();
                }
                completion
            }
            Err(refused) => {
                early = false;
                (job.run)(Err(refused)).1
            }
        };
        completions.push((job.shard, completion, early));
    }
    Ok(changes)
}

/// One pass: steps other members' messages, runs the jobs (each in a
/// nested transaction), proposes what each shard's jobs changed as one
/// entry of its group, makes the groups' new entries durable as one record
/// of the log (or, without a log, with LMDB's own synced commit), commits
/// LMDB, and answers each job once its shard committed what the job saw.
fn commit_batch(
    env: &Env<WithoutTls>,
    wal: &Option<Arc<Mutex<crate::wal::Wal>>>,
    groups: &mut Groups,
    jobs: Vec<Job>,
    others: Others,
) -> FsResult<()> {
    let mut txn = env.write_txn().map_err(lmdb_err)?;
    let mut completions: Vec<(ShardId, Completion, bool)> = Vec::with_capacity(jobs.len());
    let ran = (|| -> FsResult<_> {
        for (shard, leader, done) in others.joins {
            done(groups.join(&mut txn, shard, leader));
        }
        for (shard, to, done) in others.transfers {
            done(groups.transfer(shard, to));
        }
        for m in others.messages {
            groups.step(&txn, m)?;
        }
        for (shard, index, term, done) in others.seen {
            groups.wait_for(shard, index, term, done);
        }
        // What the members acknowledged may commit earlier passes' entries:
        // their callers need not wait for this pass's sync.
        groups.answer_committed();
        groups.follow_roles(&mut txn)?;
        for (shard, change, done) in others.members {
            match groups.check_leader(&txn, shard) {
                Ok(()) => groups.propose_members(shard, change, done),
                Err(e) => done(Err(e)),
            }
        }
        for (shard, done) in others.reads {
            groups.read_barrier(&txn, shard, done);
        }
        run_jobs(env, &mut txn, groups, jobs, &mut completions)
    })();
    let changes = match ran {
        Ok(changes) => changes,
        Err(e) => {
            for (_, completion, _) in completions {
                completion(Err(e.clone()));
            }
            return Err(e);
        }
    };
    // From the first proposal on, the groups' logs and LMDB must move
    // together: a failure stops every change until the node restarts (and
    // recovers both from the log).
    let proposed = (|| -> FsResult<_> {
        for (shard, (made, undo)) in changes {
            groups.propose(shard, &made, undo)?;
        }
        Ok(())
    })();
    // Early callers are answered once LMDB committed; the others once
    // their group committed what they saw.
    let mut early: Vec<Completion> = Vec::new();
    for (shard, completion, answer_early) in completions {
        if answer_early {
            early.push(completion);
        } else {
            groups.wait(shard, completion);
        }
    }
    if let Err(e) = proposed {
        groups.stop(&e);
        answer_all(&mut early, Err(e.clone()));
        return Err(e);
    }
    let persisted = (|| -> FsResult<_> {
        let pending = groups.collect(&mut txn)?;
        // A leader's appends go out now: its followers write them while
        // it does.
        groups.flush();
        match wal {
            None => {
                txn.commit().map_err(lmdb_err)?;
                answer_all(&mut early, Ok(()));
                groups.persisted(pending);
                groups.settle();
                // LMDB's synced commit made every installed snapshot durable.
                groups.durable();
            }
            Some(wal) => {
                let mut wal = wal.lock().unwrap_or_else(|p| p.into_inner());
                if !early.is_empty() {
                    // Early callers need their change applied, not durable:
                    // LMDB commits before the record is synced, so a
                    // reader of a one-member group may see the pass's
                    // changes a moment before they are durable (a crash of
                    // the process keeps the written record; one of the
                    // machine may take both back). Other callers are still
                    // answered after the sync.
                    let started = Instant::now();
                    let written = wal.write(&pending.record)?;
                    txn.commit().map_err(lmdb_err)?;
                    answer_all(&mut early, Ok(()));
                    if written {
                        wal.sync_written(started)?;
                    }
                    groups.persisted(pending);
                } else {
                    // The record is durable before LMDB commits: a reader
                    // never sees a change that a crash could take back.
                    wal.append(&pending.record)?;
                    // The log holds the pass: members may hear so before
                    // LMDB commits (answers to callers wait for that
                    // commit).
                    groups.persisted(pending);
                    txn.commit().map_err(lmdb_err)?;
                }
                groups.settle();
                wal.set_groups(groups.carry()?, groups.speculating());
                // An installed snapshot is durable only with a checkpoint.
                let epoch = wal.epoch();
                if groups.installing() {
                    wal.request_checkpoint();
                }
                // The group is durable whatever a checkpoint says.
                if let Err(e) = wal.after_commit() {
                    tracing::error!(env = %env.path().display(), error = %e, "metadata checkpoint failed");
                }
                if wal.epoch() > epoch {
                    groups.durable();
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = persisted {
        groups.stop(&e);
        answer_all(&mut early, Err(e.clone()));
        return Err(e);
    }
    groups.make_snapshots();
    Ok(())
}

/// Answers the callers of `early` (those not answered yet) with `result`.
fn answer_all(early: &mut Vec<Completion>, result: FsResult<()>) {
    for completion in early.drain(..) {
        completion(result.clone());
    }
}

/// Zero-filled space kept ahead of LMDB's last page.
struct Headroom {
    env: Env<WithoutTls>,
    page_size: u64,
    file: Option<std::fs::File>,
    /// Whether the last try to preallocate failed (warned once, not at
    /// every pass while the disk stays full).
    failing: bool,
}

impl Headroom {
    const MIN_STEP: u64 = 4 << 20;
    const MAX_STEP: u64 = 256 << 20;

    fn new(env: &Env<WithoutTls>) -> Headroom {
        let page_size = env.unnamed_database_stat().page_size.max(512) as u64;
        let file = OpenOptions::new()
            .write(true)
            .open(env.path().join("data.mdb"))
            .ok();
        Headroom {
            env: env.clone(),
            page_size,
            file,
            failing: false,
        }
    }

    fn keep_ahead(&mut self) {
        let Some(file) = &self.file else { return };
        let info = self.env.info();
        let used = (info.last_page_number as u64 + 1) * self.page_size;
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return;
        };
        let step = (len / 4).clamp(Self::MIN_STEP, Self::MAX_STEP);
        if len.saturating_sub(used) >= step / 2 {
            return;
        }
        let target = (len + step).min(info.map_size as u64);
        let zeros = vec![0u8; 1 << 20];
        let mut at = len;
        while at < target {
            let n = (target - at).min(zeros.len() as u64) as usize;
            if let Err(e) = file.write_all_at(&zeros[..n], at) {
                if !self.failing {
                    tracing::warn!(
                        env = %self.env.path().display(),
                        error = %e,
                        left = len.saturating_sub(used) + (at - len),
                        "cannot preallocate metadata file space: once LMDB has used the bytes left, \
                         the next commit fails and the node stops (status 74) until there is room"
                    );
                }
                self.failing = true;
                return;
            }
            at += n as u64;
        }
        if let Err(e) = file.sync_data() {
            tracing::warn!(error = %e, "cannot sync preallocated metadata file space");
            return;
        }
        if std::mem::take(&mut self.failing) {
            tracing::info!(env = %self.env.path().display(), "metadata file space preallocated again");
        }
    }
}

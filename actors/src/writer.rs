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
//! durable.
//!
//! The thread also keeps zero-filled space ahead of the end of LMDB's data
//! file: a commit that writes inside the file costs one journal-free
//! fdatasync, while one that extends the file costs an ext4 journal commit
//! as well (measured here: 2.5k against 4.0k fdatasync/s).

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use heed::{Env, WithoutTls};

use curvine_messages::wal::Change;
use curvine_messages::{now_ns, FsError, FsResult, ShardId};

use crate::replica::Groups;
use crate::store::{lmdb_err, ShardStore};
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
}

struct Inner {
    tx: mpsc::Sender<Job>,
}

/// Handle to an environment's write thread, for one shard. The thread
/// commits what is queued and exits when the last handle is dropped.
#[derive(Clone)]
pub struct Writer {
    inner: Arc<Inner>,
    shard: ShardId,
}

fn running() -> &'static Mutex<HashMap<PathBuf, Weak<Inner>>> {
    static RUNNING: OnceLock<Mutex<HashMap<PathBuf, Weak<Inner>>>> = OnceLock::new();
    RUNNING.get_or_init(Default::default)
}

impl Writer {
    /// The write thread of `store`'s environment, started on first use and
    /// shared by every shard whose databases live in that environment.
    pub fn for_store(store: &ShardStore, group_max: usize, commit_delay: Duration) -> Writer {
        let env = store.env();
        let shard = store.shard;
        let mut map = running()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let path = env.path().to_path_buf();
        if let Some(inner) = map.get(&path).and_then(Weak::upgrade) {
            return Writer { inner, shard };
        }
        let groups = Groups::new(store.replica_id, store.tables());
        let (tx, rx) = mpsc::channel::<Job>();
        let name = format!(
            "lmdb-writer-{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("env")
        );
        std::thread::Builder::new()
            .name(name)
            .spawn(move || run(env, groups, rx, group_max.max(1), commit_delay))
            .expect("spawning a thread only fails when the OS is out of resources");
        let inner = Arc::new(Inner { tx });
        map.insert(path, Arc::downgrade(&inner));
        Writer { inner, shard }
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
        let _ = self.inner.tx.send(Job {
            shard: self.shard,
            run,
        });
    }
}

fn run(
    env: &'static Env<WithoutTls>,
    mut groups: Groups,
    rx: mpsc::Receiver<Job>,
    group_max: usize,
    commit_delay: Duration,
) {
    let mut space = Headroom::new(env);
    let wal = crate::wal::of(env);
    let mut last_batch = 0;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < group_max {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Several callers shared the last commit: they are likely sending
        // their next mutations right now. Waiting a moment for them puts
        // them in this commit instead of the next (PostgreSQL's
        // commit_delay). A lone caller never waits.
        // It stops waiting once as many have come as shared the last commit.
        if last_batch > 1 && !commit_delay.is_zero() {
            let deadline = Instant::now() + commit_delay;
            while batch.len() < group_max.min(last_batch) {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
        }
        last_batch = batch.len();
        let commit = commit_batch(env, &wal, &mut groups, &mut batch);
        if let Err(e) = &commit {
            tracing::error!(env = %env.path().display(), error = %e, "metadata commit failed");
        }
        // Jobs never started (the transaction failed early) are dropped: their
        // reply ports close and callers see the shard as unavailable.
        drop(batch);
        space.keep_ahead();
    }
    tracing::debug!(env = %env.path().display(), "metadata writer stopped");
}

/// One group commit: runs the jobs of `batch` (each in a nested
/// transaction), proposes what each shard's jobs changed as one entry of its
/// group, makes the groups' new entries durable as one record of the log
/// (or, without a log, with LMDB's own synced commit), commits LMDB, and
/// answers each job once its shard committed what the job saw.
fn commit_batch(
    env: &'static Env<WithoutTls>,
    wal: &Option<Arc<Mutex<crate::wal::Wal>>>,
    groups: &mut Groups,
    batch: &mut Vec<Job>,
) -> FsResult<()> {
    let mut txn = env.write_txn().map_err(lmdb_err)?;
    let mut changes: BTreeMap<ShardId, Vec<Change>> = BTreeMap::new();
    let mut completions: Vec<(ShardId, Completion)> = Vec::with_capacity(batch.len());
    let ran = (|| -> FsResult<()> {
        for job in batch.drain(..) {
            let completion = match groups.check_leader(&txn, job.shard) {
                Ok(()) => {
                    let nested = env.nested_write_txn(&mut txn).map_err(lmdb_err)?;
                    let mut nested = WriteTxn::new(nested);
                    let (ok, completion) = (job.run)(Ok(&mut nested));
                    if ok {
                        let made = nested.commit().map_err(lmdb_err)?;
                        if !made.is_empty() {
                            changes.entry(job.shard).or_default().extend(made);
                        }
                    } else {
                        nested.abort();
                    }
                    completion
                }
                Err(refused) => (job.run)(Err(refused)).1,
            };
            completions.push((job.shard, completion));
        }
        Ok(())
    })();
    if let Err(e) = ran {
        for (_, completion) in completions {
            completion(Err(e.clone()));
        }
        return Err(e);
    }
    // From the first proposal on, the groups' logs and LMDB must move
    // together: a failure stops every change until the node restarts (and
    // recovers both from the log).
    let proposed = (|| -> FsResult<_> {
        for (shard, made) in &changes {
            groups.propose(*shard, made)?;
        }
        Ok(())
    })();
    for (shard, completion) in completions {
        groups.wait(shard, completion);
    }
    if let Err(e) = proposed {
        groups.stop(&e);
        return Err(e);
    }
    let persisted = (|| -> FsResult<_> {
        let pending = groups.collect(&mut txn)?;
        match wal {
            None => txn.commit().map_err(lmdb_err)?,
            Some(wal) => {
                // The record is durable before LMDB commits: a reader never
                // sees a change that a crash could take back.
                let mut wal = wal.lock().unwrap_or_else(|p| p.into_inner());
                wal.append(&pending.record)?;
                txn.commit().map_err(lmdb_err)?;
                // The group is durable whatever a checkpoint says.
                if let Err(e) = wal.after_commit() {
                    tracing::error!(env = %env.path().display(), error = %e, "metadata checkpoint failed");
                }
            }
        }
        Ok(pending)
    })();
    match persisted {
        Ok(pending) => {
            groups.persisted(pending);
            Ok(())
        }
        Err(e) => {
            groups.stop(&e);
            Err(e)
        }
    }
}

/// Zero-filled space kept ahead of LMDB's last page.
struct Headroom {
    env: &'static Env<WithoutTls>,
    page_size: u64,
    file: Option<std::fs::File>,
}

impl Headroom {
    const MIN_STEP: u64 = 4 << 20;
    const MAX_STEP: u64 = 256 << 20;

    fn new(env: &'static Env<WithoutTls>) -> Headroom {
        let page_size = env.unnamed_database_stat().page_size.max(512) as u64;
        let file = OpenOptions::new()
            .write(true)
            .open(env.path().join("data.mdb"))
            .ok();
        Headroom {
            env,
            page_size,
            file,
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
                tracing::warn!(error = %e, "cannot preallocate metadata file space");
                return;
            }
            at += n as u64;
        }
        if let Err(e) = file.sync_data() {
            tracing::warn!(error = %e, "cannot sync preallocated metadata file space");
        }
    }
}

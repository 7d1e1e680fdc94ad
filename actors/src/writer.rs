//! The write thread of one shard environment, with group commit.
//!
//! LMDB write transactions must stay on one OS thread, so each shard has a
//! dedicated thread that owns every write. It takes all queued mutations (up
//! to `meta.group_commit_max`), runs each in a nested transaction of one
//! write transaction, commits once (one fsync), and only then answers each
//! caller. A mutation that fails or panics is rolled back alone; the others
//! still commit. An acknowledged mutation is therefore durable.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use heed::RwTxn;

use curvine_messages::{FsError, FsResult};

use crate::store::{lmdb_err, ShardStore};

/// Called once the transaction a mutation ran in has committed (`Ok`) or failed.
type Completion = Box<dyn FnOnce(FsResult<()>) + Send>;
/// A mutation: runs inside a nested transaction; says whether it succeeded
/// and what to do after the commit.
type Job = Box<dyn FnOnce(&ShardStore, &mut RwTxn<'_>) -> (bool, Completion) + Send>;

/// Handle to a shard's write thread. Dropping every handle lets the thread
/// commit what is queued and exit.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the write thread of `store`.
    pub fn start(store: Arc<ShardStore>, group_max: usize) -> (Writer, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel::<Job>();
        let name = format!("shard-{}-writer", store.shard);
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(store, rx, group_max.max(1)))
            .expect("spawning a thread only fails when the OS is out of resources");
        (Writer { tx }, handle)
    }

    /// Queues a mutation; `reply` gets its result once it is durable.
    pub fn submit<T, F, R>(&self, mutation: F, reply: R)
    where
        T: Send + 'static,
        F: FnOnce(&ShardStore, &mut RwTxn<'_>) -> FsResult<T> + Send + 'static,
        R: FnOnce(FsResult<T>) + Send + 'static,
    {
        let job: Job = Box::new(move |store, txn| {
            let result =
                catch_unwind(AssertUnwindSafe(|| mutation(store, txn))).unwrap_or_else(|_| {
                    Err(FsError::Io(
                        "internal error: metadata mutation panicked".into(),
                    ))
                });
            let ok = result.is_ok();
            let completion: Completion = Box::new(move |commit: FsResult<()>| match commit {
                Ok(()) => reply(result),
                Err(e) => reply(Err(e)),
            });
            (ok, completion)
        });
        // If the thread is gone the job is dropped with its reply, and the
        // caller sees the shard as unavailable instead of waiting forever.
        let _ = self.tx.send(job);
    }
}

fn run(store: Arc<ShardStore>, rx: mpsc::Receiver<Job>, group_max: usize) {
    let env = store.env();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < group_max {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut completions: Vec<Completion> = Vec::with_capacity(batch.len());
        let commit = (|| -> FsResult<()> {
            let mut txn = env.write_txn().map_err(lmdb_err)?;
            for job in batch.drain(..) {
                let mut nested = env.nested_write_txn(&mut txn).map_err(lmdb_err)?;
                let (ok, completion) = job(&store, &mut nested);
                if ok {
                    nested.commit().map_err(lmdb_err)?;
                } else {
                    nested.abort();
                }
                completions.push(completion);
            }
            txn.commit().map_err(lmdb_err)
        })();
        if let Err(e) = &commit {
            tracing::error!(shard = store.shard, error = %e, "metadata commit failed");
        }
        // Jobs never started (the transaction failed early) are dropped: their
        // reply ports close and callers see the shard as unavailable.
        drop(batch);
        for completion in completions {
            completion(commit.clone());
        }
    }
    tracing::debug!(shard = store.shard, "writer stopped");
}

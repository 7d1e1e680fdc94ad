//! The storage engine of one metadata environment: the LMDB environment,
//! its write-ahead log (`wal`) and its write thread (`writer`), owned by
//! one object. The stores and the writer name the engine; the engine names
//! neither (it keeps the write thread's handle without knowing its type).
//!
//! Whoever opens an environment holds its [`Engine`] and hands it to the
//! shard stores that live in it (`ShardStore::open`); no registry of the
//! process finds it by path. Dropping the last handle
//! (the engine, its stores, the writers and the log's pinned snapshot)
//! closes the environment, so a test can open an environment, drop it
//! without a clean stop (a crash of the process, as LMDB's pages already
//! handed to the kernel survive one) and open it again in the same
//! process, which recovers it from its log. [`Engine::close`] is the clean
//! stop: a last checkpoint, after which nothing is left to apply.
//!
//! LMDB allows one environment per path per process: opening a path whose
//! engine is still alive is refused with an error naming it.

use std::any::Any;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use heed::{Env, EnvOpenOptions, WithoutTls};

use curvine_messages::{FsError, FsResult};

use crate::clock::Clock;
pub use crate::faults::DiskFaults;
use crate::wal::{Wal, WalOptions};

/// Options for opening an environment.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub map_size: u64,
    pub max_readers: u32,
    pub sync_commit: bool,
    /// Make changes durable with a write-ahead log (`meta.wal`) instead of
    /// LMDB's synced commits.
    pub wal: bool,
    pub wal_size: u64,
    pub checkpoint_interval: std::time::Duration,
    /// This node's member id in the shards' Raft groups
    /// (`replica::member_id` of its node id).
    pub replica_id: u64,
}

/// One metadata environment, its log and its write thread.
pub struct Engine {
    env: Env<WithoutTls>,
    options: StoreOptions,
    clock: Clock,
    faults: DiskFaults,
    wal: Option<Arc<Mutex<Wal>>>,
    /// The write thread's handle, while a `Writer` of it lives (the writer
    /// module's own type).
    pub(crate) writer: Mutex<Weak<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("path", &self.env.path())
            .finish()
    }
}

impl Engine {
    /// Opens (creating it when missing) the environment at `path`: a log
    /// left by the last run is applied first (see [`crate::wal`]).
    pub fn open(path: &Path, options: &StoreOptions) -> FsResult<Arc<Engine>> {
        Self::open_with_clock(path, options, Clock::system())
    }

    /// [`Self::open`] on `clock` (a manual clock in tests and the
    /// simulation: its write thread, log and groups read that time).
    pub fn open_with_clock(
        path: &Path,
        options: &StoreOptions,
        clock: Clock,
    ) -> FsResult<Arc<Engine>> {
        let faults = DiskFaults::default();
        let (env, wal) = open_env(path, options, (clock.clone(), faults.clone()))?;
        Ok(Arc::new(Engine {
            env,
            options: options.clone(),
            clock,
            faults,
            wal: wal.map(|w| Arc::new(Mutex::new(w))),
            writer: Mutex::new(Weak::<()>::new()),
        }))
    }

    pub fn env(&self) -> &Env<WithoutTls> {
        &self.env
    }

    pub fn path(&self) -> &Path {
        self.env.path()
    }

    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Where a test arms disk faults of this engine.
    pub fn faults(&self) -> &DiskFaults {
        &self.faults
    }

    /// An event set once the environment is closed: once the engine, its
    /// stores, its writers and its log are all dropped (tests reopening
    /// an environment in the same process wait for it).
    pub fn closing(&self) -> heed::EnvClosingEvent {
        self.env.clone().prepare_for_closing()
    }

    /// The environment's log, when it has one (`meta.wal`).
    pub fn wal(&self) -> Option<&Arc<Mutex<Wal>>> {
        self.wal.as_ref()
    }

    fn lock_wal(wal: &Mutex<Wal>) -> MutexGuard<'_, Wal> {
        wal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes everything committed so far durable: a checkpoint of the log
    /// (without one, LMDB synced its commits itself).
    pub fn checkpoint(&self) -> FsResult<()> {
        match &self.wal {
            Some(wal) => Self::lock_wal(wal).checkpoint(),
            None => Ok(()),
        }
    }

    /// A clean stop: ends the log with a checkpoint, so the next open has
    /// nothing to apply. Commits made after it are still logged.
    pub fn close(&self) {
        if let Some(wal) = &self.wal {
            Self::lock_wal(wal).close();
        }
    }
}

/// Opens the LMDB environment at `path` and recovers it from its log.
pub(crate) fn open_env(
    path: &Path,
    options: &StoreOptions,
    seams: (Clock, DiskFaults),
) -> FsResult<(Env<WithoutTls>, Option<Wal>)> {
    std::fs::create_dir_all(path)
        .map_err(|e| FsError::Io(format!("create {}: {e}", path.display())))?;
    // A log left by the last run puts LMDB back on its last checkpoint
    // first; its records are applied once the environment is open.
    let recovery = crate::wal::restore_base(path)?;
    let mut opts = EnvOpenOptions::new().read_txn_without_tls();
    opts.map_size(options.map_size as usize)
        .max_dbs(16)
        // One more reader: the log's hold on its checkpoint.
        .max_readers(options.max_readers + 1);
    if options.wal || !options.sync_commit {
        // With the log, LMDB commits without sync and is flushed at
        // checkpoints (see `wal`). Without it, NO_SYNC alone keeps the
        // database intact only until a machine crash. WRITE_MAP is never
        // used.
        unsafe {
            opts.flags(heed::EnvFlags::NO_SYNC);
        }
    }
    // SAFETY: heed refuses a second open of a path in this process
    // (`EnvAlreadyOpened`), and no other process opens a node's data
    // directory (the node holds a lock file).
    let env = match unsafe { opts.open(path) } {
        Ok(env) => env,
        Err(heed::Error::EnvAlreadyOpened) => {
            return Err(FsError::Io(format!(
                "the metadata environment {} is already open in this process",
                path.display()
            )))
        }
        Err(e) => return Err(crate::txn::lmdb_err(e)),
    };
    let wal = options.wal.then_some(WalOptions {
        sync: options.sync_commit,
        size: options.wal_size,
        checkpoint_interval: options.checkpoint_interval,
    });
    let wal = Wal::open(&env, recovery, wal, seams)?;
    Ok((env, wal))
}

//! fs_mode persistence: the node serving shard 0 replays the UFS journal in
//! order (uploads of closed files, deletes, renames), and sweeps fs_mode
//! mounts now and then for files still waiting (a journal record lost with a
//! crash, a failed upload due for another try). The `UfsLoader` actor
//! (`loader`) drives both on a timer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use curvine_actors::cluster::ClusterView;
use curvine_actors::mounts::Mounts;
use curvine_actors::namespace::Namespace;
use curvine_messages::mount::{MountInfo, Persist, UfsOp, UfsState, WriteType};
use curvine_messages::rpc::PersistLag;
use curvine_messages::shard::ShardMsg;
use curvine_messages::trace::TraceCtx;
use curvine_messages::{now_ns, shard_of, FileKind, FsError, FsResult, Ino};

use super::fills::{synced_state, Fills};
use super::journal::Journal;

/// A file waiting this long with no journal record is picked up by the sweep.
const SWEEP_GRACE: Duration = Duration::from_secs(10);

pub struct Persistence {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
    mounts: Arc<Mounts>,
    fills: Arc<Fills>,
    journal: Arc<Journal>,
    /// What waits for the UFS, as the last pass found it, less what it
    /// uploaded since.
    lag: parking_lot::Mutex<PersistLag>,
    /// Files whose upload failed, waiting for another try: size and when
    /// they were changed.
    failed: parking_lot::Mutex<std::collections::HashMap<Ino, (u64, i64)>>,
}

impl Persistence {
    pub fn new(
        namespace: Arc<Namespace>,
        view: Arc<ClusterView>,
        mounts: Arc<Mounts>,
        fills: Arc<Fills>,
        journal: Arc<Journal>,
    ) -> Persistence {
        Persistence {
            namespace,
            view,
            mounts,
            fills,
            journal,
            lag: Default::default(),
            failed: Default::default(),
        }
    }

    /// What waits for the UFS (on the node serving shard 0; zero elsewhere).
    pub fn lag(&self) -> PersistLag {
        if !self.journal.served_here() {
            return PersistLag::default();
        }
        let mut lag = *self.lag.lock();
        for &(size, since) in self.failed.lock().values() {
            lag.files += 1;
            lag.bytes += size;
            if lag.oldest_ns == 0 || since < lag.oldest_ns {
                lag.oldest_ns = since;
            }
        }
        lag
    }

    /// Counts what `entries` (a journal batch) leave waiting.
    async fn note_lag(&self, entries: &[curvine_messages::mount::JournalEntry]) -> Vec<u64> {
        let mut sizes = Vec::with_capacity(entries.len());
        let mut lag = PersistLag {
            oldest_ns: entries.first().map(|e| e.at_ns).unwrap_or(0),
            ..Default::default()
        };
        for e in entries {
            let size = match &e.op {
                UfsOp::Put { ino, .. } => {
                    lag.files += 1;
                    self.namespace
                        .getattr(*ino)
                        .await
                        .map(|a| a.size)
                        .unwrap_or(0)
                }
                _ => 0,
            };
            lag.bytes += size;
            sizes.push(size);
        }
        *self.lag.lock() = lag;
        sizes
    }

    /// Persists a file in a task of `uploads` once one of `slots` is free,
    /// as a span of `trace` (`size`: its bytes counted in the lag).
    async fn spawn_persist(
        self: &Arc<Self>,
        uploads: &mut JoinSet<()>,
        slots: &Arc<Semaphore>,
        (path, ino, size): (String, Ino, Option<u64>),
        retry: (Duration, Duration),
        trace: Option<TraceCtx>,
    ) {
        let permit = slots.clone().acquire_owned().await.expect("open semaphore");
        let this = self.clone();
        uploads.spawn(async move {
            let _ = this
                .view
                .tracer
                .in_span(
                    trace,
                    "ufs-loader",
                    "persist",
                    this.persist_file(&path, ino, retry),
                )
                .await;
            // A journal record's upload leaves the lag (a sweep's was
            // not counted in it); one that failed waits among the failed.
            if let Some(size) = size {
                let mut lag = this.lag.lock();
                lag.files = lag.files.saturating_sub(1);
                lag.bytes = lag.bytes.saturating_sub(size);
            }
            drop(permit);
        });
    }

    /// One pass: applies what the journal holds (on the node serving shard 0).
    pub async fn persist_pass(
        self: &Arc<Self>,
        loaders: usize,
        retry: (Duration, Duration),
    ) -> FsResult<usize> {
        if !self.journal.served_here() {
            return Ok(0);
        }
        let entries = self.journal.read().await?;
        let sizes = self.note_lag(&entries).await;
        if entries.is_empty() {
            return Ok(0);
        }
        let slots = Arc::new(Semaphore::new(loaders.max(1)));
        let mut uploads: JoinSet<()> = JoinSet::new();
        let mut applied = 0u64;
        let mut count = 0;
        let mut stopped: Option<FsError> = None;
        for (entry, size) in entries.into_iter().zip(sizes) {
            let Some(mount) = self.mounts.table().by_id(entry.mount).cloned() else {
                applied = entry.seq; // the mount is gone: nothing to replay
                continue;
            };
            match entry.op {
                // The replay joins the trace of the change, if it had one.
                UfsOp::Put { path, ino } => {
                    let trace = entry.trace.or_else(|| self.view.tracer.sampled_root());
                    self.spawn_persist(&mut uploads, &slots, (path, ino, Some(size)), retry, trace)
                        .await;
                }
                op => {
                    // Deletes and renames wait for the uploads before them.
                    while uploads.join_next().await.is_some() {}
                    let trace = entry.trace.or_else(|| self.view.tracer.sampled_root());
                    let replayed = self
                        .view
                        .tracer
                        .in_span(trace, "ufs-loader", "replay", self.replay(&mount, &op))
                        .await;
                    if let Err(e) = replayed {
                        tracing::warn!(mount = %mount.path, error = %e, "replaying a change on the UFS failed; retrying");
                        stopped = Some(e);
                        break;
                    }
                }
            }
            applied = entry.seq;
            count += 1;
        }
        while uploads.join_next().await.is_some() {}
        if applied > 0 {
            self.journal.trim(applied).await?;
        }
        match stopped {
            Some(e) => Err(e),
            None => Ok(count),
        }
    }

    /// Applies a delete or rename to the UFS when the namespace agrees it
    /// happened (a replay never undoes a later change).
    async fn replay(&self, m: &MountInfo, op: &UfsOp) -> FsResult<()> {
        let ufs = self.mounts.client(m)?;
        let rel = |p: &str| m.relative(p).map(str::to_string);
        let exists = |p: String| async move {
            match self.namespace.stat(&p, false).await {
                Ok(a) => Ok(Some(a)),
                Err(FsError::NotFound(_)) => Ok(None),
                Err(e) => Err(e),
            }
        };
        match op {
            UfsOp::Put { .. } => Ok(()),
            UfsOp::Delete { path, dir } => {
                let Some(r) = rel(path) else { return Ok(()) };
                if r.is_empty() || exists(path.clone()).await?.is_some() {
                    return Ok(());
                }
                if *dir {
                    ufs.delete_dir(&r).await
                } else {
                    ufs.delete(&r).await
                }
            }
            UfsOp::Rename { from, to, dir } => {
                let (Some(fr), Some(tr)) = (rel(from), rel(to)) else {
                    return Ok(());
                };
                if exists(from.clone()).await?.is_some() {
                    return Ok(());
                }
                let Some(target) = exists(to.clone()).await? else {
                    return Ok(());
                };
                if *dir {
                    return match ufs.rename(&fr, &tr, true).await {
                        Ok(()) | Err(FsError::NotFound(_)) => Ok(()),
                        Err(e) => Err(e),
                    };
                }
                let persisted = target
                    .ufs
                    .as_ref()
                    .is_some_and(|u| u.persist == Persist::Synced);
                if !persisted {
                    // Its upload goes to the new name; the old object goes.
                    return ufs.delete(&fr).await;
                }
                match ufs.rename(&fr, &tr, false).await {
                    Ok(()) => Ok(()),
                    Err(FsError::NotFound(_)) => {
                        // Nothing under the old name: upload under the new one.
                        let state = UfsState::pending(m.id, now_ns());
                        self.namespace
                            .set_ufs(target.ino, Some(state))
                            .await
                            .map(|_| ())
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Uploads file `ino` at `path` when it still waits to be persisted;
    /// records success, or the failure and when to try again. Returns the
    /// upload's error (`Ok` also when there was nothing to do).
    pub async fn persist_file(
        &self,
        path: &str,
        ino: Ino,
        retry: (Duration, Duration),
    ) -> FsResult<()> {
        let attr = match self.namespace.stat(path, false).await {
            Ok(a) if a.ino == ino && a.kind == FileKind::File && a.writing.is_none() => a,
            _ => return Ok(()),
        };
        let Some(state) = attr.ufs.clone() else {
            return Ok(());
        };
        let Some(since) = state.persist.since_ns() else {
            return Ok(());
        };
        let Some((m, rel)) = self
            .mounts
            .find(path)
            .filter(|(m, _)| m.id == state.mount && m.write_type == WriteType::FsMode)
        else {
            return Ok(());
        };
        let outcome = async {
            let ufs = self.mounts.client(&m)?;
            let (_, blocks) = self.namespace.file_blocks_ino(ino).await?;
            self.fills.upload(&ufs, &rel, &attr, &blocks).await
        }
        .await;
        let next = match &outcome {
            Ok(obj) => {
                tracing::debug!(path, bytes = obj.len, "persisted");
                synced_state(&m, obj)
            }
            Err(e) => {
                let attempts = match &state.persist {
                    Persist::Failed { attempts, .. } => attempts + 1,
                    _ => 1,
                };
                let delay = retry.0.saturating_mul(1 << attempts.min(16)).min(retry.1);
                tracing::warn!(path, attempts, retry_in = ?delay, error = %e, "persisting a file failed");
                UfsState {
                    persist: Persist::Failed {
                        since_ns: since,
                        attempts,
                        error: e.to_string(),
                        next_ns: now_ns() + delay.as_nanos() as i64,
                    },
                    ..state.clone()
                }
            }
        };
        let stored = self
            .namespace
            .call_shard(shard_of(ino), move |reply| ShardMsg::UfsPersisted {
                ino,
                since_ns: since,
                state: next.clone(),
                reply,
            })
            .await;
        if let Err(e) = &stored {
            tracing::warn!(path, error = %e, "recording a file's persistence failed");
        }
        if outcome.is_ok() {
            self.failed.lock().remove(&ino);
        } else {
            self.failed.lock().insert(ino, (attr.size, since));
        }
        outcome.and(stored).map(drop)
    }

    /// The files below directory `root` that `keep` picks, with their paths.
    pub async fn files_under(
        &self,
        root: &str,
        keep: impl Fn(&curvine_messages::Attr) -> bool,
    ) -> FsResult<Vec<(String, curvine_messages::Attr)>> {
        let mut out = Vec::new();
        let mut dirs = vec![root.to_string()];
        while let Some(dir) = dirs.pop() {
            let mut after = None;
            loop {
                let page = match self.namespace.list(&dir, after.clone(), 1024).await {
                    Ok(p) => p,
                    Err(FsError::NotFound(_)) => break,
                    Err(e) => return Err(e),
                };
                for e in &page.entries {
                    let path = format!("{}/{}", dir.trim_end_matches('/'), e.name);
                    match e.attr.kind {
                        FileKind::Dir => dirs.push(path),
                        FileKind::File if keep(&e.attr) => out.push((path, e.attr.clone())),
                        _ => {}
                    }
                }
                if !page.more {
                    break;
                }
                after = page.entries.last().map(|e| e.name.clone());
            }
        }
        Ok(out)
    }

    /// Refuses to unmount an fs_mode mount whose content is not all in its
    /// UFS yet (unmounting drops what the cluster holds of it).
    pub async fn check_umount(&self, path: &str) -> FsResult<()> {
        let path = curvine_messages::path::normalize(path, "/")?;
        let table = self.mounts.refresh(&self.namespace).await?;
        let Some(m) = table.mounts.iter().find(|m| m.path == path) else {
            return Ok(());
        };
        if m.write_type != WriteType::FsMode {
            return Ok(());
        }
        let journal = self.journal.read().await?;
        let queued = journal.iter().filter(|e| e.mount == m.id).count();
        let waiting_files = self
            .files_under(&m.path, |a| {
                a.writing.is_some() || a.ufs.as_ref().is_none_or(|u| u.persist != Persist::Synced)
            })
            .await?;
        let waiting = waiting_files.len();
        let example = waiting_files
            .first()
            .map(|(p, _)| p.clone())
            .unwrap_or_default();
        if waiting > 0 || queued > 0 {
            return Err(FsError::Busy(format!(
                "{path} is an fs_mode mount with {waiting} file(s) not persisted yet (e.g. {}) and {queued} change(s) to replay; `fs stat` shows why; unmount when they are persisted",
                if example.is_empty() { "-" } else { &example }
            )));
        }
        Ok(())
    }

    /// Walks every fs_mode mount for files still waiting past the grace
    /// period, or failed and due again, and persists them.
    pub async fn persist_sweep(
        self: &Arc<Self>,
        loaders: usize,
        retry: (Duration, Duration),
    ) -> FsResult<usize> {
        if !self.journal.served_here() {
            return Ok(0);
        }
        let table = self.mounts.table();
        let slots = Arc::new(Semaphore::new(loaders.max(1)));
        let mut uploads: JoinSet<()> = JoinSet::new();
        let mut found = 0;
        let now = now_ns();
        for m in table
            .mounts
            .iter()
            .filter(|m| m.write_type == WriteType::FsMode)
        {
            let due = self
                .files_under(&m.path, |a| {
                    a.writing.is_none()
                        && match a.ufs.as_ref().map(|u| &u.persist) {
                            Some(Persist::Pending { since_ns }) => {
                                now - since_ns > SWEEP_GRACE.as_nanos() as i64
                            }
                            Some(Persist::Failed { next_ns, .. }) => *next_ns <= now,
                            _ => false,
                        }
                })
                .await?;
            for (path, attr) in due {
                found += 1;
                let trace = self.view.tracer.sampled_root();
                self.spawn_persist(&mut uploads, &slots, (path, attr.ino, None), retry, trace)
                    .await;
            }
        }
        while uploads.join_next().await.is_some() {}
        self.expire_cached(&table).await?;
        Ok(found)
    }

    /// Drops the cached blocks of files of mounts with a `--ttl` whose data
    /// was read from (or last checked against) the UFS longer ago than it.
    async fn expire_cached(&self, table: &curvine_messages::mount::MountTable) -> FsResult<()> {
        let now = now_ns();
        for m in table.mounts.iter().filter(|m| m.ttl_ms > 0) {
            let ttl = (m.ttl_ms as i64).saturating_mul(1_000_000);
            let old = self
                .files_under(&m.path, |a| {
                    a.writing.is_none()
                        && a.ufs.as_ref().is_some_and(|u| {
                            u.persist == Persist::Synced && now - u.checked_ns > ttl
                        })
                })
                .await?;
            for (path, attr) in old {
                let (_, blocks) = self.namespace.file_blocks_ino(attr.ino).await?;
                if blocks.is_empty() {
                    continue;
                }
                let ino = attr.ino;
                match self
                    .namespace
                    .call_shard(shard_of(ino), move |reply| ShardMsg::UfsEvict {
                        ino,
                        reply,
                    })
                    .await
                {
                    Ok(n) => tracing::debug!(path, blocks = n, "cached data expired (mount ttl)"),
                    Err(e) => tracing::debug!(path, error = %e, "expiring cached data"),
                }
            }
        }
        Ok(())
    }
}

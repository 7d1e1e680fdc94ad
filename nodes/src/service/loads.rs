//! Load jobs: cache everything under a path of a mount ahead of its
//! readers. The node serving shard 0 coordinates each job (its record and
//! its tasks live in shard 0, so a restarted node resumes it): it lists the
//! UFS tree page by page, records the files in the namespace and as tasks,
//! then hands the files' blocks to the UfsLoaders of the live nodes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use tokio::task::JoinSet;

use curvine_messages::cluster::{LoadPart, PeerMsg};
use curvine_messages::codec::{decode_versioned, encode_versioned};
use curvine_messages::mount::{
    JobState, LoadJob, LoadTask, MountInfo, Persist, WriteType, MAX_JOB_FAILURES,
};
use curvine_messages::shard::ShardMsg;
use curvine_messages::{now_ns, shard_of, FileKind, FsError, FsResult};

use curvine_actors::cluster::ClusterView;
use curvine_actors::mounts::Mounts;
use curvine_actors::namespace::Namespace;

use super::fills::Fills;
use super::journal::Journal;
use super::placement::Placement;

/// Files listed per page (and task records written per batch).
const LIST_PAGE: usize = 1000;
/// Tries of a file before it counts as failed.
const ATTEMPTS: u32 = 3;
/// How long a finished job stays listed by `load-status`.
const JOB_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

fn job_key(id: &str) -> Vec<u8> {
    format!("job/{id}").into_bytes()
}

fn task_prefix(id: &str) -> Vec<u8> {
    format!("jtask/{id}/").into_bytes()
}

fn task_key(id: &str, n: u64) -> Vec<u8> {
    let mut k = task_prefix(id);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

pub struct Loads {
    namespace: Arc<Namespace>,
    view: Arc<ClusterView>,
    mounts: Arc<Mounts>,
    fills: Arc<Fills>,
    journal: Arc<Journal>,
    placement: Arc<Placement>,
}

impl Loads {
    pub fn new(
        namespace: Arc<Namespace>,
        view: Arc<ClusterView>,
        mounts: Arc<Mounts>,
        fills: Arc<Fills>,
        journal: Arc<Journal>,
        placement: Arc<Placement>,
    ) -> Loads {
        Loads {
            namespace,
            view,
            mounts,
            fills,
            journal,
            placement,
        }
    }

    async fn records_put(&self, entries: Vec<(Vec<u8>, Vec<u8>)>) -> FsResult<()> {
        self.namespace
            .call_shard(0, move |reply| ShardMsg::RecordPut {
                entries: entries.clone(),
                reply,
            })
            .await
    }

    async fn records_scan(
        &self,
        prefix: Vec<u8>,
        after: Option<Vec<u8>>,
        limit: u32,
    ) -> FsResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.namespace
            .call_shard(0, move |reply| ShardMsg::RecordScan {
                prefix: prefix.clone(),
                after: after.clone(),
                limit,
                reply,
            })
            .await
    }

    async fn save_job(&self, job: &LoadJob) -> FsResult<()> {
        self.records_put(vec![(job_key(&job.id), encode_versioned(job))])
            .await
    }

    pub async fn load_job(&self, id: &str) -> FsResult<LoadJob> {
        let found = self
            .records_scan(job_key(id), None, 1)
            .await?
            .into_iter()
            .find(|(k, _)| k == &job_key(id));
        match found {
            Some((_, v)) => Ok(decode_versioned(&v)?),
            None => Err(FsError::NotFound(format!("no load job {id}"))),
        }
    }

    pub async fn load_jobs(&self) -> FsResult<Vec<LoadJob>> {
        let mut out = Vec::new();
        for (_, v) in self.records_scan(b"job/".to_vec(), None, 10_000).await? {
            out.push(decode_versioned::<LoadJob>(&v)?);
        }
        out.sort_by_key(|j| j.created_ns);
        Ok(out)
    }

    /// The mount path of a `load` argument: a namespace path under a mount,
    /// or a UFS location under a mount's (`s3://bucket/prefix/...`).
    fn load_target(&self, arg: &str) -> FsResult<(MountInfo, String)> {
        if arg.contains("://") {
            let arg = arg.trim_end_matches('/');
            let table = self.mounts.table();
            let found = table.mounts.iter().find_map(|m| {
                let rest = arg.strip_prefix(m.ufs.as_str())?;
                if rest.is_empty() || rest.starts_with('/') {
                    Some((m.clone(), format!("{}{rest}", m.path.trim_end_matches('/'))))
                } else {
                    None
                }
            });
            return found.ok_or_else(|| {
                FsError::InvalidArgument(format!("{arg} is not under any mount (see `mount`)"))
            });
        }
        let path = curvine_messages::path::normalize(arg, "/")?;
        self.mounts
            .find(&path)
            .map(|(m, _)| (m, path.clone()))
            .ok_or_else(|| FsError::InvalidArgument(format!("{path} is not under a mount")))
    }

    /// Creates a load job; the node serving shard 0 runs it.
    pub async fn start_load(&self, arg: &str, no_overwrite: bool) -> FsResult<LoadJob> {
        let (mount, path) = self.load_target(arg)?;
        let now = now_ns();
        let job = LoadJob {
            id: format!("{:08x}", rand::random::<u32>()),
            path,
            mount: mount.id,
            state: JobState::Listing,
            no_overwrite,
            created_ns: now,
            updated_ns: now,
            finished_ns: 0,
            cursor: None,
            tasks: 0,
            files_total: 0,
            files_done: 0,
            files_skipped: 0,
            files_failed: 0,
            bytes_total: 0,
            bytes_done: 0,
            failures: Vec::new(),
            error: String::new(),
            // A traced `load` traces the job's work too.
            trace: curvine_actors::trace::current(),
        };
        self.save_job(&job).await?;
        tracing::info!(job = %job.id, path = %job.path, "load job created");
        Ok(job)
    }

    pub async fn cancel_load(&self, id: &str) -> FsResult<LoadJob> {
        let mut job = self.load_job(id).await?;
        if !job.state.finished() {
            job.state = JobState::Cancelled;
            job.updated_ns = now_ns();
            job.finished_ns = job.updated_ns;
            self.save_job(&job).await?;
        }
        Ok(job)
    }

    /// Jobs this node should drive: unfinished ones, when it serves shard 0.
    pub async fn jobs_to_drive(&self) -> FsResult<Vec<String>> {
        if !self.journal.served_here() {
            return Ok(Vec::new());
        }
        let mut drive = Vec::new();
        let mut expired = Vec::new();
        let now = now_ns();
        for j in self.load_jobs().await? {
            if !j.state.finished() {
                drive.push(j.id);
            } else if now - j.finished_ns > JOB_KEPT.as_nanos() as i64 {
                self.drop_tasks(&j.id).await?;
                expired.push((job_key(&j.id), Vec::new()));
            }
        }
        if !expired.is_empty() {
            self.records_put(expired).await?;
        }
        Ok(drive)
    }

    /// Deletes a finished job's task records (its record keeps the counts
    /// and the first failures).
    async fn drop_tasks(&self, id: &str) -> FsResult<()> {
        loop {
            let page = self.records_scan(task_prefix(id), None, 1024).await?;
            if page.is_empty() {
                return Ok(());
            }
            self.records_put(page.into_iter().map(|(k, _)| (k, Vec::new())).collect())
                .await?;
        }
    }

    /// Runs job `id` to its end (from wherever it stands).
    pub async fn drive_load(self: &Arc<Self>, id: &str, loaders: usize) -> FsResult<()> {
        let mut job = self.load_job(id).await?;
        let Some(mount) = self.mounts.table().by_id(job.mount).cloned() else {
            job.state = JobState::Failed;
            job.error = "its mount was removed".into();
            job.finished_ns = now_ns();
            return self.save_job(&job).await;
        };
        let trace = job.trace;
        if job.state == JobState::Listing {
            let listed = self
                .view
                .tracer
                .in_span(trace, "ufs-loader", "list", self.list_job(&mut job, &mount))
                .await;
            if let Err(e) = listed {
                if self.load_job(id).await?.state == JobState::Cancelled {
                    return Ok(());
                }
                tracing::warn!(job = %job.id, error = %e, "listing for a load job failed");
                job.state = JobState::Failed;
                job.error = e.to_string();
                job.finished_ns = now_ns();
                return self.save_job(&job).await;
            }
        }
        if job.state == JobState::Running {
            self.run_job(&mut job, loaders).await?;
        }
        if self.load_job(id).await?.state.finished() {
            self.drop_tasks(id).await?;
        }
        Ok(())
    }

    /// Lists the UFS tree under the job's path, records its files in the
    /// namespace and as tasks, page by page (resumable at the cursor).
    async fn list_job(&self, job: &mut LoadJob, m: &MountInfo) -> FsResult<()> {
        let ufs = self.mounts.client(m)?;
        let rel = m.relative(&job.path).unwrap_or("").to_string();
        // A single object.
        if job.cursor.is_none() && !rel.is_empty() {
            if let Some(obj) = ufs.stat(&rel).await? {
                if !obj.is_dir {
                    let parent = job.path.rsplit_once('/').map(|(p, _)| p).unwrap_or("/");
                    let parent = if parent.is_empty() { "/" } else { parent };
                    let dir = self.mounts.ensure_dir(&self.namespace, m, parent).await?;
                    let added = self
                        .mounts
                        .add_files(&self.namespace, m, &dir, vec![obj])
                        .await?;
                    let tasks = added
                        .into_iter()
                        .map(|(name, attr)| {
                            (format!("{}/{name}", parent.trim_end_matches('/')), attr)
                        })
                        .collect();
                    self.record_tasks(job, tasks).await?;
                    job.state = JobState::Running;
                    return self.save_job(job).await;
                }
            } else {
                return Err(FsError::NotFound(format!(
                    "{} has nothing at {}",
                    m.ufs,
                    ufs.uri().join(&rel)
                )));
            }
        }
        loop {
            if self.load_job(&job.id).await?.state == JobState::Cancelled {
                job.state = JobState::Cancelled;
                return Ok(());
            }
            let (page, next) = ufs
                .list_tree_page(&rel, job.cursor.as_deref(), LIST_PAGE)
                .await?;
            // Group by directory: one namespace call per directory.
            let mut by_dir: BTreeMap<String, Vec<curvine_actors::ufs::UfsObject>> = BTreeMap::new();
            for (tail, obj) in page {
                let full = format!("{}/{tail}", job.path.trim_end_matches('/'));
                if curvine_messages::path::normalize(&full, "/").is_err() {
                    continue;
                }
                let dir = full
                    .rsplit_once('/')
                    .map(|(d, _)| d.to_string())
                    .unwrap_or_default();
                by_dir.entry(dir).or_default().push(obj);
            }
            let mut tasks = Vec::new();
            for (dir, objs) in by_dir {
                let d = self.mounts.ensure_dir(&self.namespace, m, &dir).await?;
                for (name, attr) in self.mounts.add_files(&self.namespace, m, &d, objs).await? {
                    tasks.push((format!("{}/{name}", dir.trim_end_matches('/')), attr));
                }
            }
            self.record_tasks(job, tasks).await?;
            job.cursor = next;
            if job.cursor.is_none() {
                job.state = JobState::Running;
            }
            job.updated_ns = now_ns();
            self.save_job(job).await?;
            if job.state == JobState::Running {
                return Ok(());
            }
        }
    }

    async fn record_tasks(
        &self,
        job: &mut LoadJob,
        files: Vec<(String, curvine_messages::Attr)>,
    ) -> FsResult<()> {
        let mut entries = Vec::new();
        for (path, attr) in files {
            if attr.kind != FileKind::File {
                continue;
            }
            let task = LoadTask {
                n: job.tasks,
                path,
                ino: attr.ino,
                size: attr.size,
                done: false,
                attempts: 0,
                error: None,
            };
            job.tasks += 1;
            job.files_total += 1;
            job.bytes_total += attr.size;
            entries.push((task_key(&job.id, task.n), encode_versioned(&task)));
        }
        entries.push((job_key(&job.id), encode_versioned(&*job)));
        self.records_put(entries).await
    }

    /// Caches every file of the job, spreading their blocks over the live
    /// nodes, `loaders` at a time per node.
    async fn run_job(self: &Arc<Self>, job: &mut LoadJob, loaders: usize) -> FsResult<()> {
        let mut after: Option<Vec<u8>> = None;
        let mut running: JoinSet<(LoadTask, FsResult<(u64, bool)>)> = JoinSet::new();
        let width = (loaders.max(1) * self.placement.live_nodes().len().max(1)).max(2);
        let mut changed: Vec<LoadTask> = Vec::new();
        let mut last_save = Instant::now();
        let mut next_node = 0usize;
        let mut exhausted = false;
        loop {
            // Keep `width` files in flight.
            while !exhausted && running.len() < width {
                let page = self
                    .records_scan(task_prefix(&job.id), after.clone(), 256)
                    .await?;
                if page.is_empty() {
                    exhausted = true;
                    break;
                }
                after = page.last().map(|(k, _)| k.clone());
                for (_, v) in page {
                    let task: LoadTask = decode_versioned(&v)?;
                    if task.done {
                        continue;
                    }
                    next_node += 1;
                    self.spawn_load_file(&mut running, job, task, next_node, Duration::ZERO);
                }
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            let (mut task, result) = joined.map_err(|e| FsError::Io(format!("load task: {e}")))?;
            match result {
                Ok((bytes, skipped)) => {
                    task.done = true;
                    task.error = None;
                    if skipped {
                        job.files_skipped += 1;
                    } else {
                        job.files_done += 1;
                    }
                    job.bytes_done += if skipped { task.size } else { bytes };
                }
                Err(e) => {
                    task.attempts += 1;
                    if task.attempts < ATTEMPTS && !matches!(e, FsError::NotFound(_)) {
                        tracing::debug!(path = %task.path, error = %e, "loading a file failed; trying again");
                        next_node += 1;
                        let delay = Duration::from_millis(200 * task.attempts as u64);
                        self.spawn_load_file(&mut running, job, task, next_node, delay);
                        continue;
                    }
                    task.done = true;
                    task.error = Some(e.to_string());
                    job.files_failed += 1;
                    if job.failures.len() < MAX_JOB_FAILURES {
                        job.failures.push((task.path.clone(), e.to_string()));
                    }
                }
            }
            changed.push(task);
            if changed.len() >= 64 || last_save.elapsed() > Duration::from_millis(500) {
                if self.flush_job(job, &mut changed).await? == JobState::Cancelled {
                    running.abort_all();
                    return Ok(());
                }
                last_save = Instant::now();
            }
        }
        job.state = JobState::Done;
        job.finished_ns = now_ns();
        if self.flush_job(job, &mut changed).await? == JobState::Cancelled {
            return Ok(());
        }
        tracing::info!(
            job = %job.id,
            files = job.files_done,
            skipped = job.files_skipped,
            failed = job.files_failed,
            bytes = job.bytes_done,
            "load job finished"
        );
        Ok(())
    }

    /// Caches `task`'s file in a task of `running` after `delay`, as a
    /// `load-file` span of the job's trace; its blocks start at the
    /// `start`th live node.
    fn spawn_load_file(
        self: &Arc<Self>,
        running: &mut JoinSet<(LoadTask, FsResult<(u64, bool)>)>,
        job: &LoadJob,
        task: LoadTask,
        start: usize,
        delay: Duration,
    ) {
        let this = self.clone();
        let (no_overwrite, trace) = (job.no_overwrite, job.trace);
        running.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let r = this
                .view
                .tracer
                .in_span(
                    trace,
                    "ufs-loader",
                    "load-file",
                    this.load_file(&task, no_overwrite, start),
                )
                .await;
            (task, r)
        });
    }

    /// Saves progress; returns the state stored (a cancel wins).
    async fn flush_job(
        &self,
        job: &mut LoadJob,
        changed: &mut Vec<LoadTask>,
    ) -> FsResult<JobState> {
        let stored = self.load_job(&job.id).await?;
        if stored.state == JobState::Cancelled {
            job.state = JobState::Cancelled;
            return Ok(JobState::Cancelled);
        }
        job.updated_ns = now_ns();
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = changed
            .drain(..)
            .map(|t| (task_key(&job.id, t.n), encode_versioned(&t)))
            .collect();
        entries.push((job_key(&job.id), encode_versioned(&*job)));
        self.records_put(entries).await?;
        Ok(job.state)
    }

    /// Caches one file: its blocks are spread over the live nodes starting
    /// at the `start`th. `(bytes read, skipped)`.
    async fn load_file(
        self: &Arc<Self>,
        task: &LoadTask,
        no_overwrite: bool,
        start: usize,
    ) -> FsResult<(u64, bool)> {
        let attr = self.namespace.stat(&task.path, false).await?;
        if attr.ino != task.ino {
            return Err(FsError::Stale(format!(
                "{} was replaced while the job ran",
                task.path
            )));
        }
        let (mount, rel) = self
            .mounts
            .find(&task.path)
            .ok_or_else(|| FsError::Stale(format!("{}: its mount is gone", task.path)))?;
        // Content not in the UFS yet (fs_mode, being written) is cached anyway.
        if !attr
            .ufs
            .as_ref()
            .is_some_and(|u| u.persist == Persist::Synced)
        {
            return Ok((0, true));
        }
        let attr = if mount.write_type == WriteType::CacheMode {
            self.mounts
                .revalidate(&self.namespace, &mount, &rel, &task.path, attr)
                .await?
        } else {
            attr
        };
        let (_, blocks) = self.namespace.file_blocks_ino(attr.ino).await?;
        let bs = attr.block_size.max(1);
        let count = attr.size.div_ceil(bs) as u32;
        if no_overwrite && blocks.len() as u32 == count {
            return Ok((0, true));
        }
        if !no_overwrite && !blocks.is_empty() {
            // Read again from the UFS: drop what is cached.
            let ino = attr.ino;
            self.namespace
                .call_shard(shard_of(ino), move |reply| ShardMsg::UfsEvict {
                    ino,
                    reply,
                })
                .await?;
        }
        let nodes: Vec<String> = self
            .view
            .live()
            .into_iter()
            .filter(|m| !m.draining && !m.data_addr.is_empty())
            .map(|m| m.node_id.clone())
            .collect();
        let nodes = if nodes.is_empty() {
            vec![self.view.node_id.as_str().to_string()]
        } else {
            nodes
        };
        // One part per block, round-robin over the nodes.
        let mut parts: HashMap<String, Vec<u32>> = HashMap::new();
        for index in 0..count.max(1) {
            if attr.size == 0 {
                break;
            }
            let node = &nodes[(start + index as usize) % nodes.len()];
            parts.entry(node.clone()).or_default().push(index);
        }
        let mut calls = JoinSet::new();
        for (node, indexes) in parts {
            for index in indexes {
                let part = LoadPart {
                    path: task.path.clone(),
                    ino: attr.ino,
                    from: index,
                    to: index + 1,
                };
                let this = self.clone();
                let node = node.clone();
                let trace = curvine_actors::trace::current();
                calls.spawn(curvine_actors::trace::scope(trace, async move {
                    let r = this.load_on(&node, part.clone()).await;
                    (part, r)
                }));
            }
        }
        let mut bytes = 0;
        while let Some(r) = calls.join_next().await {
            let (part, result) = r.map_err(|e| FsError::Io(format!("load part: {e}")))?;
            bytes += match result {
                Ok(n) => n,
                // That node went away: this node reads the block instead.
                Err(FsError::NodeDown(_) | FsError::Unavailable(_) | FsError::TimedOut(_)) => {
                    self.load_part(&part).await?
                }
                Err(e) => return Err(e),
            };
        }
        Ok((bytes, false))
    }

    /// Runs a part on `node` (through its gateway, or here).
    async fn load_on(self: &Arc<Self>, node: &str, part: LoadPart) -> FsResult<u64> {
        if node == self.view.node_id.as_str() {
            return self.load_part(&part).await;
        }
        let gw = self.view.gateway(node)?;
        let trace = curvine_actors::trace::current().map(|ctx| (ctx, now_ns()));
        match gw
            .call(
                |reply| PeerMsg::Load { part, trace, reply },
                Some(Duration::from_secs(600)),
            )
            .await
        {
            Ok(CallResult::Success(r)) => r,
            Ok(CallResult::Timeout) => {
                Err(FsError::TimedOut(format!("node {node} loading a block")))
            }
            _ => Err(FsError::NodeDown(format!(
                "node {node} went away while loading"
            ))),
        }
    }

    /// Caches blocks `[from, to)` of a UFS file on this node (a load task
    /// part); blocks already cached are left alone.
    pub async fn load_part(self: &Arc<Self>, part: &LoadPart) -> FsResult<u64> {
        let (_, blocks) = self.namespace.file_blocks_ino(part.ino).await?;
        let mut bytes = 0;
        for index in part.from..part.to {
            if blocks.iter().any(|b| b.index == index) {
                continue;
            }
            let mut fill = self
                .fills
                .start_fill(part.ino, &part.path, index, 0, u64::MAX, true)
                .await?;
            while let Some(chunk) = fill.chunks.recv().await {
                let (_, data, _) = chunk?;
                bytes += data.len() as u64;
            }
        }
        Ok(bytes)
    }
}

//! The `UfsLoader` actor of each node: on a timer it runs fs_mode
//! persistence (journal passes every tick, a sweep every `ufs.persist_sweep`,
//! each pass in a task of its own, one at a time) and drives the load jobs
//! this node is due to drive.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use curvine_runtime::stats::{ActorStats, Metrics};

use super::loads::Loads;
use super::persist::Persistence;

pub struct UfsLoader;

#[derive(Clone)]
pub struct UfsLoaderArgs {
    pub persist: Arc<Persistence>,
    pub loads: Arc<Loads>,
    pub tick: Duration,
    pub sweep: Duration,
    pub loaders: usize,
    pub retry_delay: Duration,
    pub retry_max: Duration,
    pub metrics: Metrics,
}

pub enum UfsLoaderMsg {
    Tick,
    /// A pass finished (`Err`: back off before the next).
    Done(Result<(), String>),
    /// Load jobs to drive (found by a tick on the node serving shard 0).
    Jobs(Vec<String>),
    /// A load job's driver stopped.
    JobEnded(String),
}

impl ractor::Message for UfsLoaderMsg {}

pub struct UfsLoaderState {
    args: UfsLoaderArgs,
    stats: Arc<ActorStats>,
    running: bool,
    last_sweep: Instant,
    not_before: Instant,
    failures: u32,
    /// Load jobs driven by this node right now.
    driving: HashSet<String>,
    looking: bool,
}

impl Actor for UfsLoader {
    type Msg = UfsLoaderMsg;
    type State = UfsLoaderState;
    type Arguments = UfsLoaderArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<UfsLoaderMsg>,
        args: UfsLoaderArgs,
    ) -> Result<UfsLoaderState, ActorProcessingErr> {
        let stats = args.metrics.actor("ufs-loader", false);
        args.metrics.started(myself.get_id(), &stats);
        myself.send_interval(args.tick, || UfsLoaderMsg::Tick);
        Ok(UfsLoaderState {
            args,
            stats,
            running: false,
            // The first sweep comes soon after start (recovery after a crash).
            last_sweep: Instant::now() - Duration::from_secs(24 * 3600),
            not_before: Instant::now(),
            failures: 0,
            driving: Default::default(),
            looking: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<UfsLoaderMsg>,
        message: UfsLoaderMsg,
        state: &mut UfsLoaderState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.stats.clone();
        let _handling = stats.handling(match &message {
            UfsLoaderMsg::Tick => "tick",
            UfsLoaderMsg::Done(_) => "done",
            UfsLoaderMsg::Jobs(_) => "jobs",
            UfsLoaderMsg::JobEnded(_) => "job_ended",
        });
        match message {
            UfsLoaderMsg::Tick => state.tick(&myself),
            UfsLoaderMsg::Jobs(jobs) => state.drive(&myself, jobs),
            UfsLoaderMsg::JobEnded(id) => {
                state.driving.remove(&id);
            }
            UfsLoaderMsg::Done(result) => state.done(result),
        }
        Ok(())
    }
}

impl UfsLoaderState {
    /// Looks for load jobs to drive, and starts a persistence pass (with a
    /// sweep when one is due) unless one runs or the last failed recently.
    fn tick(&mut self, myself: &ActorRef<UfsLoaderMsg>) {
        if !self.looking {
            self.looking = true;
            let (loads, me) = (self.args.loads.clone(), myself.clone());
            tokio::spawn(async move {
                let jobs = loads.jobs_to_drive().await.unwrap_or_default();
                let _ = me.cast(UfsLoaderMsg::Jobs(jobs));
            });
        }
        if self.running || Instant::now() < self.not_before {
            return;
        }
        let sweep = self.last_sweep.elapsed() >= self.args.sweep;
        if sweep {
            self.last_sweep = Instant::now();
        }
        self.running = true;
        let (loaders, retry) = (
            self.args.loaders,
            (self.args.retry_delay, self.args.retry_max),
        );
        let (persist, me) = (self.args.persist.clone(), myself.clone());
        tokio::spawn(async move {
            let mut result = persist.persist_pass(loaders, retry).await.map(|_| ());
            if sweep && result.is_ok() {
                result = persist.persist_sweep(loaders, retry).await.map(|_| ());
            }
            let _ = me.cast(UfsLoaderMsg::Done(result.map_err(|e| e.to_string())));
        });
    }

    /// Drives each job not driven here yet, in a task of its own.
    fn drive(&mut self, myself: &ActorRef<UfsLoaderMsg>, jobs: Vec<String>) {
        self.looking = false;
        for id in jobs {
            if !self.driving.insert(id.clone()) {
                continue;
            }
            let (loads, me, loaders) = (self.args.loads.clone(), myself.clone(), self.args.loaders);
            tokio::spawn(async move {
                if let Err(e) = loads.drive_load(&id, loaders).await {
                    tracing::warn!(job = %id, error = %e, "load job stopped; it resumes");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                let _ = me.cast(UfsLoaderMsg::JobEnded(id));
            });
        }
    }

    /// A pass ended: a failure delays the next.
    fn done(&mut self, result: Result<(), String>) {
        self.running = false;
        match result {
            Ok(()) => self.failures = 0,
            Err(_) => {
                self.failures += 1;
                let delay = self
                    .args
                    .retry_delay
                    .saturating_mul(1 << self.failures.min(16))
                    .min(self.args.retry_max);
                self.not_before = Instant::now() + delay;
            }
        }
    }
}

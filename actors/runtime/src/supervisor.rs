//! The one supervision mechanism of every process: a [`Supervisor`] actor
//! starts its [`Child`]ren in order and, when one fails (or stops without
//! being asked to), restarts it after a doubling backoff; when a child fails
//! more than `max_restarts` times within `window`, the supervisor fails
//! itself, which escalates to its own supervisor.
//!
//! A child is an actor ([`ActorChild`]), a task ([`TaskChild`]: a future
//! that must run for as long as its supervisor does, such as a port's
//! accept loop), or another supervisor (an [`ActorChild`] of
//! [`Supervisor`]). Failures and restarts are counted in the child's
//! [`ActorStats`], which `curvine-cli actors` shows. A supervisor stops its
//! children in the reverse order of their start. Senders reach the
//! current incarnation of an actor through its [`Slot`], which the
//! supervisor fills when the child starts and empties when it stops: nobody
//! patches references by hand after a restart.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, Message, SupervisionEvent};

use curvine_conf::SupervisorConf;
use curvine_messages::{FsError, FsResult};

use crate::stats::{ActorStats, Metrics};

#[derive(Debug, Clone)]
pub struct RestartPolicy {
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub max_restarts: u32,
    pub window: Duration,
}

impl From<&SupervisorConf> for RestartPolicy {
    fn from(c: &SupervisorConf) -> Self {
        RestartPolicy {
            backoff: c.restart_backoff.0,
            max_backoff: c.max_backoff.0,
            max_restarts: c.max_restarts,
            window: c.restart_window.0,
        }
    }
}

/// Failures of one child.
#[derive(Debug, Default, Clone)]
pub struct RestartTracker {
    recent: VecDeque<Instant>,
    /// Restarts since the supervisor started.
    pub total: u64,
}

impl RestartTracker {
    /// Records a failure; returns the delay before restarting, or `None` when
    /// the child failed too often and the failure must escalate.
    pub fn on_failure(&mut self, policy: &RestartPolicy, now: Instant) -> Option<Duration> {
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 >= policy.max_restarts {
            return None;
        }
        self.recent.push_back(now);
        self.total += 1;
        let doublings = (self.recent.len() as u32 - 1).min(16);
        Some((policy.backoff * 2u32.pow(doublings)).min(policy.max_backoff))
    }
}

// ---- slots ----------------------------------------------------------------------

/// Reaches the current incarnation of a supervised actor: filled by its
/// supervisor when it starts, empty while it restarts.
pub struct Slot<M: Message> {
    actor: Arc<RwLock<Option<ActorRef<M>>>>,
    what: Arc<str>,
}

impl<M: Message> Clone for Slot<M> {
    fn clone(&self) -> Self {
        Slot {
            actor: self.actor.clone(),
            what: self.what.clone(),
        }
    }
}

impl<M: Message> Slot<M> {
    /// An empty slot for the actor `what` (named in errors).
    pub fn new(what: &str) -> Slot<M> {
        Slot {
            actor: Arc::new(RwLock::new(None)),
            what: what.into(),
        }
    }

    /// The actor, or `Unavailable` while it is not running.
    pub fn get(&self) -> FsResult<ActorRef<M>> {
        self.current()
            .ok_or_else(|| FsError::Unavailable(format!("the {} is restarting", self.what)))
    }

    /// The actor, if it runs.
    pub fn current(&self) -> Option<ActorRef<M>> {
        self.actor.read().clone()
    }

    /// Points the slot at `actor` (done by the supervisor; tests may fill
    /// a slot with an actor they spawned themselves).
    pub fn set(&self, actor: Option<ActorRef<M>>) {
        *self.actor.write() = actor;
    }
}

// ---- children -------------------------------------------------------------------

/// What starting a child returns: its cell, linked to the supervisor.
pub type Started<'a> =
    Pin<Box<dyn Future<Output = Result<ActorCell, ActorProcessingErr>> + Send + 'a>>;

/// Something a [`Supervisor`] starts and restarts.
pub trait Child: Send + Sync + 'static {
    /// The role it is counted and shown under (`block-manager`, `shard-3`).
    fn role(&self) -> &str;

    /// Whether its senders count their sends (so its mailbox depth is known).
    fn counts_sends(&self) -> bool {
        false
    }

    /// Starts it (named `name`), linked to `supervisor`.
    fn start<'a>(
        &'a self,
        name: Option<String>,
        supervisor: ActorCell,
        metrics: &'a Metrics,
    ) -> Started<'a>;

    /// Called once it stopped (`None`) or failed (the error), before any
    /// restart.
    fn stopped(&self, _failure: Option<&str>) {}

    /// Whether its stopping on its own (not a failure) ends the supervisor
    /// instead of counting as a failure: a FUSE session that was unmounted.
    fn ends_supervisor(&self) -> bool {
        false
    }
}

type Make<A> = dyn Fn() -> (A, <A as Actor>::Arguments) + Send + Sync;
type OnStart<M> = dyn Fn(&ActorRef<M>) + Send + Sync;
type OnStop = dyn Fn(Option<&str>) + Send + Sync;

/// An actor child: `make` gives the actor and its arguments for each start.
pub struct ActorChild<A: Actor> {
    role: String,
    make: Box<Make<A>>,
    slot: Option<Slot<A::Msg>>,
    on_start: Option<Box<OnStart<A::Msg>>>,
    on_stop: Option<Box<OnStop>>,
    counts_sends: bool,
    ends_supervisor: bool,
}

impl<A: Actor> ActorChild<A> {
    pub fn new(
        role: impl Into<String>,
        make: impl Fn() -> (A, A::Arguments) + Send + Sync + 'static,
    ) -> ActorChild<A> {
        ActorChild {
            role: role.into(),
            make: Box::new(make),
            slot: None,
            on_start: None,
            on_stop: None,
            counts_sends: false,
            ends_supervisor: false,
        }
    }

    /// `slot` reaches each incarnation of the actor.
    pub fn with_slot(mut self, slot: Slot<A::Msg>) -> Self {
        self.slot = Some(slot);
        self
    }

    /// `f` runs after each start (once the slot is filled).
    pub fn on_start(mut self, f: impl Fn(&ActorRef<A::Msg>) + Send + Sync + 'static) -> Self {
        self.on_start = Some(Box::new(f));
        self
    }

    /// `f` runs after each stop (`None`) or failure (the error), once the
    /// slot is emptied.
    pub fn on_stop(mut self, f: impl Fn(Option<&str>) + Send + Sync + 'static) -> Self {
        self.on_stop = Some(Box::new(f));
        self
    }

    /// Its senders count their sends.
    pub fn counting_sends(mut self) -> Self {
        self.counts_sends = true;
        self
    }

    /// Its stopping on its own ends the supervisor.
    pub fn ending_supervisor(mut self) -> Self {
        self.ends_supervisor = true;
        self
    }

    pub fn boxed(self) -> Arc<dyn Child> {
        Arc::new(self)
    }
}

impl<A: Actor> Child for ActorChild<A> {
    fn role(&self) -> &str {
        &self.role
    }

    fn counts_sends(&self) -> bool {
        self.counts_sends
    }

    fn start<'a>(
        &'a self,
        name: Option<String>,
        supervisor: ActorCell,
        _metrics: &'a Metrics,
    ) -> Started<'a> {
        Box::pin(async move {
            let (actor, args) = (self.make)();
            let (actor, _) = Actor::spawn_linked(name, actor, args, supervisor).await?;
            if let Some(slot) = &self.slot {
                slot.set(Some(actor.clone()));
            }
            if let Some(f) = &self.on_start {
                f(&actor);
            }
            Ok(actor.get_cell())
        })
    }

    fn stopped(&self, failure: Option<&str>) {
        if let Some(slot) = &self.slot {
            slot.set(None);
        }
        if let Some(f) = &self.on_stop {
            f(failure);
        }
    }

    fn ends_supervisor(&self) -> bool {
        self.ends_supervisor
    }
}

/// A boxed future a [`TaskChild`] runs.
pub type TaskFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A task child: a future that runs as long as its supervisor does (an
/// accept loop, a periodic pass). Its ending, or a panic in it, is a
/// failure; the supervisor starts it again with a new future.
pub struct TaskChild {
    role: String,
    run: Arc<dyn Fn() -> TaskFuture + Send + Sync>,
}

impl TaskChild {
    pub fn new<F, Fut>(role: impl Into<String>, run: F) -> TaskChild
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        TaskChild {
            role: role.into(),
            run: Arc::new(move || Box::pin(run())),
        }
    }

    pub fn boxed(self) -> Arc<dyn Child> {
        Arc::new(self)
    }
}

impl Child for TaskChild {
    fn role(&self) -> &str {
        &self.role
    }

    fn start<'a>(
        &'a self,
        name: Option<String>,
        supervisor: ActorCell,
        metrics: &'a Metrics,
    ) -> Started<'a> {
        Box::pin(async move {
            let args = TaskArgs {
                stats: metrics.actor(&self.role, false),
                metrics: metrics.clone(),
                future: (self.run)(),
            };
            let (actor, _) = Actor::spawn_linked(name, TaskActor, args, supervisor).await?;
            Ok(actor.get_cell())
        })
    }
}

/// The actor that holds a [`TaskChild`]'s task in the tree.
struct TaskActor;

struct TaskArgs {
    stats: Arc<ActorStats>,
    metrics: Metrics,
    future: TaskFuture,
}

enum TaskMsg {
    /// The task ended: how.
    Ended(String),
}

impl Message for TaskMsg {}

/// Aborts the task when the actor's state goes, however the actor ends
/// (a killed actor runs no `post_stop`).
struct TaskState {
    task: tokio::task::AbortHandle,
}

impl Drop for TaskState {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Actor for TaskActor {
    type Msg = TaskMsg;
    type State = TaskState;
    type Arguments = TaskArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<TaskMsg>,
        args: TaskArgs,
    ) -> Result<TaskState, ActorProcessingErr> {
        args.metrics.started(myself.get_id(), &args.stats);
        let task = tokio::spawn(args.future);
        let abort = task.abort_handle();
        tokio::spawn(async move {
            let how = match task.await {
                Ok(()) => "the task ended".to_string(),
                Err(e) if e.is_cancelled() => return,
                Err(e) => match e.try_into_panic() {
                    Ok(panic) => format!("the task panicked: {}", panic_text(&*panic)),
                    Err(e) => format!("the task failed: {e}"),
                },
            };
            let _ = myself.cast(TaskMsg::Ended(how));
        });
        Ok(TaskState { task: abort })
    }

    async fn handle(
        &self,
        _myself: ActorRef<TaskMsg>,
        message: TaskMsg,
        _state: &mut TaskState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            TaskMsg::Ended(how) => Err(how.into()),
        }
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

// ---- the supervisor -----------------------------------------------------------

/// Told why a supervisor gave up.
pub type GiveUp = Arc<dyn Fn(&str) + Send + Sync>;

/// Starts its children in order and keeps them running (see the module docs).
pub struct Supervisor;

/// What a supervisor supervises, and how.
#[derive(Clone)]
pub struct SupervisorArgs {
    /// Its own role (`node`, `shard-host`); its children are named
    /// `NAME/ROLE` when it has a name.
    pub role: String,
    pub policy: RestartPolicy,
    pub metrics: Metrics,
    pub children: Vec<Arc<dyn Child>>,
    /// How long its stop waits for its children.
    pub stop_timeout: Duration,
    /// Called with the reason when it gives up (before it fails).
    pub on_give_up: Option<GiveUp>,
}

impl SupervisorArgs {
    pub fn new(role: &str, policy: RestartPolicy, metrics: Metrics) -> SupervisorArgs {
        SupervisorArgs {
            role: role.to_string(),
            policy,
            metrics,
            children: Vec::new(),
            stop_timeout: Duration::from_secs(30),
            on_give_up: None,
        }
    }

    pub fn child(mut self, child: Arc<dyn Child>) -> Self {
        self.children.push(child);
        self
    }

    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }

    pub fn on_give_up(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_give_up = Some(Arc::new(f));
        self
    }
}

pub enum SupervisorMsg {
    /// Start child `index` again (after its backoff).
    Restart(usize),
}

impl Message for SupervisorMsg {}

pub struct SupervisorState {
    args: SupervisorArgs,
    stats: Arc<ActorStats>,
    /// The running cell of each child, by index.
    running: Vec<Option<ActorCell>>,
    trackers: Vec<RestartTracker>,
}

impl Supervisor {
    async fn start_child(
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        index: usize,
    ) -> Result<(), ActorProcessingErr> {
        let child = state.args.children[index].clone();
        let name = myself.get_name().map(|n| format!("{n}/{}", child.role()));
        let cell = child
            .start(name, myself.get_cell(), &state.args.metrics)
            .await
            .map_err(|e| format!("{} failed to start: {e}", child.role()))?;
        let stats = state.args.metrics.actor(child.role(), child.counts_sends());
        state.args.metrics.child_started(cell.get_id(), &stats);
        state.running[index] = Some(cell);
        Ok(())
    }

    /// Counts a failure of child `index`: restart it after its backoff, or
    /// give up (the error fails this supervisor).
    fn on_child_failure(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        index: usize,
        error: &str,
    ) -> Result<(), ActorProcessingErr> {
        let child = &state.args.children[index];
        let stats = state.args.metrics.actor(child.role(), child.counts_sends());
        stats.failed();
        match state.trackers[index].on_failure(&state.args.policy, Instant::now()) {
            Some(delay) => {
                stats.restarted();
                tracing::warn!(
                    supervisor = state.args.role,
                    child = child.role(),
                    delay_ms = delay.as_millis() as u64,
                    "restarting"
                );
                myself.send_after(delay, move || SupervisorMsg::Restart(index));
                Ok(())
            }
            None => {
                let reason = format!(
                    "{} failed {} times within {:?}; last error: {error}",
                    child.role(),
                    state.args.policy.max_restarts,
                    state.args.policy.window
                );
                tracing::error!(supervisor = state.args.role, "giving up: {reason}");
                if let Some(f) = &state.args.on_give_up {
                    f(&reason);
                }
                Err(reason.into())
            }
        }
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let stats = args.metrics.actor(&args.role, false);
        args.metrics.started(myself.get_id(), &stats);
        let n = args.children.len();
        let mut state = SupervisorState {
            args,
            stats,
            running: vec![None; n],
            trackers: vec![RestartTracker::default(); n],
        };
        for index in 0..n {
            Self::start_child(&myself, &mut state, index).await?;
        }
        Ok(state)
    }

    async fn post_stop(
        &self,
        myself: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Last started, first stopped: a child stops before what it uses.
        let reason = format!("{} stopping", state.args.role);
        for cell in state.running.iter().rev().flatten() {
            let _ = cell
                .stop_and_wait(Some(reason.clone()), Some(state.args.stop_timeout))
                .await;
        }
        myself
            .stop_children_and_wait(Some(reason), Some(state.args.stop_timeout))
            .await;
        for child in &state.args.children {
            child.stopped(None);
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.stats.clone();
        let _handling = stats.handling("restart");
        match message {
            SupervisorMsg::Restart(index) => {
                let role = state.args.children[index].role().to_string();
                match Self::start_child(&myself, state, index).await {
                    Ok(()) => {
                        tracing::info!(supervisor = state.args.role, child = role, "restarted")
                    }
                    Err(e) => {
                        // A child that cannot even start counts as another failure.
                        tracing::error!(supervisor = state.args.role, child = role, error = %e, "restart failed");
                        self.on_child_failure(&myself, state, index, &e.to_string())?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, error, failed) = match &event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, error.to_string(), true),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                reason.clone().unwrap_or_else(|| "stopped".into()),
                false,
            ),
            _ => return Ok(()),
        };
        let Some(index) = state
            .running
            .iter()
            .position(|c| c.as_ref().is_some_and(|c| c.get_id() == cell.get_id()))
        else {
            return Ok(());
        };
        state.running[index] = None;
        let child = state.args.children[index].clone();
        if !failed && child.ends_supervisor() {
            child.stopped(None);
            tracing::info!(
                supervisor = state.args.role,
                child = child.role(),
                reason = error,
                "ended"
            );
            myself.stop(Some(format!("{} ended: {error}", child.role())));
            return Ok(());
        }
        // A child never stops on its own: outside the supervisor's own
        // shutdown (when events are no longer handled) a stop is a failure too.
        child.stopped(Some(&error));
        tracing::error!(supervisor = state.args.role, child = child.role(), error = %error, "actor failed");
        self.on_child_failure(&myself, state, index, &error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_then_escalates() {
        let p = RestartPolicy {
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            max_restarts: 3,
            window: Duration::from_secs(60),
        };
        let mut t = RestartTracker::default();
        let now = Instant::now();
        assert_eq!(t.on_failure(&p, now), Some(Duration::from_millis(100)));
        assert_eq!(t.on_failure(&p, now), Some(Duration::from_millis(200)));
        assert_eq!(t.on_failure(&p, now), Some(Duration::from_millis(350)));
        assert_eq!(t.on_failure(&p, now), None);
        // Failures age out of the window.
        assert!(t.on_failure(&p, now + Duration::from_secs(61)).is_some());
    }
}

//! `ShardHost`: supervises the node's `NamespaceShard`s and keeps the
//! directory other components use to reach them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use curvine_messages::shard::ShardMsg;
use curvine_messages::trace::Traced;
use curvine_messages::{FsError, FsResult, ShardId};

use crate::shard::{NamespaceShard, ShardArgs};
use crate::supervisor::{RestartPolicy, RestartTracker};

/// A shard actor: its mailbox holds messages with their trace context.
pub type ShardRef = ActorRef<Traced<ShardMsg>>;

/// Where each shard's actor is right now. A restarting shard is absent and
/// callers see `Unavailable` (and retry).
#[derive(Clone, Default)]
pub struct ShardDirectory {
    refs: Arc<RwLock<Vec<Option<ShardRef>>>>,
    restarts: Arc<RwLock<HashMap<ShardId, u64>>>,
}

impl ShardDirectory {
    pub fn new(shard_count: u32) -> Self {
        ShardDirectory {
            refs: Arc::new(RwLock::new(vec![None; shard_count as usize])),
            restarts: Default::default(),
        }
    }

    pub fn shard_count(&self) -> u32 {
        self.refs.read().len() as u32
    }

    pub fn get(&self, shard: ShardId) -> FsResult<ShardRef> {
        match self.refs.read().get(shard as usize) {
            Some(Some(actor)) => Ok(actor.clone()),
            Some(None) => Err(FsError::Unavailable(format!("shard {shard} is restarting"))),
            None => Err(FsError::InvalidArgument(format!(
                "shard {shard} does not exist"
            ))),
        }
    }

    fn set(&self, shard: ShardId, actor: Option<ShardRef>) {
        if let Some(slot) = self.refs.write().get_mut(shard as usize) {
            *slot = actor;
        }
    }

    /// Restarts of a shard since the node started.
    pub fn restarts(&self, shard: ShardId) -> u64 {
        self.restarts.read().get(&shard).copied().unwrap_or(0)
    }
}

/// Called with a shard's id each time it has (re)started, to re-drive its intents.
pub type OnShardStarted = Arc<dyn Fn(ShardId) + Send + Sync>;

pub struct ShardHost;

pub struct HostArgs {
    pub shards: Vec<ShardArgs>,
    pub directory: ShardDirectory,
    pub policy: RestartPolicy,
    pub on_started: OnShardStarted,
    pub metrics: crate::stats::Metrics,
}

pub enum HostMsg {
    /// Start shard `id` again (after its backoff).
    Restart(ShardId),
}

impl ractor::Message for HostMsg {}

pub struct HostState {
    args: HostArgs,
    by_actor: HashMap<ActorId, ShardId>,
    trackers: HashMap<ShardId, RestartTracker>,
}

impl ShardHost {
    async fn start_shard(
        myself: &ActorRef<HostMsg>,
        state: &mut HostState,
        id: ShardId,
    ) -> Result<(), ActorProcessingErr> {
        let args = state
            .args
            .shards
            .iter()
            .find(|a| a.store.shard == id)
            .cloned()
            .ok_or_else(|| format!("no arguments for shard {id}"))?;
        let (actor, _) = Actor::spawn_linked(
            Some(format!(
                "{}/shard-{id}",
                myself.get_name().unwrap_or_default()
            )),
            NamespaceShard,
            args,
            myself.get_cell(),
        )
        .await
        .map_err(|e| format!("shard {id} failed to start: {e}"))?;
        state.by_actor.insert(actor.get_id(), id);
        state.args.directory.set(id, Some(actor));
        (state.args.on_started)(id);
        Ok(())
    }
}

impl Actor for ShardHost {
    type Msg = HostMsg;
    type State = HostState;
    type Arguments = HostArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<HostMsg>,
        args: HostArgs,
    ) -> Result<HostState, ActorProcessingErr> {
        let stats = args.metrics.actor("shard-host", false);
        args.metrics.started(myself.get_id(), &stats);
        let mut state = HostState {
            args,
            by_actor: HashMap::new(),
            trackers: HashMap::new(),
        };
        let ids: Vec<ShardId> = state.args.shards.iter().map(|a| a.store.shard).collect();
        for id in ids {
            Self::start_shard(&myself, &mut state, id).await?;
        }
        Ok(state)
    }

    async fn post_stop(
        &self,
        myself: ActorRef<HostMsg>,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        for id in 0..state.args.directory.shard_count() {
            state.args.directory.set(id as ShardId, None);
        }
        myself
            .stop_children_and_wait(None, Some(Duration::from_secs(30)))
            .await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<HostMsg>,
        message: HostMsg,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.args.metrics.actor("shard-host", false);
        let _handling = stats.handling("restart");
        match message {
            HostMsg::Restart(id) => {
                if let Err(e) = Self::start_shard(&myself, state, id).await {
                    // A shard that cannot even start counts as another failure.
                    tracing::error!(shard = id, error = %e, "shard restart failed");
                    self.on_child_failure(&myself, state, id, &e.to_string())?;
                } else {
                    tracing::info!(shard = id, "shard restarted");
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<HostMsg>,
        event: SupervisionEvent,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                if let Some(id) = state.by_actor.remove(&cell.get_id()) {
                    state.args.directory.set(id, None);
                    tracing::error!(shard = id, error = %error, "shard failed");
                    self.on_child_failure(&myself, state, id, &error.to_string())?;
                }
            }
            // A shard never stops on its own: outside the host's own shutdown
            // (when events are no longer handled) a stop is a failure too.
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if let Some(id) = state.by_actor.remove(&cell.get_id()) {
                    state.args.directory.set(id, None);
                    let reason = reason.unwrap_or_else(|| "stopped".into());
                    tracing::error!(shard = id, reason, "shard stopped unexpectedly");
                    self.on_child_failure(&myself, state, id, &reason)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl ShardHost {
    fn on_child_failure(
        &self,
        myself: &ActorRef<HostMsg>,
        state: &mut HostState,
        id: ShardId,
        error: &str,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.args.metrics.shard(id);
        stats.failed();
        let tracker = state.trackers.entry(id).or_default();
        match tracker.on_failure(&state.args.policy, Instant::now()) {
            Some(delay) => {
                stats.restarted();
                *state.args.directory.restarts.write().entry(id).or_default() += 1;
                tracing::warn!(
                    shard = id,
                    delay_ms = delay.as_millis() as u64,
                    "restarting shard"
                );
                myself.send_after(delay, move || HostMsg::Restart(id));
                Ok(())
            }
            None => Err(format!(
                "shard {id} failed {} times within {:?}; last error: {error}",
                state.args.policy.max_restarts, state.args.policy.window
            )
            .into()),
        }
    }
}

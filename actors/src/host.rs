//! The shard host: the supervisor of the node's `NamespaceShard`s, and the
//! directory other components reach them through.

use std::sync::Arc;

use curvine_messages::shard::ShardMsg;
use curvine_messages::trace::Traced;
use curvine_messages::{FsError, FsResult, ShardId};
use curvine_runtime::stats::Metrics;
use curvine_runtime::supervisor::{ActorChild, RestartPolicy, Slot, SupervisorArgs};

use crate::shard::{NamespaceShard, ShardArgs};

/// A shard actor: its mailbox holds messages with their trace context.
pub type ShardRef = ractor::ActorRef<Traced<ShardMsg>>;

/// Where each shard's actor is right now: one slot per shard, filled by
/// the shard host's supervisor. A restarting shard is absent and callers
/// see `Unavailable` (and retry).
#[derive(Clone)]
pub struct ShardDirectory {
    slots: Arc<Vec<Slot<Traced<ShardMsg>>>>,
}

impl ShardDirectory {
    pub fn new(shard_count: u32) -> Self {
        ShardDirectory {
            slots: Arc::new(
                (0..shard_count)
                    .map(|_| Slot::new("namespace shard"))
                    .collect(),
            ),
        }
    }

    pub fn shard_count(&self) -> u32 {
        self.slots.len() as u32
    }

    pub fn get(&self, shard: ShardId) -> FsResult<ShardRef> {
        match self.slots.get(shard as usize) {
            Some(slot) => slot
                .current()
                .ok_or_else(|| FsError::Unavailable(format!("shard {shard} is restarting"))),
            None => Err(FsError::InvalidArgument(format!(
                "shard {shard} does not exist"
            ))),
        }
    }

    fn slot(&self, shard: ShardId) -> Option<Slot<Traced<ShardMsg>>> {
        self.slots.get(shard as usize).cloned()
    }
}

/// Called with a shard's id each time it has (re)started, to re-drive its intents.
pub type OnShardStarted = Arc<dyn Fn(ShardId) + Send + Sync>;

/// The node's shards under one supervisor (role `shard-host`).
pub struct ShardHost;

pub struct HostArgs {
    pub shards: Vec<ShardArgs>,
    pub directory: ShardDirectory,
    pub policy: RestartPolicy,
    pub on_started: OnShardStarted,
    pub metrics: Metrics,
}

impl ShardHost {
    /// The arguments of the shard host's [`Supervisor`](curvine_runtime::supervisor::Supervisor):
    /// a child per shard (role `shard-N`, its senders counted) whose
    /// directory slot follows it, re-driving its intents after each start.
    pub fn supervisor(args: HostArgs) -> SupervisorArgs {
        let mut sup = SupervisorArgs::new("shard-host", args.policy.clone(), args.metrics.clone());
        for shard in args.shards {
            let id = shard.store.shard;
            let Some(slot) = args.directory.slot(id) else {
                tracing::error!(shard = id, "no directory slot for shard");
                continue;
            };
            let on_started = args.on_started.clone();
            let child = ActorChild::new(format!("shard-{id}"), move || {
                (NamespaceShard, shard.clone())
            })
            .with_slot(slot)
            .counting_sends()
            .on_start(move |_| on_started(id));
            sup = sup.child(child.boxed());
        }
        sup
    }
}

//! `BlockManagerRef`: the node's handle on its current BlockManager, which
//! its supervisor replaces on a restart; calls retry briefly meanwhile and
//! are spans of a traced request.

use std::sync::Arc;
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};

use crate::supervisor::Slot;

use curvine_messages::block::BlockMsg;
use curvine_messages::{now_ns, FsError, FsResult};

/// The node's current BlockManager: its slot in the supervision tree,
/// which the supervisor points at each incarnation, so holders never call
/// a dead actor for long.
#[derive(Clone)]
pub struct BlockManagerRef {
    actor: Slot<BlockMsg>,
    /// The node's tracer, for the spans of traced calls.
    pub tracer: Arc<std::sync::OnceLock<crate::trace::Tracer>>,
}

impl Default for BlockManagerRef {
    fn default() -> Self {
        BlockManagerRef {
            actor: Slot::new("block manager"),
            tracer: Default::default(),
        }
    }
}

impl BlockManagerRef {
    /// Commits a block written short-circuit on this node: its file
    /// synced, then recorded by the block manager. For the data port's
    /// `CommitLocal` and for a close that carries its last block's commit.
    /// Returns the block's checksum.
    pub async fn commit_local(
        &self,
        store: &Arc<super::BlockStore>,
        tokens: &crate::token::TokenKey,
        c: curvine_messages::block::LocalCommit,
    ) -> FsResult<u32> {
        tokens.check(&c.token, curvine_messages::block::Access::Write)?;
        let block = c.token.block;
        let synced = store.clone();
        tokio::task::spawn_blocking(move || synced.sync_written(block))
            .await
            .map_err(|e| FsError::Io(format!("sync task: {e}")))??;
        let (len, crcs) = (c.len, c.crcs);
        self.call(move |reply| BlockMsg::Commit {
            block,
            len,
            crcs: crcs.clone(),
            reply,
        })
        .await
    }

    /// Reserves room for a block (see [`BlockMsg::Reserve`]). Where no tier
    /// has room, the block manager makes some first (freed blocks no reader
    /// holds, removed files closed since, clean cached blocks:
    /// [`BlockMsg::Reclaim`]) and the reservation is asked again, so that
    /// space `rm` gave back a moment ago serves the next write, and a cache
    /// full of data the UFS holds too makes way for new data.
    pub async fn reserve(
        &self,
        block: curvine_messages::block::BlockId,
        tier: Option<curvine_messages::block::TierKind>,
        size: u64,
        grows: bool,
        after: Option<(curvine_messages::block::BlockId, u64)>,
    ) -> FsResult<curvine_messages::block::Reservation> {
        self.reserve_with(block, tier, (size, grows), after, true)
            .await
    }

    /// As [`Self::reserve`], dropping clean cached blocks for room only
    /// with `drop_clean` (a load job's blocks do not: a load of more than
    /// the cache would drop what it loaded, and report it loaded).
    pub async fn reserve_with(
        &self,
        block: curvine_messages::block::BlockId,
        tier: Option<curvine_messages::block::TierKind>,
        (size, grows): (u64, bool),
        after: Option<(curvine_messages::block::BlockId, u64)>,
        drop_clean: bool,
    ) -> FsResult<curvine_messages::block::Reservation> {
        match self.reserve_now(block, tier, (size, grows), after).await {
            Err(FsError::NoSpace(why)) => {
                let reclaim = move |reply| BlockMsg::Reclaim {
                    block,
                    size,
                    grows,
                    tier,
                    drop_clean,
                    reply,
                };
                match self.call(reclaim).await {
                    Ok(r) => match self.reserve_now(block, tier, (size, grows), after).await {
                        Err(FsError::NoSpace(why)) if r.uploading > 0 => Err(FsError::NoSpace(format!(
                            "{why}; {} of blocks here wait for their upload to the UFS (waited data.upload_wait without progress)",
                            curvine_messages::human_bytes(r.uploading)
                        ))),
                        other => other,
                    },
                    Err(_) => Err(FsError::NoSpace(why)),
                }
            }
            other => other,
        }
    }

    /// Reserves room for a block as it is now, making none
    /// ([`BlockMsg::Reserve`]).
    pub async fn reserve_now(
        &self,
        block: curvine_messages::block::BlockId,
        tier: Option<curvine_messages::block::TierKind>,
        (size, grows): (u64, bool),
        after: Option<(curvine_messages::block::BlockId, u64)>,
    ) -> FsResult<curvine_messages::block::Reservation> {
        self.call(move |reply| BlockMsg::Reserve {
            block,
            tier,
            size,
            grows,
            after,
            reply,
        })
        .await
    }

    /// The slot its supervisor keeps pointed at the block manager.
    pub fn slot(&self) -> Slot<BlockMsg> {
        self.actor.clone()
    }

    pub fn get(&self) -> FsResult<ActorRef<BlockMsg>> {
        self.actor.get()
    }

    /// Calls the block manager, retrying briefly while it restarts.
    pub async fn call<T: Send + 'static>(
        &self,
        build: impl Fn(RpcReplyPort<FsResult<T>>) -> BlockMsg + Send + Sync,
    ) -> FsResult<T> {
        // In a traced request the call is a span of the block manager's,
        // timed here (its queueing and handling together).
        let kind = std::sync::OnceLock::new();
        let build = |reply| {
            let msg = build(reply);
            let _ = kind.set(msg.kind_name());
            msg
        };
        let ctx = crate::trace::current();
        let started = ctx.map(|_| now_ns());
        let result = self.call_untimed(&build).await;
        if let (Some(ctx), Some(start)) = (ctx, started) {
            if let Some(tracer) = self.tracer.get() {
                tracer.record_span(
                    ctx,
                    "block-manager",
                    kind.get().copied().unwrap_or("call"),
                    start,
                    crate::trace::outcome_of(&result),
                );
            }
        }
        result
    }

    async fn call_untimed<T: Send + 'static>(
        &self,
        build: &(impl Fn(RpcReplyPort<FsResult<T>>) -> BlockMsg + Send + Sync),
    ) -> FsResult<T> {
        let mut delay = Duration::from_millis(5);
        for attempt in 0..8 {
            let result = match self.get() {
                Ok(actor) => match actor.call(build, Some(Duration::from_secs(60))).await {
                    Ok(ractor::rpc::CallResult::Success(r)) => r,
                    Ok(ractor::rpc::CallResult::Timeout) => {
                        return Err(FsError::TimedOut("the block manager did not answer".into()))
                    }
                    _ => Err(FsError::Unavailable(
                        "the block manager stopped while handling the request".into(),
                    )),
                },
                Err(e) => Err(e),
            };
            match result {
                Err(FsError::Unavailable(_)) if attempt < 7 => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                other => return other,
            }
        }
        Err(FsError::Unavailable(
            "the block manager is restarting".into(),
        ))
    }

    pub fn cast(&self, message: BlockMsg) {
        if let Ok(actor) = self.get() {
            let _ = actor.cast(message);
        }
    }
}

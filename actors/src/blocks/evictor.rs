//! The `TierEvictor` of a tier: above the high watermark it demotes the
//! tier's least recently used blocks to the next tier with room, copying
//! and verifying each, down to the low watermark.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use curvine_messages::block::{BlockMsg, MovePlan};
use curvine_messages::{FsError, FsResult};

use super::copy::{copy_block, create_tmp};
use super::{io_err, BlockConf, BlockStore};
use crate::stats::{ActorStats, Metrics};

pub struct TierEvictor;

pub enum EvictMsg {
    /// Look at the tier's usage and demote blocks when above the high watermark.
    Check,
}

impl ractor::Message for EvictMsg {}

#[derive(Clone)]
pub struct EvictArgs {
    pub tier: u8,
    pub store: Arc<BlockStore>,
    pub manager: ActorRef<BlockMsg>,
    pub conf: BlockConf,
    pub metrics: Metrics,
}

pub struct EvictState {
    args: EvictArgs,
    stats: Arc<ActorStats>,
    /// When the tier was last found full of blocks that cannot move (logged once).
    stuck_since: Option<Instant>,
    last_run: Option<Instant>,
}

/// Copies a block file to its new place, verifying every checksum unit.
fn copy_verified(plan: &MovePlan, sync: bool) -> FsResult<()> {
    let src = File::open(&plan.from).map_err(|e| io_err(&plan.from, e))?;
    let dst = create_tmp(&plan.to_tmp)?;
    copy_block(
        (&src, &plan.from),
        plan.from_offset,
        &plan.record,
        (&dst, &plan.to_tmp),
        0,
    )?;
    if sync {
        dst.sync_data().map_err(|e| io_err(&plan.to_tmp, e))?;
    }
    Ok(())
}

impl TierEvictor {
    async fn check(state: &mut EvictState) -> Result<(), ActorProcessingErr> {
        let a = &state.args;
        let tier = a.tier as usize;
        if state
            .last_run
            .is_some_and(|t| t.elapsed() < a.conf.evict_interval / 2)
        {
            return Ok(());
        }
        state.last_run = Some(Instant::now());
        if a.store.usage(tier) <= a.conf.high_watermark {
            state.stuck_since = None;
            return Ok(());
        }
        let capacity = a.store.capacity(tier) as f64;
        let target = (a.conf.low_watermark * capacity) as u64;
        let in_use = (a.store.usage(tier) * capacity) as u64;
        let need = in_use.saturating_sub(target);
        let tier_u8 = a.tier;
        let coldest = match ractor::call!(a.manager, |reply| BlockMsg::Coldest {
            tier: tier_u8,
            bytes: need,
            reply
        }) {
            Ok(Ok(c)) => c,
            _ => return Ok(()),
        };
        for (block, _) in coldest {
            let plan = match ractor::call!(a.manager, |reply| BlockMsg::PrepareMove {
                block,
                reply
            }) {
                Ok(Ok(p)) => p,
                Ok(Err(FsError::NoSpace(why))) => {
                    if state.stuck_since.is_none() {
                        tracing::warn!(tier = %a.store.tier_kind(tier), "{why}; new writes get ENOSPC until space is freed");
                        state.stuck_since = Some(Instant::now());
                    }
                    return Ok(());
                }
                Ok(Err(_)) => continue, // removed or moving meanwhile
                Err(e) => return Err(e.into()),
            };
            let to = plan.to_tier;
            let sync = a.store.syncs(to as usize);
            let plan2 = plan.clone();
            let copied = tokio::task::spawn_blocking(move || copy_verified(&plan2, sync))
                .await
                .unwrap_or_else(|e| Err(FsError::Io(format!("copy task failed: {e}"))));
            if let Err(e) = &copied {
                if matches!(e, FsError::Corrupt(_)) {
                    a.store.checksum_errors.fetch_add(1, Ordering::Relaxed);
                }
                tracing::error!(block, error = %e, "demoting a block failed; it stays where it is");
            }
            let ok = copied.is_ok();
            let kind = a.store.tier_kind(tier).to_string();
            let outcome = if ok { "moved" } else { "failed" };
            let labels = [("tier", kind.as_str()), ("outcome", outcome)];
            a.metrics.add(
                "curvine_evictions_total",
                "Blocks the tier evictor demoted to a lower tier (outcome moved or failed), or dropped to make room for a write where their data is whole elsewhere (outcome dropped).",
                &labels,
                1,
            );
            if ok {
                a.metrics.add(
                    "curvine_evicted_bytes_total",
                    "Bytes the tier evictor demoted to a lower tier.",
                    &[("tier", kind.as_str())],
                    plan.record.len,
                );
            }
            let _ = ractor::call!(a.manager, |reply| BlockMsg::FinishMove {
                block,
                to_tier: to,
                ok,
                reply
            });
            if a.store.usage(tier) <= a.conf.low_watermark {
                break;
            }
        }
        Ok(())
    }
}

impl Actor for TierEvictor {
    type Msg = EvictMsg;
    type State = EvictState;
    type Arguments = EvictArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<EvictMsg>,
        args: EvictArgs,
    ) -> Result<EvictState, ActorProcessingErr> {
        let role = format!(
            "evictor-{}",
            args.store
                .tier_kind(args.tier as usize)
                .to_string()
                .to_lowercase()
        );
        let stats = args.metrics.actor(&role, false);
        args.metrics.started(myself.get_id(), &stats);
        myself.send_interval(args.conf.evict_interval, || EvictMsg::Check);
        Ok(EvictState {
            args,
            stats,
            stuck_since: None,
            last_run: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<EvictMsg>,
        message: EvictMsg,
        state: &mut EvictState,
    ) -> Result<(), ActorProcessingErr> {
        let stats = state.stats.clone();
        let _handling = stats.handling("check");
        match message {
            EvictMsg::Check => Self::check(state).await,
        }
    }
}

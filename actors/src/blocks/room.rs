//! Room for a writer that finds none: the least recently used blocks whose
//! data is whole elsewhere (another copy, or the UFS object of a persisted
//! or cache_mode file) are dropped from this node until a tier the writer
//! may use has room. Each block's shard decides (`DropCopy`): it forgets
//! this copy only when the data is whole elsewhere, so the only copy of
//! data (unpersisted writes, a writer's blocks) is never dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ractor::ActorRef;

use curvine_messages::block::{BlockId, BlockMsg, CopyDrop, TierKind};

use super::BlockArgs;

/// Most blocks one reclaim asks shards about (each drop is a change of
/// the shard).
const MOST_ASKED: usize = 1024;

/// How long a block found waiting for its upload is not asked about again.
const UPLOADING_KNOWN: Duration = Duration::from_secs(2);
/// How long a block found the only copy of its data is not asked about again.
const ONLY_COPY_KNOWN: Duration = Duration::from_secs(30);

/// Blocks the shards kept when asked to drop them: whether they wait for
/// their upload (else they are the only copy), and when they were asked.
pub(super) type Kept = Arc<Mutex<HashMap<BlockId, (bool, Instant)>>>;

/// Whether a tier of kind `want` (any, without one) has `need` bytes free.
pub(super) fn has_room(args: &BlockArgs, need: u64, want: Option<TierKind>) -> bool {
    let store = &args.store;
    store
        .tiers_of(want)
        .into_iter()
        .any(|t| store.tiers[t].free() >= need)
}

/// Drops clean blocks until a tier of kind `want` (any, without one) has
/// `need` bytes free; returns the bytes dropped, and those of blocks met
/// that will be droppable once uploaded.
pub(super) async fn drop_clean(
    args: &BlockArgs,
    me: &ActorRef<BlockMsg>,
    kept: &Kept,
    (need, want): (u64, Option<TierKind>),
) -> (u64, u64) {
    let store = &args.store;
    let tiers = store.tiers_of(want);
    if need == 0 || has_room(args, need, want) {
        return (0, 0);
    }
    let node = args.namespace.cluster().node_id.clone();
    let mut dropped_bytes = 0;
    let mut uploading = 0;
    // The slowest tier first: its blocks are the coldest, and the faster
    // tiers' evictors demote into it.
    for &tier in tiers.iter().rev() {
        let coldest = match ractor::call!(me, |reply| BlockMsg::Coldest {
            tier: tier as u8,
            bytes: u64::MAX,
            reply
        }) {
            Ok(Ok(c)) => c,
            _ => continue,
        };
        let mut dropped: Vec<BlockId> = Vec::new();
        let mut freed = 0;
        let lack = need.saturating_sub(store.tiers[tier].free());
        let mut asked = 0;
        for (id, len) in coldest {
            if freed >= lack || asked >= MOST_ASKED {
                break;
            }
            // Each question is a change of the shard's log: a block kept
            // a moment ago is not asked about again at once.
            match kept.lock().get(&id) {
                Some((true, at)) if at.elapsed() < UPLOADING_KNOWN => {
                    uploading += len;
                    continue;
                }
                Some((false, at)) if at.elapsed() < ONLY_COPY_KNOWN => continue,
                _ => {}
            }
            asked += 1;
            let said = args.namespace.drop_copy(id, &node, true).await;
            match said {
                Ok(CopyDrop::Dropped { .. } | CopyDrop::Refetch) => {
                    dropped.push(id);
                    freed += len;
                }
                Ok(CopyDrop::Uploading) => {
                    uploading += len;
                    kept.lock().insert(id, (true, Instant::now()));
                }
                Ok(CopyDrop::OnlyCopy) => {
                    kept.lock().insert(id, (false, Instant::now()));
                }
                _ => {}
            }
        }
        kept.lock()
            .retain(|_, (_, at)| at.elapsed() < ONLY_COPY_KNOWN);
        if dropped.is_empty() {
            continue;
        }
        let count = dropped.len() as u64;
        let _ = ractor::call!(me, |reply| BlockMsg::Remove {
            ids: dropped.clone(),
            reply: Some(reply)
        });
        dropped_bytes += freed;
        let kind = store.tier_kind(tier).to_string();
        let metrics = &args.namespace.cluster().metrics;
        metrics.add(
            "curvine_evictions_total",
            "Blocks the tier evictor demoted to a lower tier (outcome moved or failed), or dropped to make room for a write where their data is whole elsewhere (outcome dropped).",
            &[("tier", kind.as_str()), ("outcome", "dropped")],
            count,
        );
        tracing::info!(
            tier = %kind,
            blocks = count,
            bytes = freed,
            "dropped cached blocks whose data is whole elsewhere to make room for a write"
        );
        if store.tiers[tier].free() >= need {
            break;
        }
    }
    (dropped_bytes, uploading)
}

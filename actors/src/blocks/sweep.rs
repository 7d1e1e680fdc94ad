//! Background sweeps of the BlockManager: blocks the shards freed are
//! removed from their nodes, and blocks no shard knows (orphans) from this
//! one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::ActorRef;

use curvine_messages::block::{BlockId, BlockMsg, BlockUse, FreedBlock};
use curvine_messages::{now_ns, shard_of, ShardId};

use super::BlockArgs;

/// When the sweeps first met each freed block (kept by the block manager
/// across sweeps; a new leader of a shard starts the grace again).
pub(super) type FreedSeen = Arc<parking_lot::Mutex<HashMap<BlockId, Instant>>>;

/// Removes blocks the shards this node serves freed `data.freed_grace` ago
/// or more, from every node that holds them, then lets the shards forget
/// them. A block on a node that is down or does not answer is forgotten
/// too: that node removes it as an orphan (no shard knows it) after
/// `data.orphan_grace`.
pub(super) async fn sweep_freed(args: &BlockArgs, me: &ActorRef<BlockMsg>, seen: &FreedSeen) {
    let cluster = args.namespace.cluster().clone();
    for shard in cluster.served_shards() {
        loop {
            let batch = match args.namespace.take_freed(shard, 512).await {
                Ok(f) if !f.is_empty() => f,
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot collect freed blocks now");
                    break;
                }
            };
            let n = batch.len();
            let freed = ripe(batch, seen, args.conf.freed_grace);
            if freed.is_empty() {
                break;
            }
            let mut by_node: HashMap<String, Vec<BlockId>> = HashMap::new();
            for f in &freed {
                if f.locs.is_empty() {
                    by_node
                        .entry(cluster.node_id.clone())
                        .or_default()
                        .push(f.id);
                }
                for node in &f.locs {
                    by_node.entry(node.clone()).or_default().push(f.id);
                }
            }
            let mut local_ok = true;
            for (node, ids) in by_node {
                if node == cluster.node_id {
                    local_ok = matches!(
                        ractor::call!(me, |reply| BlockMsg::Remove {
                            ids: ids.clone(),
                            reply: Some(reply)
                        }),
                        Ok(Ok(_))
                    );
                } else if let Ok(gw) = cluster.gateway(&node) {
                    let _ = gw
                        .call(
                            |reply| curvine_messages::cluster::PeerMsg::RemoveBlocks { ids, reply },
                            Some(Duration::from_secs(30)),
                        )
                        .await;
                }
            }
            if !local_ok {
                tracing::warn!(shard, "removing freed blocks failed");
                break;
            }
            {
                let mut seen = seen.lock();
                for f in &freed {
                    seen.remove(&f.id);
                }
            }
            args.namespace
                .forget_freed(shard, freed.into_iter().map(|f| f.id).collect());
            if n < 512 {
                break;
            }
        }
    }
}

/// Removes blocks older than the grace period that no shard knows.
pub(super) async fn sweep_orphans(args: &BlockArgs, me: &ActorRef<BlockMsg>) {
    let Ok(all) = args.store.all() else {
        return;
    };
    let cutoff = now_ns() - args.conf.orphan_grace.as_nanos() as i64;
    let mut by_shard: HashMap<ShardId, Vec<BlockId>> = HashMap::new();
    for (id, record) in all {
        if record.created_ns < cutoff {
            by_shard.entry(shard_of(id)).or_default().push(id);
        }
    }
    for (shard, ids) in by_shard {
        if shard as u32 >= args.namespace.shard_count() {
            continue;
        }
        for batch in ids.chunks(1024) {
            let uses = match args.namespace.check_blocks(shard, batch.to_vec()).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(shard, error = %e, "cannot check blocks now");
                    break;
                }
            };
            let orphans: Vec<BlockId> = batch
                .iter()
                .zip(uses)
                .filter(|(_, u)| *u == BlockUse::Unknown)
                .map(|(id, _)| *id)
                .collect();
            if !orphans.is_empty() {
                tracing::info!(
                    shard,
                    blocks = orphans.len(),
                    "removing blocks no file references"
                );
                let _ = me.cast(BlockMsg::Remove {
                    ids: orphans,
                    reply: None,
                });
            }
        }
    }
}

/// The blocks of `batch` first met `grace` ago or more (the others are
/// noted as met now, if they were not yet).
fn ripe(batch: Vec<FreedBlock>, seen: &FreedSeen, grace: Duration) -> Vec<FreedBlock> {
    let now = Instant::now();
    let mut seen = seen.lock();
    batch
        .into_iter()
        .filter(|f| now.duration_since(*seen.entry(f.id).or_insert(now)) >= grace)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_ripen_after_the_grace() {
        let seen = FreedSeen::default();
        let block = |id| FreedBlock {
            id,
            locs: Vec::new(),
        };
        let ids = |v: Vec<FreedBlock>| v.into_iter().map(|f| f.id).collect::<Vec<_>>();
        // Met now: none ripe under a grace, all without one.
        let hour = Duration::from_secs(3600);
        assert!(ripe(vec![block(1), block(2)], &seen, hour).is_empty());
        assert_eq!(
            ids(ripe(vec![block(1), block(2)], &seen, Duration::ZERO)),
            [1, 2]
        );
        // Met long ago: ripe.
        seen.lock().insert(3, Instant::now() - hour);
        assert_eq!(ids(ripe(vec![block(3), block(4)], &seen, hour)), [3]);
        assert!(seen.lock().contains_key(&4));
    }
}

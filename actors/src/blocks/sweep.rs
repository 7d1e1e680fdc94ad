//! Background sweeps of the BlockManager: blocks the shards freed are
//! removed from their nodes, and blocks no shard knows (orphans) from this
//! one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::ActorRef;

use curvine_messages::block::{BlockId, BlockMsg, BlockUse, FreedBlock};
use curvine_messages::members::MemberState;
use curvine_messages::{now_ns, shard_of, ShardId};

use super::{BlockArgs, BlockConf};

/// When the sweeps first met each freed block (kept by the block manager
/// across sweeps; a new leader of a shard starts the grace again).
pub(super) type FreedSeen = Arc<parking_lot::Mutex<HashMap<BlockId, Instant>>>;

/// Removes the blocks the shards this node serves freed, from every node
/// that holds them, as soon as no open reader holds them (every node is
/// asked for its readers' holds), then lets the shards forget them. A
/// block some node could not be asked about waits `data.freed_grace` from
/// when the sweeps first met it; a held one waits for its readers, at most
/// `data.read_hold_max`. A block on a node that is down or does not answer
/// is forgotten too: that node removes it as an orphan (no shard knows it)
/// after `data.orphan_grace`. Returns how many blocks it left because a
/// reader holds them.
pub(super) async fn sweep_freed(
    args: &BlockArgs,
    me: &ActorRef<BlockMsg>,
    seen: &FreedSeen,
) -> usize {
    let cluster = args.namespace.cluster().clone();
    let mut held = 0;
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
            let ids: Vec<BlockId> = batch.iter().map(|f| f.id).collect();
            let holds = held_in_cluster(args, &ids).await;
            let freed = ripe(batch, seen, &holds, &args.conf);
            held += holds.held.len();
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
    held
}

/// What the nodes said of a batch of freed blocks: which their readers
/// hold, and whether every node could be asked.
#[derive(Debug, Default)]
pub(super) struct Holds {
    held: HashSet<BlockId>,
    all_asked: bool,
}

/// Asks every member (this node directly) which of `ids` its readers hold.
async fn held_in_cluster(args: &BlockArgs, ids: &[BlockId]) -> Holds {
    let cluster = args.namespace.cluster().clone();
    let mut holds = Holds {
        held: args.store.holds.held(ids).into_iter().collect(),
        all_asked: true,
    };
    let asks = cluster
        .members()
        .into_iter()
        // A node that left the cluster has no readers; one that is down
        // may (cut off, not dead): it is asked, and not answering makes the
        // blocks wait the grace.
        .filter(|m| m.info.node_id != cluster.node_id && m.state != MemberState::Left)
        .map(|m| {
            let cluster = cluster.clone();
            let ids = ids.to_vec();
            async move {
                let gw = cluster.gateway(&m.info.node_id).ok()?;
                match gw
                    .call(
                        |reply| curvine_messages::cluster::PeerMsg::HeldBlocks { ids, reply },
                        Some(Duration::from_secs(2)),
                    )
                    .await
                {
                    Ok(ractor::rpc::CallResult::Success(Ok(held))) => Some(held),
                    _ => None,
                }
            }
        });
    for answer in futures::future::join_all(asks).await {
        match answer {
            Some(held) => holds.held.extend(held),
            None => holds.all_asked = false,
        }
    }
    holds
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

/// The blocks of `batch` that may go now: those no reader holds when every
/// node could be asked, else those first met `freed_grace` ago; those a
/// reader holds once first met `read_hold_max` ago. The others are noted as
/// met now, if they were not yet.
fn ripe(
    batch: Vec<FreedBlock>,
    seen: &FreedSeen,
    holds: &Holds,
    conf: &BlockConf,
) -> Vec<FreedBlock> {
    let now = Instant::now();
    let mut seen = seen.lock();
    batch
        .into_iter()
        .filter(|f| {
            let age = now.duration_since(*seen.entry(f.id).or_insert(now));
            if holds.held.contains(&f.id) {
                age >= conf.read_hold_max
            } else {
                holds.all_asked || age >= conf.freed_grace
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(freed_grace: Duration, read_hold_max: Duration) -> BlockConf {
        BlockConf {
            high_watermark: 0.9,
            low_watermark: 0.8,
            evict_interval: Duration::from_secs(1),
            orphan_grace: Duration::from_secs(600),
            freed_grace,
            read_hold_max,
            upload_wait: Duration::from_secs(45),
            tick: Duration::from_secs(1),
        }
    }

    #[test]
    fn freed_blocks_go_at_once_unless_held_or_a_node_was_not_asked() {
        let seen = FreedSeen::default();
        let block = |id| FreedBlock {
            id,
            locs: Vec::new(),
        };
        let ids = |v: Vec<FreedBlock>| v.into_iter().map(|f| f.id).collect::<Vec<_>>();
        let hour = Duration::from_secs(3600);
        let c = conf(hour, 2 * hour);
        // Every node asked, block 2 held: 1 goes now, 2 stays.
        let holds = Holds {
            held: [2].into_iter().collect(),
            all_asked: true,
        };
        assert_eq!(ids(ripe(vec![block(1), block(2)], &seen, &holds, &c)), [1]);
        // A node not asked: nothing goes before the grace.
        let unknown = Holds::default();
        assert!(ripe(vec![block(3)], &seen, &unknown, &c).is_empty());
        // Met a grace ago: goes; held but met read_hold_max ago: goes too.
        seen.lock().insert(3, Instant::now() - hour);
        seen.lock().insert(2, Instant::now() - 2 * hour);
        assert_eq!(
            ids(ripe(vec![block(2), block(3)], &seen, &holds, &c)),
            [2, 3]
        );
        let held_unknown = Holds {
            held: [3].into_iter().collect(),
            all_asked: false,
        };
        assert!(ripe(vec![block(3)], &seen, &held_unknown, &c).is_empty());
        assert!(seen.lock().contains_key(&1));
    }
}

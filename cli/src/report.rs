//! `report` (the cluster's nodes, tiers and shards) and `actors` (each
//! node's supervision tree).

use crate::ctx::Ctx;
use crate::output::{format_actor_trees, print_json, since};
use crate::{fail, Failure};

pub async fn actors(cx: &Ctx<'_>, node: Option<String>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let trees = client
        .actors(node)
        .await
        .map_err(|e| fail("actors", "", e))?;
    if json_out {
        print_json(&trees);
    } else {
        outp!("{}", format_actor_trees(&trees));
    }
    Ok(())
}

pub async fn report(cx: &Ctx<'_>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let report = client.report().await.map_err(|e| fail("report", "", e))?;
    if json_out {
        print_json(&report);
    } else {
        out!(
            "cluster {} ({} shards, {} node{})",
            report.cluster_id,
            report.shard_count,
            report.nodes.len(),
            if report.nodes.len() == 1 { "" } else { "s" }
        );
        for node in &report.nodes {
            let inodes: u64 = node.shards.iter().map(|s| s.inodes).sum();
            let envs: std::collections::BTreeMap<&str, u64> = node
                .shards
                .iter()
                .map(|s| (s.env.as_str(), s.env_bytes))
                .collect();
            out!(
                "node {} [{}{}]  client {}  cluster {}  data port {}  dir {}",
                node.node_id,
                node.state,
                since(node.state_since_ns),
                node.rpc_addr,
                node.cluster_addr,
                node.data_addr,
                if node.data_dir.is_empty() {
                    "-"
                } else {
                    &node.data_dir
                }
            );
            out!(
                "  inodes {inodes}, metadata on disk {} bytes in {} environment(s)",
                envs.values().sum::<u64>(),
                envs.len()
            );
            for t in &node.tiers {
                out!(
                    "  tier {} {}: {} of {} used, {} blocks{}",
                    t.kind,
                    t.path,
                    curvine_messages::human_bytes(t.used + t.reserved),
                    curvine_messages::human_bytes(t.capacity),
                    t.blocks,
                    if t.held > 0 {
                        format!(
                            " ({} freed, held open by readers)",
                            curvine_messages::human_bytes(t.held)
                        )
                    } else {
                        String::new()
                    }
                );
            }
            if node.persist.files > 0 {
                let p = &node.persist;
                out!(
                    "  write-back: {} file(s), {} waiting for the UFS, the oldest for {}s",
                    p.files,
                    curvine_messages::human_bytes(p.bytes),
                    (curvine_messages::now_ns() - p.oldest_ns).max(0) / 1_000_000_000
                );
            }
            if node.checksum_errors > 0 {
                out!("  checksum errors detected: {}", node.checksum_errors);
            }
            out!(
                "  {:>5} {:>10} {:>10} {:>8}",
                "shard",
                "inodes",
                "entries",
                "pending"
            );
            for s in &node.shards {
                out!(
                    "  {:>5} {:>10} {:>10} {:>8}",
                    s.shard,
                    s.inodes,
                    s.dentries,
                    s.intents
                );
            }
        }
    }
    Ok(())
}

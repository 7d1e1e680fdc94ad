//! `admin` commands: fsck, scrub, the cluster map (shards), shard moves,
//! rebalance and decommission.

use crate::args::AdminCommand;
use crate::ctx::Ctx;
use crate::output::{format_scrub, print_json};
use crate::{fail, Failure};

pub async fn run(cx: &Ctx<'_>, command: AdminCommand) -> Result<(), Failure> {
    match command {
        AdminCommand::Shards => shards(cx).await,
        AdminCommand::MoveShard { shard, node } => move_shard(cx, shard, &node).await,
        AdminCommand::Rebalance => rebalance(cx).await,
        AdminCommand::Decommission { node } => decommission(cx, &node).await,
        AdminCommand::Scrub { node, repair } => scrub(cx, node, repair).await,
        AdminCommand::Fsck => fsck(cx).await,
    }
}

async fn shards(cx: &Ctx<'_>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let report = client.report().await.map_err(|e| fail("shards", "", e))?;
    if json_out {
        print_json(&report.map);
    } else {
        let states: std::collections::HashMap<&str, &str> = report
            .nodes
            .iter()
            .map(|n| (n.node_id.as_str(), n.state.as_str()))
            .collect();
        out!(
            "cluster map version {} ({} shards, {} node{})",
            report.map.version,
            report.shard_count,
            report.nodes.len(),
            if report.nodes.len() == 1 { "" } else { "s" }
        );
        // Members are named by their node where the report knows it.
        let member = |id: u64| -> String {
            report
                .nodes
                .iter()
                .find(|n| curvine_messages::wal::member_id(&n.node_id) == id)
                .map(|n| n.node_id.clone())
                .unwrap_or_else(|| {
                    if id == 0 {
                        "-".into()
                    } else {
                        format!("#{id:x}")
                    }
                })
        };
        out!(
            "{:>5}  {:<14} {:<12} {:>10}  {:<24} {:<14} {:>6} {:>10} {:>10} {:>5}",
            "shard",
            "node",
            "state",
            "inodes",
            "replicas",
            "leader",
            "term",
            "commit",
            "applied",
            "lag"
        );
        for (shard, node) in report.map.shards.iter().enumerate() {
            // Reported by the node that serves it (for a replicated shard,
            // the member leading it).
            let stats = report
                .nodes
                .iter()
                .flat_map(|n| n.shards.iter())
                .find(|s| s.shard as usize == shard);
            let inodes = stats
                .map(|s| s.inodes.to_string())
                .unwrap_or_else(|| "-".into());
            let (replicas, leader, term, commit, applied, lag) =
                match stats.and_then(|s| s.group.as_ref()) {
                    Some(g) => (
                        g.voters
                            .iter()
                            .map(|v| member(*v))
                            .collect::<Vec<_>>()
                            .join(","),
                        member(g.leader),
                        g.term.to_string(),
                        g.commit.to_string(),
                        g.applied.to_string(),
                        g.commit.saturating_sub(g.applied).to_string(),
                    ),
                    None => {
                        let dash = || "-".to_string();
                        (dash(), dash(), dash(), dash(), dash(), dash())
                    }
                };
            out!(
                "{shard:>5}  {node:<14} {:<12} {inodes:>10}  {replicas:<24} {leader:<14} {term:>6} {commit:>10} {applied:>10} {lag:>5}",
                states.get(node.as_str()).copied().unwrap_or("unknown")
            );
        }
    }
    Ok(())
}

async fn move_shard(cx: &Ctx<'_>, shard: u16, node: &str) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let moved = client
        .call(curvine_messages::rpc::MoveShard {
            shard,
            to: node.to_string(),
        })
        .await
        .map_err(|e| fail("move-shard", &format!("{shard} {node}"), e))?;
    if json_out {
        print_json(&moved);
    } else if moved.from == moved.to {
        out!("shard {} is already on node {}", moved.shard, moved.to);
    } else {
        out!(
            "moved shard {} from node {} to node {}",
            moved.shard,
            moved.from,
            moved.to
        );
    }
    Ok(())
}

async fn rebalance(cx: &Ctx<'_>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let moves = client
        .call(curvine_messages::rpc::Rebalance)
        .await
        .map_err(|e| fail("rebalance", "", e))?;
    if json_out {
        print_json(&moves);
    } else if moves.is_empty() {
        out!("shards are already balanced");
    } else {
        for m in &moves {
            out!(
                "moved shard {} from node {} to node {}",
                m.shard,
                m.from,
                m.to
            );
        }
        out!("{} shard(s) moved", moves.len());
    }
    Ok(())
}

async fn decommission(cx: &Ctx<'_>, node: &str) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let report = client
        .call(curvine_messages::rpc::Decommission {
            node: node.to_string(),
        })
        .await
        .map_err(|e| fail("decommission", node, e))?;
    if json_out {
        print_json(&report);
    } else {
        for m in &report.shards {
            out!("moved shard {} to node {}", m.shard, m.to);
        }
        out!(
            "{} block(s) copied to other nodes, {} could not be",
            report.blocks_moved,
            report.blocks_failed
        );
    }
    if report.blocks_failed > 0 {
        return Err(Failure {
            what: format!("decommission {node}"),
            error: format!(
                "{} block(s) still have their only copy there; the node stays (draining)",
                report.blocks_failed
            ),
            code: 1,
        });
    }
    if !json_out {
        out!("node {node} has left the cluster; it can be stopped");
    }
    Ok(())
}

async fn scrub(cx: &Ctx<'_>, node: Option<String>, repair: bool) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let nodes = client
        .scrub(node, repair)
        .await
        .map_err(|e| fail("scrub", "", e))?;
    if json_out {
        print_json(&nodes);
    } else {
        outp!("{}", format_scrub(&nodes));
    }
    let left = nodes
        .iter()
        .map(|n| {
            n.problems
                .iter()
                .filter(|p| !(repair && p.recoverable))
                .count()
                + usize::from(n.error.is_some())
        })
        .sum::<usize>();
    if left > 0 {
        return Err(Failure {
            what: "scrub".into(),
            error: format!("{left} problem(s) left"),
            code: 1,
        });
    }
    Ok(())
}

async fn fsck(cx: &Ctx<'_>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let report = client.fsck().await.map_err(|e| fail("fsck", "", e))?;
    if json_out {
        print_json(&report);
    } else {
        out!(
            "{} inodes, {} directories, {} entries, {} pending operations, {} name locks",
            report.inodes,
            report.directories,
            report.dentries,
            report.pending_intents,
            report.locks
        );
        if report.compared_copies > 0 {
            out!(
                "{} replicated shards: their members' copies compared",
                report.compared_copies
            );
        }
        for p in &report.problems {
            out!("problem: {p}");
        }
        out!(
            "{}",
            if report.problems.is_empty() {
                "namespace is consistent"
            } else {
                "namespace has problems"
            }
        );
    }
    if !report.problems.is_empty() {
        return Err(Failure {
            what: "fsck".into(),
            error: format!("{} problems found", report.problems.len()),
            code: 1,
        });
    }
    Ok(())
}

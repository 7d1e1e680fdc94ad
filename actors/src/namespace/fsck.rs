//! Inspection: the counters of this node's shards, and fsck, the
//! namespace's consistency rules checked over every shard's content.

use curvine_messages::rpc::FsckReport;
use curvine_messages::shard::{ShardMsg, ShardScan};
use curvine_messages::{
    shard_of, Attr, FileKind, FsError, FsResult, Ino, ShardId, ShardStats, ROOT_INO,
};

use super::Namespace;

impl Namespace {
    /// Counters of the shards this node serves.
    pub async fn shard_stats(&self) -> FsResult<Vec<ShardStats>> {
        let mut out = Vec::new();
        // The shards this node serves: its own, and the replicated ones
        // it leads now (each shard is reported by one node).
        let map = self.cluster.map();
        for shard in self.cluster.served_shards() {
            match self.call(shard, |reply| ShardMsg::Stats { reply }).await {
                Ok(stats) => out.push(stats),
                // Leadership moved meanwhile: the new leader reports it.
                Err(e) if map.replicated(shard) => {
                    tracing::debug!(shard, error = %e, "shard left out of this node's report")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The counters of one shard, from the node serving it (its leader).
    pub async fn stats_of(&self, shard: ShardId) -> FsResult<ShardStats> {
        self.call(shard, |reply| ShardMsg::Stats { reply }).await
    }

    /// Checks the namespace across all shards.
    pub async fn fsck(&self) -> FsResult<FsckReport> {
        let mut scans: Vec<ShardScan> = Vec::new();
        for shard in 0..self.shard_count as ShardId {
            scans.push(self.call(shard, |reply| ShardMsg::Scan { reply }).await?);
        }
        let mut report = check_scans(&scans);
        self.compare_copies(&mut report).await;
        Ok(report)
    }

    /// Compares the copies of each replicated shard on its members that
    /// are up once they applied the same entries (a member still catching
    /// up is waited for, up to `COPIES_SETTLE`): a copy that differs from
    /// the others is a problem, as is a member that does not answer or
    /// stays behind.
    async fn compare_copies(&self, report: &mut FsckReport) {
        use curvine_messages::cluster::MemberState;
        const COPIES_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);
        const ASK_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);
        let map = self.cluster.map();
        'shards: for shard in 0..self.shard_count as ShardId {
            let members: Vec<&str> = map
                .members(shard)
                .into_iter()
                .filter(|n| {
                    *n == self.cluster.node_id
                        || self
                            .cluster
                            .member(n)
                            .is_some_and(|m| m.state == MemberState::Up)
                })
                .collect();
            if !map.replicated(shard) || members.len() < 2 {
                continue;
            }
            let until = std::time::Instant::now() + COPIES_SETTLE;
            let problem = loop {
                let mut copies = Vec::new();
                let mut failed = None;
                for node in &members {
                    let within = Some(std::time::Instant::now() + ASK_WITHIN);
                    match self
                        .call_until(shard, Some(node), within, |reply| ShardMsg::Digest {
                            reply,
                        })
                        .await
                    {
                        Ok(d) => copies.push((node.to_string(), d)),
                        // Down since the map was read (its node's
                        // connection closed before the cluster says so):
                        // the copies of the members that live are compared.
                        Err(FsError::NodeDown(_)) => {}
                        Err(e) => failed = Some(format!("member {node} did not answer: {e}")),
                    }
                }
                if failed.is_none() && copies.len() < 2 {
                    // One member lives: nothing to compare it with.
                    continue 'shards;
                }
                let settled = failed.is_none()
                    && copies.iter().all(|(_, d)| d.applied == copies[0].1.applied);
                if settled {
                    let (first, d0) = &copies[0];
                    break copies
                        .iter()
                        .find(|(_, d)| (d.records, d.hash) != (d0.records, d0.hash))
                        .map(|(node, d)| {
                            format!(
                                "shard {shard}: at applied index {} the copy on {node} ({} records, hash {:016x}) differs from the copy on {first} ({} records, hash {:016x})",
                                d.applied, d.records, d.hash, d0.records, d0.hash
                            )
                        });
                }
                if std::time::Instant::now() >= until {
                    break Some(failed.unwrap_or_else(|| {
                        let applied: Vec<String> = copies
                            .iter()
                            .map(|(n, d)| format!("{n} at {}", d.applied))
                            .collect();
                        format!(
                            "shard {shard}: its members did not apply the same entries within {COPIES_SETTLE:?} ({})",
                            applied.join(", ")
                        )
                    }));
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            };
            report.compared_copies += 1;
            report.problems.extend(problem);
        }
    }
}

/// Consistency rules of the namespace, checked over every shard's content.
pub fn check_scans(scans: &[ShardScan]) -> FsckReport {
    use std::collections::HashMap;
    let mut report = FsckReport::default();
    let mut inodes: HashMap<Ino, &Attr> = HashMap::new();
    for scan in scans {
        for attr in &scan.inodes {
            if shard_of(attr.ino) != scan.shard {
                report.problems.push(format!(
                    "inode {:#x} stored on shard {} but named for shard {}",
                    attr.ino,
                    scan.shard,
                    shard_of(attr.ino)
                ));
            }
            inodes.insert(attr.ino, attr);
        }
        report.pending_intents += scan.intents.len() as u64;
        report.locks += scan.locks;
    }
    report.inodes = inodes.len() as u64;
    let mut links: HashMap<Ino, u32> = HashMap::new();
    let mut subdirs: HashMap<Ino, u32> = HashMap::new();
    for scan in scans {
        for (parent, entry) in &scan.dentries {
            report.dentries += 1;
            if shard_of(*parent) != scan.shard {
                report.problems.push(format!(
                    "entry '{}' of directory {parent:#x} stored on shard {}",
                    entry.name, scan.shard
                ));
            }
            match inodes.get(parent) {
                Some(p) if p.kind == FileKind::Dir => {}
                Some(_) => report.problems.push(format!(
                    "entry '{}' under non-directory {parent:#x}",
                    entry.name
                )),
                None => report.problems.push(format!(
                    "entry '{}' under missing directory {parent:#x}",
                    entry.name
                )),
            }
            match inodes.get(&entry.ino) {
                None => report.problems.push(format!(
                    "dangling entry '{}' in {parent:#x} -> missing inode {:#x}",
                    entry.name, entry.ino
                )),
                Some(attr) if attr.kind != entry.kind => report.problems.push(format!(
                    "entry '{}' in {parent:#x} says {} but inode {:#x} is a {}",
                    entry.name,
                    entry.kind.name(),
                    entry.ino,
                    attr.kind.name()
                )),
                Some(attr) => {
                    if attr.kind == FileKind::Dir {
                        *subdirs.entry(*parent).or_default() += 1;
                        if attr.parent != *parent {
                            report.problems.push(format!(
                                "directory {:#x} is in {parent:#x} but its '..' is {:#x}",
                                attr.ino, attr.parent
                            ));
                        }
                    }
                }
            }
            *links.entry(entry.ino).or_default() += 1;
        }
    }
    for (ino, attr) in &inodes {
        if attr.kind == FileKind::Dir {
            report.directories += 1;
            let expected = 2 + subdirs.get(ino).copied().unwrap_or(0);
            if attr.nlink != expected {
                report.problems.push(format!(
                    "directory {ino:#x} has nlink {} but {} subdirectories",
                    attr.nlink,
                    expected - 2
                ));
            }
        }
        if *ino == ROOT_INO {
            continue;
        }
        let refs = links.get(ino).copied().unwrap_or(0);
        if refs == 0 {
            report.problems.push(format!(
                "orphan {} inode {ino:#x} (no entry points to it)",
                attr.kind.name()
            ));
        } else if attr.kind == FileKind::Dir && refs != 1 {
            report
                .problems
                .push(format!("directory {ino:#x} has {refs} entries"));
        } else if attr.kind != FileKind::Dir && refs != attr.nlink {
            report.problems.push(format!(
                "inode {ino:#x} has nlink {} but {refs} entries",
                attr.nlink
            ));
        }
    }
    if !inodes.contains_key(&ROOT_INO) {
        report.problems.push("the root directory is missing".into());
    }
    report.problems.sort();
    report
}

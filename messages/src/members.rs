//! The members of a cluster and the cluster map: what a node tells the
//! others about itself, how it sees them, and which node serves each shard.

use serde::{Deserialize, Serialize};

use crate::block::{DataNode, TierStats};
use crate::codec::Versioned;
use crate::types::ShardId;

/// Which node serves each shard. Held by shard 0 (in its `meta` table) and
/// cached by every node; a higher version replaces a lower one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub version: u64,
    /// Node id per shard.
    pub shards: Vec<String>,
}

impl Versioned for ClusterMap {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "cluster map";
}

impl ClusterMap {
    /// Every shard on one node (a cluster being formatted).
    pub fn single(node_id: &str, shard_count: u32) -> ClusterMap {
        ClusterMap {
            version: 1,
            shards: vec![node_id.to_string(); shard_count as usize],
        }
    }

    pub fn owner(&self, shard: ShardId) -> Option<&str> {
        self.shards.get(shard as usize).map(String::as_str)
    }

    /// The shards `node` serves.
    pub fn shards_of(&self, node: &str) -> Vec<ShardId> {
        self.shards
            .iter()
            .enumerate()
            .filter(|(_, n)| n.as_str() == node)
            .map(|(i, _)| i as ShardId)
            .collect()
    }

    /// The same map with `shard` on `node`, one version later.
    pub fn with_owner(&self, shard: ShardId, node: &str) -> ClusterMap {
        let mut next = self.clone();
        next.version += 1;
        if let Some(slot) = next.shards.get_mut(shard as usize) {
            *slot = node.to_string();
        }
        next
    }
}

/// What a node tells the others about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub node_id: String,
    /// The cluster port (ractor_cluster).
    pub cluster_addr: String,
    /// The client port.
    pub rpc_addr: String,
    pub data_addr: String,
    /// The HTTP port; empty while the node serves none.
    pub http_addr: String,
    /// Host name and boot id: clients on the same host use short-circuit I/O.
    pub host_key: String,
    pub tiers: Vec<TierStats>,
    pub started_ns: i64,
    /// The node is being emptied and takes no new shards or blocks.
    pub draining: bool,
}

impl MemberInfo {
    /// Its data port, as readers and writers reach it.
    pub fn data_node(&self) -> DataNode {
        DataNode {
            node_id: self.node_id.clone(),
            data_addr: self.data_addr.clone(),
            host_key: self.host_key.clone(),
        }
    }

    /// Free bytes over all tiers (capacity minus used and reserved).
    pub fn free_bytes(&self) -> u64 {
        self.tiers
            .iter()
            .map(|t| t.capacity.saturating_sub(t.used + t.reserved))
            .sum()
    }
}

/// What a node knows about another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Heard from within the node timeout.
    Up,
    /// Silent for longer than the node timeout.
    Down,
    /// Decommissioned: it left and is not expected back.
    Left,
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemberState::Up => "up",
            MemberState::Down => "down",
            MemberState::Left => "left",
        })
    }
}

/// A member as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub info: MemberInfo,
    pub state: MemberState,
    /// When the last heartbeat arrived (this node's clock), 0 for itself.
    pub last_seen_ns: i64,
    /// Since when the node is in `state`.
    pub since_ns: i64,
}

//! The members of a cluster and the cluster map: what a node tells the
//! others about itself, how it sees them, and which node serves each shard.

use serde::{Deserialize, Serialize};

use crate::block::{DataNode, TierStats};
use crate::codec::Versioned;
use crate::types::ShardId;

/// Which nodes hold each shard. Held by shard 0 (in its `meta` table) and
/// cached by every node; a higher version replaces a lower one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub version: u64,
    /// Node id per shard: the node that serves it, or, for a shard with
    /// followers (a replicated shard), its preferred leader.
    pub shards: Vec<String>,
    /// The other members of each shard's Raft group (`meta.replicas` - 1
    /// nodes once the cluster has them); empty for a shard that has one
    /// member. Requests go to whichever member leads.
    pub followers: Vec<Vec<String>>,
}

impl Versioned for ClusterMap {
    const VERSION: u8 = 2;
    const WHAT: &'static str = "cluster map";

    /// Version 1 named one node per shard.
    fn migrate(version: u8, payload: &[u8]) -> Result<Self, crate::codec::CodecError> {
        #[derive(Deserialize)]
        struct V1 {
            version: u64,
            shards: Vec<String>,
        }
        if version != 1 {
            return Err(crate::codec::CodecError::UnknownVersion {
                what: Self::WHAT,
                found: version,
            });
        }
        let v1: V1 = crate::codec::from_bytes(Self::WHAT, payload)?;
        Ok(ClusterMap {
            version: v1.version,
            shards: v1.shards,
            followers: Vec::new(),
        })
    }
}

impl ClusterMap {
    /// Every shard on one node (a cluster being formatted).
    pub fn single(node_id: &str, shard_count: u32) -> ClusterMap {
        ClusterMap {
            version: 1,
            shards: vec![node_id.to_string(); shard_count as usize],
            followers: Vec::new(),
        }
    }

    pub fn owner(&self, shard: ShardId) -> Option<&str> {
        self.shards.get(shard as usize).map(String::as_str)
    }

    /// The followers of `shard` (none for a shard with one member).
    pub fn followers_of(&self, shard: ShardId) -> &[String] {
        self.followers
            .get(shard as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Every member of `shard`'s group: its owner first, then its followers.
    pub fn members(&self, shard: ShardId) -> Vec<&str> {
        self.owner(shard)
            .into_iter()
            .chain(self.followers_of(shard).iter().map(String::as_str))
            .collect()
    }

    /// Whether `shard`'s group has members on several nodes.
    pub fn replicated(&self, shard: ShardId) -> bool {
        !self.followers_of(shard).is_empty()
    }

    /// Whether `node` holds a copy of `shard` (owner or follower).
    pub fn holds(&self, shard: ShardId, node: &str) -> bool {
        self.members(shard).contains(&node)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_versioned, encode_versioned};

    #[test]
    fn a_map_of_the_previous_release_reads_as_one_member_per_shard() {
        #[derive(Serialize)]
        struct V1 {
            version: u64,
            shards: Vec<String>,
        }
        let mut bytes = vec![1u8];
        bytes.extend(
            postcard::to_allocvec(&V1 {
                version: 7,
                shards: vec!["a".into(), "b".into()],
            })
            .unwrap(),
        );
        let map: ClusterMap = decode_versioned(&bytes).unwrap();
        assert_eq!(map.version, 7);
        assert_eq!(map.members(1), vec!["b"]);
        assert!(!map.replicated(0));
        // And the current version round-trips with its followers.
        let mut next = map.clone();
        next.followers = vec![vec!["b".into()], vec![]];
        let back: ClusterMap = decode_versioned(&encode_versioned(&next)).unwrap();
        assert_eq!(back, next);
        assert!(back.replicated(0) && !back.replicated(1));
        assert_eq!(back.members(0), vec!["a", "b"]);
        assert!(back.holds(0, "b") && !back.holds(1, "a"));
    }
}

//! Where blocks go and who may touch them: the data ports of live nodes,
//! the node a new block is placed on, and the grant (token) to write it.

use std::sync::Arc;

use curvine_actors::cluster::ClusterView;
use curvine_actors::token::TokenKey;
use curvine_messages::block::{Access, BlockId, DataNode};
use curvine_messages::rpc::BlockGrant;

pub struct Placement {
    view: Arc<ClusterView>,
    tokens: TokenKey,
    /// This node's data port, as clients reach it.
    data: DataNode,
}

impl Placement {
    pub fn new(view: Arc<ClusterView>, tokens: TokenKey, data: DataNode) -> Placement {
        Placement { view, tokens, data }
    }

    /// The data ports of the nodes that are up. A block whose nodes are all
    /// missing here is on nodes that are down.
    pub fn live_nodes(&self) -> Vec<DataNode> {
        self.view
            .live()
            .into_iter()
            .filter(|m| !m.data_addr.is_empty())
            .map(|m| m.data_node())
            .collect()
    }

    /// Where a new block goes: this node while it has room for a block,
    /// else the live node with the most free space.
    pub fn place(&self, block_size: u64) -> DataNode {
        let me = self.view.me();
        if !me.draining && me.free_bytes() >= block_size {
            return self.data.clone();
        }
        self.view
            .live()
            .into_iter()
            .filter(|m| !m.draining && !m.data_addr.is_empty())
            .max_by_key(|m| m.free_bytes())
            .map(|m| m.data_node())
            .unwrap_or_else(|| self.data.clone())
    }

    /// A new block to write.
    pub fn grant(&self, id: BlockId, index: u32, block_size: u64) -> BlockGrant {
        BlockGrant {
            id,
            index,
            token: self.tokens.issue(id, Access::Write),
            node: self.place(block_size),
        }
    }

    /// This node's data port.
    pub fn data_node(&self) -> &DataNode {
        &self.data
    }
}

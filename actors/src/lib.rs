//! The actors of a node and the logic they run.
//!
//! - [`shard::NamespaceShard`]: one namespace shard over its LMDB environment
//!   ([`store`]), with a dedicated writer thread and group commit ([`writer`]).
//! - [`engine::Engine`]: one metadata environment, its log ([`wal`]) and its
//!   write thread, owned by one object.
//! - [`host::ShardHost`]: supervises the node's shards, keeps the [`host::ShardDirectory`].
//! - [`namespace::Namespace`]: path operations across shards and the intent driver.
//! - [`blocks::BlockManager`]: the node's block files in tiers, their index,
//!   and a [`blocks::TierEvictor`] per tier.
//! - [`token`]: access tokens for blocks.
//! - [`supervisor`]: the restart policy every supervisor applies.

pub mod blocks;
pub mod clock;
pub mod cluster;
pub mod engine;
pub mod faults;
pub mod host;
pub mod membership;
pub mod mounts;
pub mod namespace;
pub mod replica;
pub mod shard;
pub mod store;
pub mod token;
pub mod trace;
pub mod txn;
pub mod ufs;
pub mod wal;
pub mod writer;

pub use curvine_runtime::{stats, supervisor};

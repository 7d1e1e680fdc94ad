//! Plain data shared by every part of the system: the messages actors
//! exchange, the client protocol, stored records, the codec and `FsError`.
//!
//! This crate depends on no storage engine, FUSE or HTTP crate; it only knows
//! how values look and how they are encoded.

pub mod attr;
pub mod block;
pub mod cluster;
pub mod codec;
pub mod delegation;
pub mod error;
pub mod members;
pub mod mount;
pub mod names;
pub mod path;
pub mod raft;
pub mod remote;
pub mod rpc;
pub mod shard;
pub mod stats;
pub mod trace;
pub mod types;
pub mod wal;

pub use attr::{Attr, AttrV1, AttrV2};
pub use error::{FsError, FsResult};
pub use types::*;

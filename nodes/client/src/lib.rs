//! The client library of a curvine cluster: what the CLI, the FUSE mount
//! and the benchmark embed.
//!
//! - [`client::Client`]: requests to the cluster's client ports, with
//!   failover between nodes;
//! - [`io`]: [`io::FileReader`] and [`io::FileWriter`], over block files on
//!   this host (short-circuit) or nodes' data ports.
//!
//! Paths are `&str`. A name is any bytes but `/` and NUL: one whose bytes
//! are not UTF-8 is written in the string form [`names::from_bytes`] gives
//! (and [`names::to_bytes`] reads back), as the mount and the CLI do.
//!
//! It links no storage engine, UFS client, HTTP server or cluster
//! transport (checked by `.ci/run`).

pub mod client;
pub mod io;

pub use client::{client_conf, current_owner, Client};
/// File names as bytes: their string form in paths.
pub use curvine_messages::names;
/// The trace a task works for: requests it sends (client port and data
/// port) join it.
pub use curvine_runtime::trace::{current as current_trace, scope as trace_scope};

//! A curvine node (assembly of its actors, the client port and the cluster
//! port) and the client library that talks to nodes.

pub mod admin;
pub mod client;
pub mod data;
pub mod gateway;
pub mod http;
pub mod identity;
pub mod io;
pub mod join;
pub mod load;
pub mod node;
pub mod persist;
pub mod scrub;
pub mod server;
pub mod service;
pub mod tls;
pub mod ufs;

pub use client::Client;
/// The trace a task works for: requests it sends (client port and data
/// port) join it.
pub use curvine_actors::trace::{current as current_trace, scope as trace_scope};

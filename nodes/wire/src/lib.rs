//! What both ends of a node's ports share, so that the client library and
//! the node agree on them without either depending on the other:
//!
//! - [`frame`]: length-prefixed frames of the client and data ports;
//! - [`tls`]: the TLS settings and the [`tls::Transport`] every port runs on;
//! - [`cookie`]: the cookie proof of the client port, and the local cookie;
//! - [`host`]: which host a process runs on (short-circuit decisions);
//! - [`data`]: connections to a node's data port, block streams and writes.
//!
//! It links no storage engine, UFS client, HTTP server or cluster transport.

pub mod cookie;
pub mod data;
pub mod frame;
pub mod host;
pub mod tls;

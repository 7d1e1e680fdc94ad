//! What every process of the cluster (node, FUSE mount) runs its actors and
//! tasks on:
//!
//! - [`supervisor`]: the one supervision mechanism: restart with backoff and
//!   a limit, then escalate; stable handles that reach a restarted actor.
//! - [`stats`]: per-actor counters (`curvine-cli actors`) and Prometheus
//!   metrics.
//! - [`trace`]: the trace context of the running task.
//! - [`limits`]: process limits raised at start.
//!
//! It links no storage, UFS, HTTP or cluster-transport crate, so the client
//! side (client library, FUSE, CLI) can use it.

pub mod limits;
pub mod stats;
pub mod supervisor;
pub mod trace;

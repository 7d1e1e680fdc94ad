//! A curvine node: the assembly of its actors (`node`), its ports (client,
//! data, cluster, HTTP), the gateway other nodes reach it through, and the
//! service behind the client port, one module per subsystem (`service`).

pub mod client_port;
pub mod cluster_port;
pub mod data_port;
pub mod gateway;
pub mod http;
pub mod identity;
pub mod join;
pub mod keeper;
pub mod node;
pub mod ports;
pub mod raft_net;
pub mod service;

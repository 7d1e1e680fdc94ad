//! A curvine node: the assembly of its actors, the client, data and
//! cluster ports, the HTTP port, and the service behind the client port.

pub mod admin;
pub mod cluster_tls;
pub mod data;
pub mod gateway;
pub mod http;
pub mod identity;
pub mod join;
pub mod load;
pub mod node;
pub mod persist;
pub mod scrub;
pub mod server;
pub mod service;
pub mod ufs;

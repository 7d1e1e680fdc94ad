//! Why a node could not start.

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    DataDir(#[from] crate::identity::IdentityError),
    #[error("cannot listen for clients on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    #[error("cannot start the cluster port on {addr}: {reason}")]
    Cluster { addr: String, reason: String },
    #[error("cannot open the metadata store: {0}")]
    Store(String),
    #[error("cannot start the actors: {0}")]
    Actors(String),
    #[error("cannot join the cluster: {0}")]
    Join(String),
    #[error("TLS settings: {0}")]
    Tls(String),
}

//! Configuration of nodes and clients.
//!
//! Every key has a default ([`Config::default`]); `conf/curvine.toml` documents
//! each one. Sources apply in this order, later ones winning: defaults, the
//! file (`--conf` or `CURVINE_CONF`), `CURVINE_*` environment variables
//! (`node.data_dir` is `CURVINE_NODE_DATA_DIR`), then command-line flags and
//! `-c key=value`. An unknown key or a bad value stops loading with an error
//! that names the key, the value and what is allowed.

mod derived;
mod error;
mod loader;
mod schema;
mod units;
mod validate;

pub use derived::TierSpec;
pub use error::{ConfError, Source};
pub use loader::{Entry, Loader, CONF_ENV, ENV_PREFIX};
pub use schema::{
    ClientConf, ClusterConf, Config, DataConf, FuseConf, HttpConf, LogConf, MetaConf, NodeConf,
    SupervisorConf, TlsConf, TraceConf, UfsConf,
};
pub use units::{ByteSize, Dur};

//! What running a command starts from: the configuration the global
//! options give, and the context ([`Ctx`]) of a command that talks to the
//! cluster.

use std::future::Future;

use curvine_client::Client;
use curvine_conf::{Config, Loader};
use curvine_messages::path::normalize;
use curvine_messages::FsError;

use crate::{fail, Failure, Global};

/// Whether a `-c` key names a UFS mount property rather than a config key.
fn is_mount_property(key: &str) -> bool {
    key.starts_with("s3.")
}

/// The `-c` settings that are UFS mount properties.
pub fn mount_properties(overrides: &[String]) -> std::collections::BTreeMap<String, String> {
    overrides
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| is_mount_property(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn config(global: &Global) -> Result<(Loader, Config), String> {
    let overrides: Vec<String> = global
        .overrides
        .iter()
        .filter(|kv| !is_mount_property(kv.split('=').next().unwrap_or("")))
        .cloned()
        .collect();
    let mut loader =
        Loader::standard(global.conf.as_deref(), &overrides).map_err(|e| e.to_string())?;
    if let Some(c) = &global.cluster {
        loader
            .flag("client.cluster", c, "--cluster")
            .map_err(|e| e.to_string())?;
    }
    let config = loader.build().map_err(|e| e.to_string())?;
    Ok((loader, config))
}

/// What a command that talks to the cluster works with: the client, and
/// whether to print JSON.
pub struct Ctx<'a> {
    pub client: &'a Client,
    pub json_out: bool,
}

impl Ctx<'_> {
    /// A path of the command line, absolute (relative ones are taken from `/`).
    pub fn abs(&self, p: &str) -> Result<String, Failure> {
        normalize(p, "/").map_err(|e| fail("path", p, e))
    }

    /// Runs `request` on a path of the command line made absolute; a failure
    /// is named by `op` and the path as given. Returns the absolute path with
    /// the answer.
    pub async fn on_path<T, F: Future<Output = Result<T, FsError>>>(
        &self,
        op: &str,
        path: &str,
        request: impl FnOnce(String) -> F,
    ) -> Result<(String, T), Failure> {
        let abs = self.abs(path)?;
        let answer = request(abs.clone()).await.map_err(|e| fail(op, path, e))?;
        Ok((abs, answer))
    }
}

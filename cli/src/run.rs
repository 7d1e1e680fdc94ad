//! Running a parsed command line: the configuration, the connection to the
//! cluster, and the dispatch to the command groups.

use std::future::Future;

use curvine_client::Client;
use curvine_conf::{Config, Loader};
use curvine_messages::path::normalize;
use curvine_messages::FsError;

use crate::args::{Command, ConfCommand};
use crate::{admin, conf, fs, mount, report, trace};
use crate::{fail, Cli, Failure, Global};

/// Whether a `-c` key names a UFS mount property rather than a config key.
fn is_mount_property(key: &str) -> bool {
    key.starts_with("s3.")
}

/// The `-c` settings that are UFS mount properties.
fn mount_properties(overrides: &[String]) -> std::collections::BTreeMap<String, String> {
    overrides
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| is_mount_property(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn config(global: &Global) -> Result<(Loader, Config), String> {
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

pub async fn run(cli: Cli) -> Result<(), Failure> {
    run_traced(cli, None).await
}

/// Runs a command; with `trace`, every request it sends joins that trace.
pub async fn run_traced(
    cli: Cli,
    trace: Option<curvine_messages::trace::TraceCtx>,
) -> Result<(), Failure> {
    let setup = |e: String| Failure {
        what: "config".into(),
        error: e,
        code: 2,
    };
    let (loader, config) = config(&cli.global).map_err(setup)?;
    let json_out = cli.global.json;
    let command = match cli.command {
        Command::Conf(ConfCommand::Show) => {
            conf::show(&loader, json_out);
            return Ok(());
        }
        other => other,
    };
    let client = Client::connect(&curvine_client::client::client_conf(&config))
        .await
        .map_err(|e| Failure {
            what: format!("connect {}", config.client.cluster.join(",")),
            error: e.to_string(),
            code: 1,
        })?;
    let client = match trace {
        Some(t) => client.traced(t),
        None => client,
    };
    let cx = Ctx {
        client: &client,
        json_out,
    };
    match command {
        Command::Conf(_) | Command::Fuse(_) => unreachable!("handled above"),
        Command::Mount(args) => {
            let props = mount_properties(&cli.global.overrides);
            mount::mount(&cx, args, props).await
        }
        Command::Load {
            path,
            wait,
            no_overwrite,
        } => mount::load(&cx, path, wait, no_overwrite).await,
        Command::LoadStatus { id, watch } => mount::load_status(&cx, id, watch).await,
        Command::CancelLoad { id } => mount::cancel_load(&cx, &id).await,
        Command::Umount { path } => mount::umount(&cx, &path).await,
        Command::Actors { node } => report::actors(&cx, node).await,
        Command::Report => report::report(&cx).await,
        Command::Admin(command) => admin::run(&cx, command).await,
        Command::Fs(command) => fs::run(&cx, command).await,
        Command::Trace(args) => trace::run(&cx, cli.global, args).await,
    }
}

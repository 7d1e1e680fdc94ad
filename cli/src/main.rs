//! `curvine-cli`: the command line of a curvine cluster.
//!
//! This file parses the command line and runs it: the configuration, the
//! connection to the cluster, and the dispatch to the command groups (a
//! module each). The dispatch is here, at the crate root, because `trace`
//! runs a command through it ([`run_traced`]).

/// `println!` for what a command prints: a name's bytes that are not
/// UTF-8 show as `\xNN` (see `curvine_messages::names`).
macro_rules! out {
    () => {
        println!()
    };
    ($($arg:tt)*) => {
        println!("{}", curvine_messages::names::shown(&format!($($arg)*)))
    };
}

/// [`out!`] without the line's end.
macro_rules! outp {
    ($($arg:tt)*) => {
        print!("{}", curvine_messages::names::shown(&format!($($arg)*)))
    };
}

/// [`out!`] to standard error.
macro_rules! eout {
    ($($arg:tt)*) => {
        eprintln!("{}", curvine_messages::names::shown(&format!($($arg)*)))
    };
}

mod admin;
mod args;
mod conf;
mod ctx;
mod data;
mod fs;
mod mount;
mod output;
mod report;
mod trace;

use clap::{Args, Parser};

use curvine_client::Client;
use curvine_messages::FsError;

use crate::args::{Command, ConfCommand};
use crate::ctx::{config, mount_properties, Ctx};

#[derive(Parser)]
#[command(
    name = "curvine-cli",
    version,
    about = "Command line of a curvine cache cluster"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Global {
    /// Config file (TOML); also CURVINE_CONF.
    #[arg(long, global = true)]
    conf: Option<String>,
    /// Node to talk to, host:port of its client port (client.cluster).
    #[arg(long, global = true)]
    cluster: Option<String>,
    /// Set any config key: -c section.key=value (repeatable).
    #[arg(short = 'c', long = "config", value_name = "KEY=VALUE", global = true)]
    overrides: Vec<String>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
}

/// A failed command: what was being done and why.
pub(crate) struct Failure {
    what: String,
    error: String,
    code: i32,
}

pub(crate) fn fail(op: &str, path: &str, e: FsError) -> Failure {
    Failure {
        what: format!("{op} {path}").trim_end().to_string(),
        error: e.to_string(),
        code: 1,
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    run_traced(cli, None).await
}

/// Runs a command; with `trace`, every request it sends joins that trace.
async fn run_traced(
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

fn main() {
    // `curvine-cli ... | head` ends quietly, as other tools do.
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Arguments are bytes: a path's bytes that are not UTF-8 are kept
    // (curvine_messages::names), not refused.
    let cli = Cli::parse_from(std::env::args_os().map(|a| {
        curvine_messages::names::from_bytes(std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str()))
            .into_owned()
    }));
    if let Command::Fuse(command) = cli.command {
        // The mount runs its own runtime (and may daemonize first).
        let g = &cli.global;
        let code = curvine_fuse::run(
            curvine_fuse::ConfArgs {
                conf: g.conf.as_deref(),
                cluster: g.cluster.as_deref(),
                overrides: &g.overrides,
            },
            command,
        );
        std::process::exit(code);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eout!("curvine-cli: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(f) = runtime.block_on(run(cli)) {
        if f.code == 0 {
            return;
        }
        eout!("curvine-cli: {}: {}", f.what, f.error);
        std::process::exit(f.code);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}

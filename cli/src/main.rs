//! `curvine-cli`: the command line of a curvine cluster.

mod admin;
mod args;
mod conf;
mod data;
mod fs;
mod mount;
mod output;
mod report;
mod run;
mod trace;

use clap::{Args, Parser};

use curvine_messages::FsError;

use crate::args::Command;

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

fn main() {
    // `curvine-cli ... | head` ends quietly, as other tools do.
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
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
            eprintln!("curvine-cli: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(f) = runtime.block_on(run::run(cli)) {
        if f.code == 0 {
            return;
        }
        eprintln!("curvine-cli: {}: {}", f.what, f.error);
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

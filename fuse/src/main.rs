//! `curvine-fuse`: the FUSE mount of a curvine cluster (the same command
//! as `curvine-cli fuse`).

use clap::Parser;

use curvine_fuse::{ConfArgs, FuseCommand};

#[derive(Parser)]
#[command(
    name = "curvine-fuse",
    version,
    about = "Mount a curvine cluster as a POSIX file system"
)]
struct Cli {
    /// Config file (TOML); also CURVINE_CONF.
    #[arg(long, global = true)]
    conf: Option<String>,
    /// Node to talk to, host:port of its client port (client.cluster).
    #[arg(long, global = true)]
    cluster: Option<String>,
    /// Set any config key: -c section.key=value (repeatable).
    #[arg(short = 'c', long = "config", value_name = "KEY=VALUE", global = true)]
    overrides: Vec<String>,
    #[command(subcommand)]
    command: FuseCommand,
}

fn main() {
    let cli = Cli::parse();
    let code = curvine_fuse::run(
        ConfArgs {
            conf: cli.conf.as_deref(),
            cluster: cli.cluster.as_deref(),
            overrides: &cli.overrides,
        },
        cli.command,
    );
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}

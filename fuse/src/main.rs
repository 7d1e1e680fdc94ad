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
    let args: Vec<String> = std::env::args().collect();
    let called = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if called == HELPER_NAME {
        std::process::exit(mount_helper(&args[1..]));
    }
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

/// The name mount(8) runs for `-t fuse.curvine` (a link to this binary).
const HELPER_NAME: &str = "mount.fuse.curvine";

/// mount(8)'s helper: `mount.fuse.curvine curvine:PATH MOUNTPOINT [-o
/// OPTIONS]`, run for an fstab entry of type `fuse.curvine` and for
/// `mount -o remount,ro|rw` of a mount. A remount changes whether the
/// mount is read-only; a new mount starts a background mount of PATH
/// (`--fs-path`). Options: `cluster=HOST:PORT`, `conf=FILE`,
/// `allow_other`, `acl`, `ro`, any `SECTION.KEY=VALUE` (`-c`); mount(8)'s
/// generic ones (`rw`, `defaults`, `noauto`, `_netdev`, `nofail`, ...)
/// are ignored. Exits 0, or 32 (mount(8)'s "mount failure").
fn mount_helper(args: &[String]) -> i32 {
    let fail = |msg: String| {
        eprintln!("{HELPER_NAME}: {msg}");
        32
    };
    let (mut positional, mut options) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => match it.next() {
                Some(o) => options.extend(o.split(',').map(str::to_string)),
                None => return fail("-o needs options".into()),
            },
            // mount(8)'s own: no mtab, sloppy, fake, verbose.
            "-n" | "-s" | "-f" | "-v" => {}
            other => positional.push(other.to_string()),
        }
    }
    let [source, mountpoint] = positional.as_slice() else {
        return fail(format!(
            "usage: {HELPER_NAME} curvine:PATH MOUNTPOINT [-o OPTIONS]"
        ));
    };
    // mount(8) may pass the mount's current options before the asked
    // ones (`rw,...,remount,ro`): the last of `ro` and `rw` counts.
    let read_only = options
        .iter()
        .rev()
        .find(|o| *o == "ro" || *o == "rw")
        .is_some_and(|o| o == "ro");
    if options.iter().any(|o| o == "remount") {
        return match curvine_fuse::remount(std::path::Path::new(mountpoint), read_only) {
            Ok(()) => 0,
            Err(e) => fail(format!("remount {mountpoint}: {e}")),
        };
    }
    let Some(fs_path) = source.strip_prefix(curvine_fuse::SOURCE_PREFIX) else {
        return fail(format!(
            "source {source:?}: expected {}PATH, e.g. curvine:/",
            curvine_fuse::SOURCE_PREFIX
        ));
    };
    let fs_path = if fs_path.is_empty() { "/" } else { fs_path };
    let mut cli: Vec<String> = vec![
        "curvine-fuse".into(),
        "mount".into(),
        mountpoint.clone(),
        "--daemon".into(),
        "--fs-path".into(),
        fs_path.into(),
    ];
    for o in &options {
        match o.split_once('=') {
            Some(("cluster", v)) => cli.extend(["--cluster".into(), v.into()]),
            Some(("conf", v)) => cli.extend(["--conf".into(), v.into()]),
            Some((k, v)) if k.contains('.') => cli.extend(["-c".into(), format!("{k}={v}")]),
            Some(_) => return fail(format!("unknown option {o:?}")),
            None => match o.as_str() {
                "allow_other" => cli.push("--allow-other".into()),
                "acl" => cli.push("--acl".into()),
                "ro"
                | "rw"
                | "defaults"
                | "auto"
                | "noauto"
                | "user"
                | "nouser"
                | "users"
                | "_netdev"
                | "nofail"
                | "exec"
                | "noexec"
                | "suid"
                | "nosuid"
                | "dev"
                | "nodev"
                | "async"
                | "atime"
                | "noatime"
                | "relatime"
                | "default_permissions" => {}
                other => return fail(format!("unknown option {other:?}")),
            },
        }
    }
    if let Err(e) = Cli::try_parse_from(&cli) {
        return fail(e.to_string());
    }
    // This program under its own name, which a background mount runs again.
    let code = match std::env::current_exe()
        .and_then(|exe| std::process::Command::new(exe).args(&cli[1..]).status())
    {
        Ok(status) => status.code().unwrap_or(32),
        Err(e) => return fail(format!("cannot run curvine-fuse: {e}")),
    };
    if code != 0 || !read_only {
        return code;
    }
    match curvine_fuse::remount(std::path::Path::new(mountpoint), true) {
        Ok(()) => 0,
        Err(e) => fail(format!("mounted {mountpoint}, but not read-only: {e}")),
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

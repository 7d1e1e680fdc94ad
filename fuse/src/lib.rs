//! The FUSE mount of a curvine cluster: `curvine-fuse mount MNT` (also
//! `curvine-cli fuse mount MNT`) shows the namespace (or one directory of
//! it) as a POSIX file system that ordinary tools use unchanged.

pub mod fs;
pub mod inodes;
pub mod metrics;
pub mod mountpoint;
pub mod session;
pub mod traces;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};

use curvine_conf::{Config, Loader};
use curvine_messages::FileKind;

use crate::session::MountSpec;

#[derive(Subcommand, Debug, Clone)]
pub enum FuseCommand {
    /// Mount the cluster's namespace (or a directory of it, --fs-path) on a
    /// local directory. Runs in the foreground until unmounted (SIGTERM or
    /// Ctrl-C unmount it) unless --daemon is given.
    Mount(Box<MountArgs>),
    /// Unmount a mount point; the mount's process then exits. A mount whose
    /// process died is cleared (its FUSE connection aborted and detached).
    Umount {
        mountpoint: PathBuf,
        /// Detach the mount now even while files in it are open.
        #[arg(short, long)]
        lazy: bool,
    },
}

pub use mountpoint::SOURCE_PREFIX;

/// Makes the mount at `mountpoint` read-only, or writable again
/// (mount(2) with MS_REMOUNT; the kernel then answers EROFS to every
/// change). Root only.
pub fn remount(mountpoint: &std::path::Path, read_only: bool) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let target = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // A remount sets every per-mount flag anew: keep the ones the mount
    // has (nosuid and nodev above all), changing only read-only.
    let mut flags = libc::MS_REMOUNT | kept_flags(&target)?;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    // The kernel refuses (EBUSY) while a file is open for writing or an
    // unlinked inode is still held; the last of those is often a moment
    // from going: try again for a few seconds.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // SAFETY: a valid C string; null source, type and data, as a
        // remount takes.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= deadline {
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The mount(2) flags of the mount at `mountpoint`, read-only aside.
fn kept_flags(target: &std::ffi::CStr) -> std::io::Result<libc::c_ulong> {
    // SAFETY: statvfs is plain old data, valid when zeroed.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a struct statvfs to fill.
    if unsafe { libc::statvfs(target.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let pairs = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(pairs
        .iter()
        .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
        .fold(0, |acc, (_, ms_flag)| acc | ms_flag))
}

/// Flags of `fuse mount`; each one sets the `fuse.*` key of the same name.
#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// Local directory to mount on (must exist; a dead mount there is cleared).
    pub mountpoint: PathBuf,
    /// Directory of the namespace the mount shows (fuse.fs_path).
    #[arg(long, value_name = "PATH")]
    pub fs_path: Option<String>,
    /// Run in the background; return once the mount is ready.
    #[arg(long)]
    pub daemon: bool,
    /// Log file of a --daemon mount (default: /tmp/curvine-fuse-<mount point>.log).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Threads reading kernel requests, each with its own /dev/fuse fd (fuse.threads).
    #[arg(long)]
    pub threads: Option<u32>,
    /// Largest write request from the kernel (fuse.max_write, e.g. 1MiB).
    #[arg(long, value_name = "SIZE")]
    pub max_write: Option<String>,
    /// Readahead asked of the kernel (fuse.max_readahead, e.g. 16MiB).
    #[arg(long, value_name = "SIZE")]
    pub max_readahead: Option<String>,
    /// How long the kernel trusts names (fuse.entry_timeout, e.g. 1s).
    #[arg(long, value_name = "DURATION")]
    pub entry_timeout: Option<String>,
    /// How long the kernel trusts attributes (fuse.attr_timeout).
    #[arg(long, value_name = "DURATION")]
    pub attr_timeout: Option<String>,
    /// How long the kernel remembers absent names (fuse.negative_timeout).
    #[arg(long, value_name = "DURATION")]
    pub negative_timeout: Option<String>,
    /// How long the mount trusts metadata it fetched (fuse.meta_cache_ttl).
    #[arg(long, value_name = "DURATION")]
    pub meta_cache_ttl: Option<String>,
    /// Drop the kernel's page cache of a file at each open (fuse.keep_cache = false).
    #[arg(long)]
    pub no_keep_cache: bool,
    /// Let the kernel batch writes in its page cache (fuse.writeback_cache).
    #[arg(long)]
    pub writeback_cache: bool,
    /// Bypass the kernel's page cache (fuse.direct_io).
    #[arg(long)]
    pub direct_io: bool,
    /// Write-only handles write through the kernel's page cache
    /// (fuse.direct_writes = false).
    #[arg(long)]
    pub no_direct_writes: bool,
    /// Serve reads of one-block files cached on this host from the block
    /// file in the kernel (fuse.passthrough, the default where the kernel
    /// allows it: Linux 6.9+, CAP_SYS_ADMIN).
    #[arg(long, conflicts_with = "no_passthrough")]
    pub passthrough: bool,
    /// Read every file through the mount (fuse.passthrough = false).
    #[arg(long)]
    pub no_passthrough: bool,
    /// Never ask for directory delegations: every create goes to the
    /// cluster as it happens (fuse.delegations = false).
    #[arg(long)]
    pub no_delegations: bool,
    /// Let other users use the mount (fuse.allow_other).
    #[arg(long)]
    pub allow_other: bool,
    /// Do not let the kernel check permissions from modes (fuse.default_permissions = false).
    #[arg(long, conflicts_with = "check_permission")]
    pub no_default_permissions: bool,
    /// Let other users use the mount, each held to the modes, owners and
    /// groups of files (fuse.allow_other and fuse.default_permissions).
    #[arg(long)]
    pub check_permission: bool,
    /// POSIX ACLs, enforced by the kernel (fuse.acl).
    #[arg(long)]
    pub acl: bool,
    /// Directory for data of random writes until flushed (fuse.stage_dir).
    #[arg(long, value_name = "DIR")]
    pub stage_dir: Option<String>,
    /// Readdirplus off: directory reads return names only (fuse.readdirplus = false).
    #[arg(long)]
    pub no_readdirplus: bool,
    /// Block size of files created through the mount (fuse.block_size, e.g. 256MiB).
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<String>,
    /// Address of the mount's Prometheus /metrics, or `off` (fuse.metrics_listen).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
}

/// Config sources given on a command line.
pub struct ConfArgs<'a> {
    pub conf: Option<&'a str>,
    pub cluster: Option<&'a str>,
    pub overrides: &'a [String],
}

fn load(conf: &ConfArgs<'_>, args: &MountArgs) -> Result<Config, String> {
    let mut loader = Loader::standard(conf.conf, conf.overrides).map_err(|e| e.to_string())?;
    let mut flag = |key: &str, value: &str, name: &str| {
        loader
            .flag(key, value, name)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    if let Some(c) = conf.cluster {
        flag("client.cluster", c, "--cluster")?;
    }
    // Each of these flags sets the `fuse.*` key of its name
    // (`--max-write`: fuse.max_write).
    let values = [
        ("fs_path", args.fs_path.clone()),
        ("threads", args.threads.map(|t| t.to_string())),
        ("max_write", args.max_write.clone()),
        ("max_readahead", args.max_readahead.clone()),
        ("entry_timeout", args.entry_timeout.clone()),
        ("attr_timeout", args.attr_timeout.clone()),
        ("negative_timeout", args.negative_timeout.clone()),
        ("meta_cache_ttl", args.meta_cache_ttl.clone()),
        ("stage_dir", args.stage_dir.clone()),
        ("block_size", args.block_size.clone()),
        ("metrics_listen", args.metrics_listen.clone()),
    ];
    for (name, value) in values {
        if let Some(v) = value {
            let key = format!("fuse.{name}");
            flag(&key, &v, &format!("--{}", name.replace('_', "-")))?;
        }
    }
    let switches = [
        (
            "fuse.keep_cache",
            args.no_keep_cache,
            "false",
            "--no-keep-cache",
        ),
        (
            "fuse.writeback_cache",
            args.writeback_cache,
            "true",
            "--writeback-cache",
        ),
        ("fuse.direct_io", args.direct_io, "true", "--direct-io"),
        (
            "fuse.direct_writes",
            args.no_direct_writes,
            "false",
            "--no-direct-writes",
        ),
        ("fuse.acl", args.acl, "true", "--acl"),
        (
            "fuse.passthrough",
            args.passthrough,
            "true",
            "--passthrough",
        ),
        (
            "fuse.passthrough",
            args.no_passthrough,
            "false",
            "--no-passthrough",
        ),
        (
            "fuse.delegations",
            args.no_delegations,
            "false",
            "--no-delegations",
        ),
        (
            "fuse.allow_other",
            args.allow_other,
            "true",
            "--allow-other",
        ),
        (
            "fuse.default_permissions",
            args.no_default_permissions,
            "false",
            "--no-default-permissions",
        ),
        (
            "fuse.allow_other",
            args.check_permission,
            "true",
            "--check-permission",
        ),
        (
            "fuse.default_permissions",
            args.check_permission,
            "true",
            "--check-permission",
        ),
        (
            "fuse.readdirplus",
            args.no_readdirplus,
            "false",
            "--no-readdirplus",
        ),
    ];
    for (key, on, value, name) in switches {
        if on {
            flag(key, value, name)?;
        }
    }
    loader.build().map_err(|e| e.to_string())
}

/// Runs a `fuse` command; returns the process exit code.
pub fn run(conf: ConfArgs<'_>, command: FuseCommand) -> i32 {
    let result = match command {
        FuseCommand::Mount(args) => mount(&conf, &args),
        FuseCommand::Umount { mountpoint, lazy } => umount(&mountpoint, lazy),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("curvine-fuse: {e}");
            1
        }
    }
}

/// Unmounts a curvine mount (or clears a dead one).
pub fn umount(mnt: &Path, lazy: bool) -> Result<(), String> {
    let Some(entry) = mountpoint::entry(mnt) else {
        return Err(format!("{}: nothing is mounted there", mnt.display()));
    };
    if !entry.is_curvine() {
        return Err(format!(
            "{}: the mount there is {} ({}), not a curvine mount",
            mnt.display(),
            entry.source,
            entry.fstype
        ));
    }
    if mountpoint::is_dead(mnt) {
        let done = mountpoint::clear(mnt)?;
        println!("{}: the mount's process was gone; {done}", mnt.display());
        return Ok(());
    }
    mountpoint::unmount(mnt, lazy)?;
    println!("unmounted {}", mnt.display());
    Ok(())
}

fn check_mountpoint(mnt: &Path) -> Result<(), String> {
    if mountpoint::is_dead(mnt) {
        if !mountpoint::is_mounted(mnt) {
            return Err(format!(
                "{}: a dead FUSE mount of another file system is there",
                mnt.display()
            ));
        }
        let done = mountpoint::clear(mnt)?;
        eprintln!(
            "curvine-fuse: {} held a mount whose process was gone; {done}",
            mnt.display()
        );
    } else if mountpoint::is_mounted(mnt) {
        return Err(format!(
            "{}: a curvine mount is already there (curvine-cli fuse umount {} first)",
            mnt.display(),
            mnt.display()
        ));
    }
    match std::fs::metadata(mnt) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{}: not a directory", mnt.display())),
        Err(e) => Err(format!("{}: {e}", mnt.display())),
    }
}

fn mount(conf: &ConfArgs<'_>, args: &MountArgs) -> Result<(), String> {
    let config = load(conf, args)?;
    let mnt = mountpoint::absolute(&args.mountpoint);
    check_mountpoint(&mnt)?;
    if args.daemon {
        return daemonize(&mnt, args);
    }
    init_logging(&config);
    // A file passed through to its block file holds a descriptor while open.
    curvine_runtime::limits::raise_open_files();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(serve(config, mnt))
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log.level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Starts the mount in a process of its own and waits until it is ready.
fn daemonize(mnt: &Path, args: &MountArgs) -> Result<(), String> {
    let log = args.log_file.clone().unwrap_or_else(|| {
        let name: String = mnt
            .to_string_lossy()
            .trim_matches('/')
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        PathBuf::from(format!("/tmp/curvine-fuse-{name}.log"))
    });
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("cannot open the log file {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("log file {}: {e}", log.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let argv: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--daemon")
        .collect();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&argv)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid is async-signal-safe; it detaches the child from the
    // terminal's session so a hangup does not end the mount.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the mount process: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if mountpoint::is_mounted(mnt) && !mountpoint::is_dead(mnt) {
            println!(
                "mounted on {} (pid {}, log {})",
                mnt.display(),
                child.id(),
                log.display()
            );
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(format!(
                "the mount process exited ({status}) before the mount was ready:\n{}",
                tail.join("\n")
            ));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!(
                "{} was not mounted within 60s; see {}",
                mnt.display(),
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn serve(config: Config, mnt: PathBuf) -> Result<(), String> {
    let client = curvine_client::Client::connect(&curvine_client::client::client_conf(&config))
        .await
        .map_err(|e| format!("cannot reach the cluster: {e}"))?;
    let fs_path = curvine_messages::path::normalize(&config.fuse.fs_path, "/")
        .map_err(|e| format!("fuse.fs_path {:?}: {e}", config.fuse.fs_path))?;
    let root = client
        .stat(&fs_path)
        .await
        .map_err(|e| format!("fuse.fs_path {fs_path}: {e}"))?;
    if root.kind != FileKind::Dir {
        return Err(format!("fuse.fs_path {fs_path}: not a directory"));
    }
    let mut fuse_conf = config.fuse.clone();
    fuse_conf.fs_path = fs_path.clone();
    let rt = tokio::runtime::Handle::current();
    let traces = traces::FuseTraces::new(config.trace.sample_rate);
    tokio::spawn(
        traces
            .clone()
            .ship(client.clone(), std::time::Duration::from_millis(500)),
    );
    let make_fs: session::FsFactory = {
        let (client, conf, root) = (client.clone(), fuse_conf.clone(), root.clone());
        Arc::new(move || {
            Arc::new(fs::Fs::new(
                client.clone(),
                conf.clone(),
                root.clone(),
                rt.clone(),
                traces.clone(),
            ))
        })
    };
    let mut options = fuser::Config::default();
    options.mount_options = vec![
        fuser::MountOption::FSName(format!("{}{fs_path}", mountpoint::SOURCE_PREFIX)),
        // The kernel shows the mount as `fuse.curvine`, so mount(8) runs
        // the `mount.fuse.curvine` helper for a remount.
        fuser::MountOption::CUSTOM("subtype=curvine".into()),
    ];
    if fuse_conf.default_permissions {
        options
            .mount_options
            .push(fuser::MountOption::DefaultPermissions);
    }
    if fuse_conf.allow_other {
        options.acl = fuser::SessionACL::All;
    }
    options.n_threads = Some(fuse_conf.threads as usize);
    options.clone_fd = true;
    let spec = MountSpec {
        mountpoint: mnt.clone(),
        options,
        make_fs,
        read_ahead: fuse_conf.max_readahead.0,
    };
    // Prometheus metrics of this mount process; a port already taken
    // (another mount on the host) only costs the metrics.
    let _metrics = match fuse_conf.metrics_listen.as_str() {
        "off" => None,
        listen => match metrics::serve_metrics(
            listen,
            &config.http.token,
            Arc::new(|| {
                curvine_runtime::stats::Metrics::new().render(&[])
                    + &curvine_runtime::stats::process().render_plain()
            }),
        ) {
            Ok(h) => {
                eprintln!("curvine-fuse: metrics on http://{}/metrics", h.addr);
                Some(h)
            }
            Err(e) => {
                eprintln!(
                    "curvine-fuse: no metrics: cannot listen on {listen} (fuse.metrics_listen): {e}"
                );
                None
            }
        },
    };
    let policy = curvine_runtime::supervisor::RestartPolicy::from(&config.supervisor);
    let (sup, handle) = ractor::Actor::spawn(
        None,
        curvine_runtime::supervisor::Supervisor,
        session::supervisor(spec, policy),
    )
    .await
    .map_err(|e| e.to_string())?;
    println!(
        "mounted {fs_path} of {} on {} (pid {})",
        client.node_addr(),
        mnt.display(),
        std::process::id()
    );
    let _ = std::io::stdout().flush();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| e.to_string())?;
    let mut handle = handle;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
        _ = &mut handle => {
            return match session::fatal() {
                Some(e) => Err(e),
                None => Ok(()),
            };
        }
    }
    tracing::info!("unmounting on a signal");
    sup.stop(Some("signal".into()));
    let _ = handle.await;
    if mountpoint::is_mounted(&mnt) {
        // Files were still open: the mount is detached instead.
        let _ = mountpoint::unmount(&mnt, true);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: MountArgs,
    }

    fn load_flags(flags: &[&str]) -> Result<Config, String> {
        let cmd = Cmd::try_parse_from(["mount", "/mnt"].iter().chain(flags))
            .map_err(|e| e.to_string())?;
        let conf = ConfArgs {
            conf: None,
            cluster: None,
            overrides: &[],
        };
        load(&conf, &cmd.args)
    }

    #[test]
    fn each_value_flag_sets_the_fuse_key_of_its_name() {
        let config = load_flags(&[
            "--fs-path=/data",
            "--threads=3",
            "--max-write=2MiB",
            "--max-readahead=8MiB",
            "--entry-timeout=7s",
            "--attr-timeout=8s",
            "--negative-timeout=9s",
            "--meta-cache-ttl=11s",
            "--stage-dir=/stage",
            "--block-size=64MiB",
            "--metrics-listen=off",
        ])
        .unwrap();
        let f = &config.fuse;
        assert_eq!(f.fs_path, "/data");
        assert_eq!(f.threads, 3);
        assert_eq!(f.max_write.0, 2 << 20);
        assert_eq!(f.max_readahead.0, 8 << 20);
        assert_eq!(f.entry_timeout.0, Duration::from_secs(7));
        assert_eq!(f.attr_timeout.0, Duration::from_secs(8));
        assert_eq!(f.negative_timeout.0, Duration::from_secs(9));
        assert_eq!(f.meta_cache_ttl.0, Duration::from_secs(11));
        assert_eq!(f.stage_dir, "/stage");
        assert_eq!(f.block_size.0, 64 << 20);
        assert_eq!(f.metrics_listen, "off");
    }

    #[test]
    fn a_bad_value_names_its_flag() {
        let e = load_flags(&["--entry-timeout=soon"]).unwrap_err();
        assert!(e.contains("flag --entry-timeout"), "{e}");
        assert!(e.contains("fuse.entry_timeout"), "{e}");
    }
}

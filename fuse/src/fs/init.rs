//! What the mount asks of the kernel when the session starts: request
//! sizes, readahead, capabilities, passthrough.

use std::sync::atomic::Ordering;

use fuser::{InitFlags, KernelConfig};

use super::Fs;

/// Agrees the session's settings with the kernel.
pub(super) fn init(fs: &Fs, config: &mut KernelConfig) -> std::io::Result<()> {
    let conf = &fs.conf;
    let want = conf.max_write.0 as u32;
    if let Err(max) = config.set_max_write(want) {
        let _ = config.set_max_write(max);
    }
    let ra = conf.max_readahead.0.min(u32::MAX as u64) as u32;
    if let Err(max) = config.set_max_readahead(ra) {
        let _ = config.set_max_readahead(max);
    }
    let _ = config.set_max_background(64);
    let _ = config.set_congestion_threshold(48);
    let mut wanted = InitFlags::FUSE_ATOMIC_O_TRUNC
        | InitFlags::FUSE_AUTO_INVAL_DATA
        | InitFlags::FUSE_CACHE_SYMLINKS
        | InitFlags::FUSE_BIG_WRITES
        // Set-user-ID and set-group-ID are taken away by the mount on
        // write, truncation and chown (`perms::killed_suid_sgid`), so the
        // kernel need not ask for security.capability before every write.
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
    if conf.async_read {
        wanted |= InitFlags::FUSE_ASYNC_READ;
    }
    if conf.readdirplus {
        wanted |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
    }
    if conf.parallel_dirops {
        wanted |= InitFlags::FUSE_PARALLEL_DIROPS;
    }
    if conf.writeback_cache {
        wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
    }
    for flag in wanted.iter() {
        if let Err(e) = config.add_capabilities(flag) {
            tracing::info!(?e, "the kernel does not offer a FUSE capability");
        }
    }
    if conf.acl {
        // The kernel enforces ACLs; umasks become the mount's to apply
        // (not where a default ACL is inherited).
        let ok = config.add_capabilities(InitFlags::FUSE_POSIX_ACL).is_ok()
            && config.add_capabilities(InitFlags::FUSE_DONT_MASK).is_ok();
        if ok {
            fs.acl.store(true, Ordering::SeqCst);
        } else {
            tracing::warn!("fuse.acl is on but the kernel does not offer POSIX ACLs; system.* attributes answer ENOTSUP");
        }
    }
    direct_writes(fs, config);
    if conf.passthrough {
        match passthrough_refused(conf) {
            Some(why) => tracing::info!("passthrough off: {why}; files are read through the mount"),
            None => {
                let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                    && config.set_max_stack_depth(1).is_ok();
                if ok {
                    fs.passthrough.store(true, Ordering::SeqCst);
                    tracing::info!("passthrough on: reads of files that are one block on this host go straight to the block file");
                } else {
                    tracing::info!("passthrough off: the kernel does not offer it (Linux 6.9 or later, built with CONFIG_FUSE_PASSTHROUGH); files are read through the mount");
                }
            }
        }
    }
    Ok(())
}

/// The FUSE protocol minor version of Linux 6.6, the first kernel that
/// drops cached pages of the range a direct write covers (and writes back
/// dirty ones first), so a write-only handle without the page cache stays
/// coherent with other handles' cached pages and mappings.
const DIRECT_WRITE_COHERENT_MINOR: u32 = 39;

/// Whether handles opened write-only bypass the page cache
/// (`fuse.direct_writes`): one copy of every write fewer (the kernel hands
/// the writer's own pages to the mount instead of copying them into pages
/// of the mount's file first, which also spares allocating and charging
/// those pages).
fn direct_writes(fs: &Fs, config: &KernelConfig) {
    let conf = &fs.conf;
    if !conf.direct_writes || conf.direct_io {
        return;
    }
    if conf.writeback_cache {
        tracing::info!(
            "direct writes off: fuse.writeback_cache is on (writes gather in the page cache)"
        );
        return;
    }
    let abi = config.kernel_abi();
    if (abi.0, abi.1) < (7, DIRECT_WRITE_COHERENT_MINOR) {
        tracing::info!(
            "direct writes off: the kernel speaks FUSE {}.{}, older than 7.{DIRECT_WRITE_COHERENT_MINOR} (Linux 6.6), whose direct writes would leave other handles' cached pages stale",
            abi.0,
            abi.1
        );
        return;
    }
    fs.direct_writes.store(true, Ordering::SeqCst);
}

/// Why this mount cannot use passthrough whatever the kernel offers.
fn passthrough_refused(conf: &curvine_conf::FuseConf) -> Option<String> {
    if conf.direct_io {
        return Some("fuse.direct_io is on".into());
    }
    if conf.writeback_cache {
        return Some("fuse.writeback_cache is on (the kernel takes one or the other)".into());
    }
    if !has_cap_sys_admin() {
        return Some(format!(
            "registering backing files needs CAP_SYS_ADMIN, which this process (uid {}) lacks",
            // SAFETY: geteuid cannot fail.
            unsafe { libc::geteuid() }
        ));
    }
    None
}

/// Whether CAP_SYS_ADMIN is in this process's effective set.
fn has_cap_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

//! Process limits every long-running process raises at start.

/// Raises the process's soft limit of open files (`RLIMIT_NOFILE`) to its
/// hard limit: a node holds a descriptor per connection, block file and
/// LMDB environment; a mount one per file it passes through to a block
/// file. Returns the limits (soft before, soft now, hard).
pub fn raise_open_files() -> Option<(u64, u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    let before = r.rlim_cur;
    // An unlimited hard limit still stops at the kernel's nr_open.
    let target = if r.rlim_max == libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        r.rlim_max
    };
    if r.rlim_cur < target {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: r.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::info!(
                from = before,
                to = target,
                "raised the open files limit (RLIMIT_NOFILE)"
            );
            r = raised;
        }
    }
    Some((before, r.rlim_cur, r.rlim_max))
}

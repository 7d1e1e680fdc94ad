//! Which host a process runs on, so a client and a node can tell that they
//! share one (short-circuit access to block files).

/// The host's identity for short-circuit decisions: host name and boot id.
pub fn host_key() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer.
    let host = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        String::new()
    };
    format!("{host}/{boot}")
}

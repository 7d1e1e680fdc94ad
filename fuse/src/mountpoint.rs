//! The mount point as the kernel sees it: the mount table, dead mounts
//! (their process gone), aborting a FUSE connection, unmounting, and the
//! mount's readahead.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Source of this mount in the kernel's table: `curvine:<fs_path>`.
pub const SOURCE_PREFIX: &str = "curvine:";

/// A mount in /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub fstype: String,
    /// What was mounted (`curvine:/` for a mount of this system).
    pub source: String,
    /// The "major:minor" of the mount's device (its FUSE connection is the minor).
    pub device: String,
}

impl MountEntry {
    /// Whether this is a mount of this system.
    pub fn is_curvine(&self) -> bool {
        self.fstype.starts_with("fuse") && self.source.starts_with(SOURCE_PREFIX)
    }

    fn minor(&self) -> Option<&str> {
        self.device.split_once(':').map(|(_, m)| m)
    }
}

/// Undoes the octal escapes of /proc/self/mountinfo (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The path as the mount table spells it (absolute, without resolving a
/// dead mount, which cannot be stat'ed).
pub fn absolute(path: &Path) -> PathBuf {
    match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(_) => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
    }
}

/// The topmost mount at `path`, if any.
pub fn entry(path: &Path) -> Option<MountEntry> {
    let want = absolute(path);
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || sep + 2 >= fields.len() {
            continue;
        }
        let mountpoint = PathBuf::from(unescape(fields[4]));
        if mountpoint == want {
            found = Some(MountEntry {
                mountpoint,
                fstype: fields[sep + 1].to_string(),
                source: unescape(fields[sep + 2]),
                device: fields[2].to_string(),
            });
        }
    }
    found
}

/// Whether a curvine mount is at `path`.
pub fn is_mounted(path: &Path) -> bool {
    entry(path).is_some_and(|e| e.is_curvine())
}

/// Whether the mount at `path` is a FUSE mount whose process is gone
/// ("Transport endpoint is not connected").
pub fn is_dead(path: &Path) -> bool {
    // statfs always asks the file system (a stat may be answered from the
    // kernel's attribute cache even when the process is gone).
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a valid C string and a zeroed out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 {
        return false;
    }
    std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Aborts the FUSE connection of a mount: every request waiting on it fails
/// at once (needs root and the fusectl file system).
pub fn abort(entry: &MountEntry) -> bool {
    let Some(minor) = entry.minor() else {
        return false;
    };
    let dir = Path::new("/sys/fs/fuse/connections");
    if !dir.join(minor).exists() && is_root() {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"])
            .output();
    }
    std::fs::write(dir.join(minor).join("abort"), b"1").is_ok()
}

/// Unmounts `path`; `lazy` detaches it even while files are open.
pub fn unmount(path: &Path, lazy: bool) -> Result<(), String> {
    if is_root() {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{}: the path holds a NUL byte", path.display()))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: a valid C string; umount2 has no other preconditions.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EBUSY) => format!(
                "{}: the mount is busy (files or directories in it are open); close them, or unmount with --lazy",
                path.display()
            ),
            Some(libc::EINVAL) => format!("{}: not a mount point", path.display()),
            _ => format!("{}: cannot unmount: {e}", path.display()),
        });
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run fusermount3 (Debian package fuse3): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Clears a dead or failed mount at `path`: aborts its connection and
/// detaches it. Returns what was done, for the message to the user.
pub fn clear(path: &Path) -> Result<String, String> {
    let Some(e) = entry(path) else {
        return Ok(String::new());
    };
    let aborted = abort(&e);
    unmount(path, true)?;
    Ok(if aborted {
        format!(
            "aborted the FUSE connection of {} and detached the mount",
            path.display()
        )
    } else {
        format!("detached the mount at {}", path.display())
    })
}

/// Raises the kernel's readahead of the mount to `bytes` (root only;
/// the kernel keeps its own cap). Returns the value in effect.
pub fn set_read_ahead(path: &Path, bytes: u64) -> Option<u64> {
    let e = entry(path)?;
    let file = PathBuf::from(format!("/sys/class/bdi/{}/read_ahead_kb", e.device));
    if is_root() {
        let _ = std::fs::write(&file, format!("{}", bytes / 1024));
    }
    std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/x\\"), "/x\\");
    }

    #[test]
    fn the_root_is_a_mount() {
        let e = entry(Path::new("/")).expect("/ is mounted");
        assert!(e.device.contains(':'));
        assert!(!is_mounted(Path::new("/")));
    }
}

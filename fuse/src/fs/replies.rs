//! Answers in the kernel's terms: the errno of an error, attributes and
//! entries; names the kernel sends, checked.

use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, Generation, INodeNo, ReplyCreate, ReplyEntry};

use curvine_messages::path::check_name;
use curvine_messages::{names, Attr, FileKind, FsError, FsResult};

use super::Fs;

/// The errno of an error.
pub fn errno(e: &FsError) -> Errno {
    crate::traces::answered_error(e);
    curvine_runtime::stats::process().add(
        "curvine_fuse_errors_total",
        "Kernel requests the FUSE mount answered with an error, per error kind.",
        &[("error", e.kind_name())],
        1,
    );
    Errno::from_i32(kernel_errno(e))
}

/// The errno the kernel passes on for `e`: a cluster that cannot be
/// reached is EIO, never EAGAIN. To a program using non-blocking I/O,
/// EAGAIN means "try when poll says so", and FUSE files take part in
/// poll: Go's runtime (rclone's) answered EAGAIN for a write waits for a
/// readiness event that never comes, and hung for good after a node's
/// restart.
fn kernel_errno(e: &FsError) -> i32 {
    match e.errno() {
        libc::EAGAIN => libc::EIO,
        errno => errno,
    }
}

/// An I/O error of a local file, keeping ENOSPC and EDQUOT.
pub fn io_error(what: &str, e: std::io::Error) -> FsError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => FsError::NoSpace(format!("{what}: {e}")),
        _ => FsError::Io(format!("{what}: {e}")),
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// The namespace's form of a name the kernel sent (any bytes but `/` and
/// NUL; see `curvine_messages::names`), checked as the namespace checks
/// names, so a create the mount answers itself is one the shard takes.
pub(super) fn name_str(name: &OsStr) -> FsResult<Cow<'_, str>> {
    let s = names::from_bytes(name.as_bytes());
    check_name(&s)?;
    Ok(s)
}

/// The namespace's form of a symlink target the kernel sent.
pub(super) fn target_str(target: &OsStr) -> Cow<'_, str> {
    names::from_bytes(target.as_bytes())
}

/// A name (or symlink target) as the kernel gets it back: its bytes.
pub(super) fn os_name(s: &str) -> Cow<'_, OsStr> {
    match names::to_bytes(s) {
        Cow::Borrowed(b) => Cow::Borrowed(OsStr::from_bytes(b)),
        Cow::Owned(b) => Cow::Owned(std::ffi::OsString::from_vec(b)),
    }
}

/// An extended attribute's name: UTF-8 only (EILSEQ otherwise).
pub(super) fn xattr_name(name: &OsStr) -> FsResult<&str> {
    name.to_str().ok_or_else(|| {
        FsError::IllegalName(format!(
            "{}: extended attribute names must be UTF-8",
            names::shown(&names::from_bytes(name.as_bytes()))
        ))
    })
}

/// A reply that can answer an error (each of fuser's replies can; they
/// share no trait for it).
pub(super) trait ErrorReply: Send + 'static {
    fn error(self, err: Errno);
}

impl ErrorReply for ReplyEntry {
    fn error(self, err: Errno) {
        ReplyEntry::error(self, err)
    }
}

impl ErrorReply for ReplyCreate {
    fn error(self, err: Errno) {
        ReplyCreate::error(self, err)
    }
}

/// The type the kernel is told an inode of `kind` has.
pub(super) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice(_) => FileType::CharDevice,
        FileKind::BlockDevice(_) => FileType::BlockDevice,
    }
}

impl Fs {
    pub(super) fn file_attr(&self, ino: u64, attr: &Attr) -> FileAttr {
        let kind = file_type(attr.kind);
        let size = match attr.kind {
            FileKind::File => attr.size,
            FileKind::Dir => 4096,
            FileKind::Symlink => attr.symlink.as_ref().map(|s| s.len() as u64).unwrap_or(0),
            _ => 0,
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(attr.atime_ns),
            mtime: time(attr.mtime_ns),
            ctime: time(attr.ctime_ns),
            crtime: time(attr.ctime_ns),
            kind,
            perm: (attr.mode & 0o7777) as u16,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
            rdev: attr.kind.rdev(),
            blksize: self.conf.max_write.0 as u32,
            flags: 0,
        }
    }

    pub(super) fn reply_entry(&self, reply: ReplyEntry, parent: u64, name: &str, attr: Attr) {
        let ino = self.inodes.remember(parent, name, attr.clone());
        let fattr = self.file_attr(ino, &self.with_writes(ino, attr));
        reply.entry_with_ttls(&self.attr_ttl, &self.entry_ttl, &fattr, Generation(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_cluster_is_eio_not_eagain() {
        let e = FsError::Unavailable("node 1 is restarting".into());
        assert_eq!(e.errno(), libc::EAGAIN);
        assert_eq!(kernel_errno(&e), libc::EIO);
        assert_eq!(kernel_errno(&FsError::Busy("x".into())), libc::EBUSY);
    }
}

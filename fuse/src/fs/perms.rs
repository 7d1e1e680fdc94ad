//! Who made a request and what they may do: mode checks (access) and the
//! rules of chmod, chown and utimens that the kernel leaves to the mount.

use fuser::{AccessFlags, Errno, INodeNo, ReplyEmpty, Request};

use curvine_messages::{Attr, FileKind, FsError, FsResult, SetAttr, TimeSet};

use super::CurvineFs;
use super::Fs;

/// Supplementary groups of a process (for chown and utimens rules).
fn groups_of(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Who made a request.
#[derive(Clone, Copy)]
pub(super) struct Caller {
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) pid: u32,
}

impl Caller {
    /// The mount itself, acting for the kernel (no permission checks).
    pub(super) const MOUNT: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };

    pub(super) fn of(req: &Request) -> Caller {
        Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        }
    }

    fn root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || groups_of(self.pid).contains(&gid)
    }

    /// Whether the caller may access `attr` for `mask` (R_OK, W_OK, X_OK).
    fn may(&self, attr: &Attr, mask: i32) -> bool {
        if mask == 0 {
            return true;
        }
        if self.root() {
            // Root may do anything but execute a file nobody may execute.
            return mask & libc::X_OK == 0 || attr.kind == FileKind::Dir || attr.mode & 0o111 != 0;
        }
        let bits = if self.uid == attr.uid {
            (attr.mode >> 6) & 7
        } else if self.in_group(attr.gid) {
            (attr.mode >> 3) & 7
        } else {
            attr.mode & 7
        };
        (bits as i32) & mask == mask
    }
}

/// The mode a file keeps once a write, a truncation or a chown has taken
/// away its set-user-ID bit and its set-group-ID bit (the latter only
/// with group execute, as Linux does); `None` when there is nothing to
/// take. The mount asks for FUSE_HANDLE_KILLPRIV_V2, so this is its to do,
/// not the kernel's: the kernel then stops asking for
/// `security.capability` before every write.
pub(super) fn killed_suid_sgid(attr: &Attr) -> Option<u32> {
    if attr.kind == FileKind::Dir {
        return None;
    }
    let mode = without_suid_sgid(attr.mode);
    (mode != attr.mode).then_some(mode)
}

/// `mode` without set-user-ID, and without set-group-ID when it has group
/// execute.
fn without_suid_sgid(mode: u32) -> u32 {
    let mut kept = mode & !libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        kept &= !libc::S_ISGID;
    }
    kept
}

impl Fs {
    /// Checks the rules of chmod, chown and utimens for a caller.
    pub(super) fn check_setattr(
        &self,
        caller: Caller,
        attr: &Attr,
        set: &mut SetAttr,
    ) -> FsResult<()> {
        let owner = caller.root() || caller.uid == attr.uid;
        if let Some(mode) = set.mode {
            // What the kernel sends for a writer who is not the owner of a
            // set-user-ID or set-group-ID file, before its write or
            // truncate: the same mode without those bits (Linux clears
            // them for every writer; the write itself was checked).
            let removed = attr.mode & !mode & 0o7777;
            let added = mode & !attr.mode & 0o7777;
            let kills_privs =
                added == 0 && removed != 0 && removed & !(libc::S_ISUID | libc::S_ISGID) == 0;
            if !owner && !kills_privs {
                return Err(FsError::NotPermitted(
                    "only the owner may change the mode".into(),
                ));
            }
            let gid = set.gid.unwrap_or(attr.gid);
            if !caller.root()
                && attr.kind != FileKind::Dir
                && mode & libc::S_ISGID != 0
                && !caller.in_group(gid)
            {
                // Not a member of the file's group: the set-group-ID bit is dropped.
                set.mode = Some(mode & !libc::S_ISGID);
            }
        }
        let uid_change = set.uid.is_some_and(|u| u != attr.uid);
        let gid_change = set.gid.is_some_and(|g| g != attr.gid);
        if uid_change && !caller.root() {
            return Err(FsError::NotPermitted(
                "only root may change the owner".into(),
            ));
        }
        if let Some(g) = set.gid {
            if !caller.root() && (caller.uid != attr.uid || (gid_change && !caller.in_group(g))) {
                return Err(FsError::NotPermitted(
                    "only the owner may change the group, to a group they are in".into(),
                ));
            }
        }
        if (set.uid.is_some() || set.gid.is_some()) && attr.kind != FileKind::Dir {
            // A change of owner or group drops set-user-ID, and set-group-ID
            // when group execution is allowed.
            let before = set.mode.unwrap_or(attr.mode);
            let mode = without_suid_sgid(before);
            if mode != before || set.mode.is_some() {
                set.mode = Some(mode);
            }
        }
        for t in [set.atime, set.mtime].into_iter().flatten() {
            match t {
                TimeSet::Now if !owner && !caller.may(attr, libc::W_OK) => {
                    return Err(FsError::PermissionDenied(
                        "setting times to now needs write access".into(),
                    ))
                }
                TimeSet::Ns(_) if !owner => {
                    return Err(FsError::NotPermitted("only the owner may set times".into()))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

pub(super) fn access(
    cfs: &CurvineFs,
    req: &Request,
    ino: INodeNo,
    mask: AccessFlags,
    reply: ReplyEmpty,
) {
    let fs = cfs.0.clone();
    let caller = Caller::of(req);
    cfs.spawn("access", async move {
        let attr = try_reply!(reply, fs.getattr(ino.0).await);
        if caller.may(&attr, mask.bits()) {
            reply.ok();
        } else {
            reply.error(Errno::from_i32(libc::EACCES));
        }
    });
}

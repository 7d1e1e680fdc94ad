//! The attributes of an inode ([`Attr`]) and the versions of it older
//! releases stored.

use serde::{Deserialize, Serialize};

use crate::block::{TierKind, WriteLease};
use crate::mount::UfsState;
use crate::types::{FileKind, Ino, SetAttr, TimeSet};

/// Attributes of an inode, as `stat` reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits (07777), without the file type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Links: 2 + subdirectories for a directory, hard links for a file.
    pub nlink: u32,
    /// Target of a symlink.
    pub symlink: Option<String>,
    /// Block size of a file's data (set when data lands).
    pub block_size: u64,
    /// Replicas wanted for a file's blocks.
    pub replicas: u16,
    /// The parent directory of a directory (its `..`); 0 for other kinds.
    pub parent: Ino,
    /// Tier a file's new blocks go to; `None`: the fastest with room.
    pub storage: Option<TierKind>,
    /// Set while a writer has the file open: its size and blocks are those of
    /// the last close until the writer closes it.
    pub writing: Option<WriteLease>,
    /// Set on inodes under a UFS mount: what they mirror of the UFS.
    pub ufs: Option<UfsState>,
}

impl Attr {
    /// Applies the mode, owner and times `set` changes (not its size);
    /// a time set to `Now` becomes `now_ns`.
    pub fn apply(&mut self, set: &SetAttr, now_ns: i64) {
        if let Some(mode) = set.mode {
            self.mode = mode & 0o7777;
        }
        if let Some(uid) = set.uid {
            self.uid = uid;
        }
        if let Some(gid) = set.gid {
            self.gid = gid;
        }
        let time = |t: TimeSet| match t {
            TimeSet::Now => now_ns,
            TimeSet::Ns(ns) => ns,
        };
        if let Some(t) = set.atime {
            self.atime_ns = time(t);
        }
        if let Some(t) = set.mtime {
            self.mtime_ns = time(t);
        }
    }
}

/// The inode record as release 2 stored it (before UFS mounts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttrV2 {
    pub ino: Ino,
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub nlink: u32,
    pub symlink: Option<String>,
    pub block_size: u64,
    pub replicas: u16,
    pub parent: Ino,
    pub storage: Option<TierKind>,
    pub writing: Option<WriteLease>,
}

impl From<AttrV2> for Attr {
    fn from(a: AttrV2) -> Attr {
        Attr {
            ino: a.ino,
            kind: a.kind,
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            nlink: a.nlink,
            symlink: a.symlink,
            block_size: a.block_size,
            replicas: a.replicas,
            parent: a.parent,
            storage: a.storage,
            writing: a.writing,
            ufs: None,
        }
    }
}

/// The inode record as release 1 stored it (before file data).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttrV1 {
    pub ino: Ino,
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub nlink: u32,
    pub symlink: Option<String>,
    pub block_size: u64,
    pub replicas: u16,
    pub parent: Ino,
}

impl From<AttrV1> for Attr {
    fn from(a: AttrV1) -> Attr {
        Attr {
            ino: a.ino,
            kind: a.kind,
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            atime_ns: a.atime_ns,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            nlink: a.nlink,
            symlink: a.symlink,
            block_size: a.block_size,
            replicas: a.replicas,
            parent: a.parent,
            storage: None,
            writing: None,
            ufs: None,
        }
    }
}

//! Plain data types of the namespace: inode ids, directory entries (an
//! inode's attributes are in `attr`).

use serde::{Deserialize, Serialize};

/// Inode number. The top [`SHARD_BITS`] bits name the shard that owns the inode.
pub type Ino = u64;
/// Identifier of a namespace shard (0..shard_count).
pub type ShardId = u16;
/// Identifier of a cross-shard operation: the coordinating shard in the top
/// bits, a counter of that shard below.
pub type OpId = u64;

/// Names one call to a shard across its attempts: a mutation applied by an
/// attempt whose answer was lost (its leader died, the call timed out) is
/// answered from the shard's record when the call is made again, instead
/// of being applied twice. Made by the calling node: when the call began
/// (Unix ns, which orders the records) and a number unique on that node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReqId {
    pub at_ns: i64,
    pub nonce: u64,
}

/// The root directory. It lives on shard 0.
pub const ROOT_INO: Ino = 1;
/// Bits of an inode id that hold the shard.
pub const SHARD_BITS: u32 = 8;
/// Largest shard count a cluster can be formatted with.
pub const MAX_SHARDS: u32 = 1 << SHARD_BITS;
/// Longest file name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Longest path a request carries, in bytes. Not the kernel's PATH_MAX
/// (4096), which bounds one system call's argument: a file deep in a tree,
/// or under a mount of a directory (`--fs-path`), has a longer path from
/// the namespace root, and the mount sends that path.
pub const MAX_PATH_LEN: usize = 1 << 20;
/// Longest symlink target, in bytes.
pub const MAX_SYMLINK_LEN: usize = 4096;

const SEQ_MASK: u64 = (1u64 << (64 - SHARD_BITS)) - 1;

/// The shard that owns an inode or operation id.
pub fn shard_of(id: u64) -> ShardId {
    (id >> (64 - SHARD_BITS)) as ShardId
}

/// Builds an id from its shard and the shard-local sequence number.
pub fn make_id(shard: ShardId, seq: u64) -> u64 {
    ((shard as u64) << (64 - SHARD_BITS)) | (seq & SEQ_MASK)
}

/// The shard that holds a new directory's inode: spread by parent and name.
/// FNV-1a: stable across releases and platforms, which placement must be.
pub fn dir_shard(parent: Ino, name: &str, shard_count: u32) -> ShardId {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parent.to_be_bytes().iter().chain(name.as_bytes()) {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % shard_count.max(1) as u64) as ShardId
}

/// The type of an inode. New kinds are added at the end: stored records
/// name a kind by its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A named pipe: the kernel of each host moves its bytes.
    Fifo,
    /// A Unix socket's name: the kernel of each host connects to it.
    Socket,
    /// A character device node, with its device number (Linux `dev_t`).
    CharDevice(u32),
    /// A block device node, with its device number.
    BlockDevice(u32),
}

impl FileKind {
    /// The type letter `ls -l` prints.
    pub fn letter(self) -> char {
        match self {
            FileKind::File => '-',
            FileKind::Dir => 'd',
            FileKind::Symlink => 'l',
            FileKind::Fifo => 'p',
            FileKind::Socket => 's',
            FileKind::CharDevice(_) => 'c',
            FileKind::BlockDevice(_) => 'b',
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Dir => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "fifo",
            FileKind::Socket => "socket",
            FileKind::CharDevice(_) => "character device",
            FileKind::BlockDevice(_) => "block device",
        }
    }

    /// A FIFO, socket or device node: an inode without data of its own,
    /// whose I/O the kernel of the host that opens it does.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            FileKind::Fifo | FileKind::Socket | FileKind::CharDevice(_) | FileKind::BlockDevice(_)
        )
    }

    /// The device number of a device node (0 for other kinds).
    pub fn rdev(self) -> u32 {
        match self {
            FileKind::CharDevice(rdev) | FileKind::BlockDevice(rdev) => rdev,
            _ => 0,
        }
    }

    /// The kind a `mknod(2)` mode (`S_IFMT` bits) and device number make;
    /// `None` for a mode that is not a file, FIFO, socket or device.
    pub fn from_mode(mode: u32, rdev: u32) -> Option<FileKind> {
        match mode & 0o170000 {
            0o100000 | 0 => Some(FileKind::File),
            0o010000 => Some(FileKind::Fifo),
            0o140000 => Some(FileKind::Socket),
            0o020000 => Some(FileKind::CharDevice(rdev)),
            0o060000 => Some(FileKind::BlockDevice(rdev)),
            _ => None,
        }
    }
}

/// What a caller asks for when creating an inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewInode {
    pub kind: FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub symlink: Option<String>,
    /// Creation time chosen by the router so every shard of an operation agrees.
    pub now_ns: i64,
}

/// A directory entry: name and the inode it points to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: Ino,
    pub kind: FileKind,
}

/// A time to set: now (by the shard's clock) or an explicit instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    Ns(i64),
}

/// Changes to apply to an inode; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// Counters of one shard, for `report`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardStats {
    pub shard: ShardId,
    pub inodes: u64,
    pub dentries: u64,
    pub intents: u64,
    pub locks: u64,
    /// The LMDB environment holding the shard (shared by the node's shards
    /// with `meta.layout = "node"`).
    pub env: String,
    /// Bytes that environment occupies on disk.
    pub env_bytes: u64,
    /// The shard's Raft group as this node sees it (`None`: the group has
    /// not run on this node since it started).
    pub group: Option<GroupReport>,
}

/// A shard's Raft group as one of its members sees it. Members are
/// member ids ([`crate::wal::member_id`] of a node id).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupReport {
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// The member leading the group (0: none known).
    pub leader: u64,
    pub term: u64,
    /// The last entry known committed, and the last this member applied.
    pub commit: u64,
    pub applied: u64,
}

/// Longest extended attribute name, in bytes.
pub const MAX_XATTR_NAME_LEN: usize = 255;
/// Largest extended attribute value, in bytes (Linux's XATTR_SIZE_MAX).
pub const MAX_XATTR_VALUE_LEN: usize = 64 * 1024;

/// How a set of an extended attribute treats an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum XattrMode {
    /// Create or replace.
    Any,
    /// Fail with EEXIST if it exists (XATTR_CREATE).
    Create,
    /// Fail with ENODATA if it does not exist (XATTR_REPLACE).
    Replace,
}

/// Checks an extended attribute's name and value against the limits.
pub fn check_xattr(name: &str, value: Option<&[u8]>) -> Result<(), crate::FsError> {
    if name.is_empty() || name.contains('\0') {
        return Err(crate::FsError::InvalidArgument(
            "extended attribute names are 1 to 255 bytes without NUL".into(),
        ));
    }
    if name.len() > MAX_XATTR_NAME_LEN {
        return Err(crate::FsError::NameTooLong(format!(
            "attribute name of {} bytes exceeds {MAX_XATTR_NAME_LEN}",
            name.len()
        )));
    }
    if let Some(v) = value {
        if v.len() > MAX_XATTR_VALUE_LEN {
            return Err(crate::FsError::TooBig(format!(
                "attribute value of {} bytes exceeds {MAX_XATTR_VALUE_LEN}",
                v.len()
            )));
        }
    }
    Ok(())
}

/// Bytes as people read them (`1.5GiB`, powers of 1024).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

/// Current time in nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_shard() {
        let ino = make_id(13, 42);
        assert_eq!(shard_of(ino), 13);
        assert_eq!(ino & SEQ_MASK, 42);
        assert_eq!(shard_of(ROOT_INO), 0);
    }

    #[test]
    fn dir_shard_spreads_and_is_stable() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..200 {
            seen.insert(dir_shard(ROOT_INO, &format!("d{i}"), 16));
        }
        assert_eq!(seen.len(), 16);
        assert_eq!(dir_shard(ROOT_INO, "a", 16), dir_shard(ROOT_INO, "a", 16));
    }

    #[test]
    fn kinds_keep_their_stored_encoding_and_come_from_mknod_modes() {
        // Records of earlier releases name File, Dir and Symlink by these
        // bytes: new kinds only ever go after them.
        let enc = |k: FileKind| postcard::to_stdvec(&k).unwrap();
        assert_eq!(enc(FileKind::File), [0]);
        assert_eq!(enc(FileKind::Dir), [1]);
        assert_eq!(enc(FileKind::Symlink), [2]);
        let dev = FileKind::CharDevice(0x103);
        assert_eq!(postcard::from_bytes::<FileKind>(&enc(dev)).unwrap(), dev);
        assert_eq!(FileKind::from_mode(0o010644, 7), Some(FileKind::Fifo));
        assert_eq!(FileKind::from_mode(0o140755, 0), Some(FileKind::Socket));
        assert_eq!(
            FileKind::from_mode(0o060600, 0x811),
            Some(FileKind::BlockDevice(0x811))
        );
        assert_eq!(FileKind::from_mode(0o100644, 0), Some(FileKind::File));
        assert_eq!(FileKind::from_mode(0o040755, 0), None);
        assert_eq!(FileKind::Fifo.rdev(), 0);
        assert!(FileKind::Socket.is_special() && !FileKind::File.is_special());
    }
}

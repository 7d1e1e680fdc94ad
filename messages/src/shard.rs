//! Messages of the `NamespaceShard` actor and the records it stores.
//!
//! Single-shard operations are one message each. Operations that touch two
//! shards (mkdir and rmdir when the directory's inode lives elsewhere, renames
//! across shards, unlinking a file whose inode moved) run as an [`Intent`]
//! written in the coordinating shard, then [`Step`]s on the other shards, each
//! idempotent by `(op, step_no)`, then [`ShardMsg::EndIntent`]. An intent found
//! after a restart is driven again from its first step: finished steps return
//! their recorded result.

use ractor::RpcReplyPort;
use serde::{Deserialize, Serialize};

use crate::attr::Attr;
use crate::block::{BlockId, BlockInfo, BlockUse, FileSpec, FreedBlock, WriteLease};
use crate::codec::Versioned;
use crate::delegation::{DirGrant, DirOp, DirOpDone, Renewal};
use crate::error::FsError;
use crate::error::FsResult;
use crate::members::ClusterMap;
use crate::mount::{JournalEntry, MountTable, UfsFile, UfsOp, UfsState};
use crate::types::{
    DirEntry, FileKind, Ino, NewInode, OpId, SetAttr, ShardId, ShardStats, XattrMode,
};

/// A cross-shard operation recorded in its coordinating shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IntentOp {
    /// Create directory `name` in `parent` (held here) with its inode on `child_shard`.
    Mkdir {
        parent: Ino,
        name: String,
        attrs: NewInode,
        child_shard: ShardId,
    },
    /// Remove empty directory `name` (inode `ino`, on another shard) from `parent`.
    Rmdir { parent: Ino, name: String, ino: Ino },
    /// Move `src_parent/src_name` (here) to `dst_parent/dst_name`.
    Rename {
        src_parent: Ino,
        src_name: String,
        dst_parent: Ino,
        dst_name: String,
        ino: Ino,
        kind: FileKind,
    },
    /// Drop one link of inode `ino` (on another shard) after its entry was removed here.
    DropLink { ino: Ino },
    /// Make `name` in `parent` (held here) a new link to file `ino`, held
    /// by another shard.
    Link { parent: Ino, name: String, ino: Ino },
    /// Swap what `a_parent/a_name` (here; inode `ino`, a `kind`) and
    /// `b_parent/b_name` name (RENAME_EXCHANGE).
    Exchange {
        a_parent: Ino,
        a_name: String,
        b_parent: Ino,
        b_name: String,
        ino: Ino,
        kind: FileKind,
    },
}

/// A durable record of a cross-shard operation in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub op: OpId,
    pub action: IntentOp,
    pub created_ns: i64,
    /// Set once the operation is being rolled back; a re-drive continues the rollback.
    pub aborting: bool,
}

impl Versioned for Intent {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "intent record";
}

/// One idempotent step of a cross-shard operation, applied on one shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// Create a directory inode whose `..` is `parent`.
    CreateDirInode { attrs: NewInode, parent: Ino },
    /// Delete directory inode `ino` if it has no entries (ENOTEMPTY otherwise).
    RemoveDirIfEmpty { ino: Ino },
    /// Decrement the link count of `ino`, deleting it at zero.
    DropLink { ino: Ino },
    /// Point directory `ino`'s `..` at `parent`.
    SetDirParent { ino: Ino, parent: Ino },
    /// Check `parent` is a directory and reserve `name` in it for this op;
    /// returns the entry currently under that name, if any.
    LockName { parent: Ino, name: String },
    /// Make `parent/name` point at `ino` (replacing what is there), release the name.
    LinkName {
        parent: Ino,
        name: String,
        ino: Ino,
        kind: FileKind,
    },
    /// Remove `parent/name` if it still points at `ino`, release the name.
    UnlinkName { parent: Ino, name: String, ino: Ino },
    /// Release a name reserved by this op.
    UnlockName { parent: Ino, name: String },
    /// Close the step of this number for every driver of the operation:
    /// a driver whose step failed (or that stopped waiting for it) records
    /// `error` as the step's result before it rolls the operation back, so
    /// another driver of the same operation (the node that re-drives it
    /// after a change of leader) cannot apply the step afterwards and go
    /// on. If the step was applied first, its result is returned instead.
    Refuse { error: FsError },
    /// Add a link to inode `ino` (not a directory): its link count goes up
    /// and its ctime to now. Returns its attributes.
    AddLink { ino: Ino },
}

impl Step {
    pub fn kind_name(&self) -> &'static str {
        match self {
            Step::CreateDirInode { .. } => "create_dir_inode",
            Step::RemoveDirIfEmpty { .. } => "remove_dir_if_empty",
            Step::DropLink { .. } => "drop_link",
            Step::SetDirParent { .. } => "set_dir_parent",
            Step::LockName { .. } => "lock_name",
            Step::LinkName { .. } => "link_name",
            Step::UnlinkName { .. } => "unlink_name",
            Step::UnlockName { .. } => "unlock_name",
            Step::Refuse { .. } => "refuse",
            Step::AddLink { .. } => "add_link",
        }
    }
}

/// The recorded result of a [`Step`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepResult {
    Done,
    Created(Box<Attr>),
    Existing(Option<DirEntry>),
    /// The step was refused ([`Step::Refuse`]): the operation is rolled
    /// back with this error.
    Refused(FsError),
}

impl Versioned for StepResult {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "step record";
}

/// What an unlink did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnlinkOutcome {
    /// Entry and (last link of the) inode are gone.
    Done(DirEntry),
    /// The entry is gone; the inode lives on another shard and the intent
    /// must be driven to drop its link.
    Pending(DirEntry, Intent),
}

/// What a rename inside one shard did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenameOutcome {
    /// Done in one transaction.
    Done,
    /// Touches inodes on other shards: run it as an intent.
    NeedsIntent,
}

/// How a writer opens an existing file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenForWrite {
    pub lease: WriteLease,
    /// Layout adopted by a file that has no data yet.
    pub spec: FileSpec,
    /// Drop the file's content (O_TRUNC).
    pub truncate: bool,
    /// A lease not renewed for this long may be taken over.
    pub lease_timeout_ns: i64,
    /// Allocate, in the same commit, the block the writer starts in:
    /// `Some(false)` the first block, `Some(true)` the one holding the end
    /// of the file (an append).
    pub first_block: Option<bool>,
}

/// Layout and writer of a file being created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewFile {
    pub spec: FileSpec,
    pub lease: Option<WriteLease>,
}

/// The inode record of a new inode `ino` made with `attrs` in directory
/// `parent`; a file made for a writer (`file`) takes its layout and lease.
/// The shard stores it; a mount that creates a file in a directory
/// delegated to it answers the kernel with it before the shard has it.
pub fn new_attr(ino: Ino, attrs: &NewInode, parent: Ino, file: Option<&NewFile>) -> Attr {
    let is_dir = attrs.kind == FileKind::Dir;
    let mut attr = Attr {
        ino,
        kind: attrs.kind,
        mode: attrs.mode & 0o7777,
        uid: attrs.uid,
        gid: attrs.gid,
        size: attrs.symlink.as_ref().map(|t| t.len() as u64).unwrap_or(0),
        atime_ns: attrs.now_ns,
        mtime_ns: attrs.now_ns,
        ctime_ns: attrs.now_ns,
        nlink: if is_dir { 2 } else { 1 },
        symlink: attrs.symlink.clone(),
        block_size: 0,
        replicas: 0,
        parent: if is_dir { parent } else { 0 },
        storage: None,
        writing: None,
        ufs: None,
    };
    if let (Some(file), FileKind::File) = (file, attrs.kind) {
        attr.block_size = file.spec.block_size;
        attr.replicas = file.spec.replicas;
        attr.storage = file.spec.storage;
        attr.writing = file.lease.clone();
    }
    attr
}

/// A stored directory entry value (the key is parent ++ name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DentryValue {
    pub ino: Ino,
    pub kind: FileKind,
}

impl Versioned for DentryValue {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "directory entry";
}

impl Versioned for Attr {
    const VERSION: u8 = 3;
    const WHAT: &'static str = "inode record";
    fn migrate(version: u8, payload: &[u8]) -> Result<Self, crate::codec::CodecError> {
        match version {
            1 => {
                crate::codec::from_bytes::<crate::attr::AttrV1>(Self::WHAT, payload).map(Attr::from)
            }
            2 => {
                crate::codec::from_bytes::<crate::attr::AttrV2>(Self::WHAT, payload).map(Attr::from)
            }
            other => Err(crate::codec::CodecError::UnknownVersion {
                what: Self::WHAT,
                found: other,
            }),
        }
    }
}

/// A stored extended attribute value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XattrValue(pub Vec<u8>);

impl Versioned for XattrValue {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "extended attribute";
}

/// Identity and counters of a shard, stored in its `meta` database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMeta {
    pub cluster_id: String,
    pub shard: ShardId,
    pub shard_count: u32,
    pub next_ino: u64,
    pub next_op: u64,
}

impl Versioned for ShardMeta {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "shard meta";
}

/// A reservation of a name by an operation in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameLock {
    pub op: OpId,
}

impl Versioned for NameLock {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "name lock";
}

/// Everything a shard holds, for consistency checks (`admin fsck`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardScan {
    pub shard: ShardId,
    pub inodes: Vec<Attr>,
    /// (parent, entry)
    pub dentries: Vec<(Ino, DirEntry)>,
    pub intents: Vec<Intent>,
    pub locks: u64,
    pub op_records: u64,
}

/// What one member's copy of a shard holds, as `admin fsck` compares the
/// members of a replicated shard: the index of the last entry it applied
/// (speculatively, on a leader), its records and their hash (FNV-1a).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyDigest {
    pub applied: u64,
    pub records: u64,
    pub hash: u64,
}

type Reply<T> = RpcReplyPort<FsResult<T>>;

/// Declares [`ShardMsg`] and its wire form [`ShardWire`] from one list, so
/// the two cannot drift apart. Calls get a `reply` port of `FsResult<T>`;
/// casts have none.
macro_rules! shard_messages {
    (
        $(#[$emeta:meta])*
        pub enum ShardMsg {
            calls {
                $( $(#[$cmeta:meta])* $call:ident { $($cf:ident : $ct:ty),* $(,)? } -> $reply:ty; )*
            }
            casts {
                $( $(#[$smeta:meta])* $cast:ident { $($sf:ident : $st:ty),* $(,)? }; )*
            }
        }
    ) => {
        $(#[$emeta])*
        #[derive(Debug)]
        pub enum ShardMsg {
            $( $(#[$cmeta])* $call { $($cf: $ct,)* reply: Reply<$reply> }, )*
            $( $(#[$smeta])* $cast { $($sf: $st,)* }, )*
        }

        impl ractor::Message for ShardMsg {}

        /// A [`ShardMsg`] without its reply port, as it travels to the node
        /// that hosts the shard.
        #[derive(Debug, Serialize, Deserialize)]
        pub enum ShardWire {
            $( $call { $($cf: $ct,)* }, )*
            $( $cast { $($sf: $st,)* }, )*
        }

        impl ShardMsg {
            /// The message as it crosses nodes, and for a call the port of
            /// bytes that carries the encoded reply back to the caller.
            pub fn into_wire(self) -> (ShardWire, Option<RpcReplyPort<Vec<u8>>>) {
                match self {
                    $( ShardMsg::$call { $($cf,)* reply } => (
                        ShardWire::$call { $($cf,)* },
                        Some(crate::remote::bridge_out(reply)),
                    ), )*
                    $( ShardMsg::$cast { $($sf,)* } => (ShardWire::$cast { $($sf,)* }, None), )*
                }
            }

            /// Rebuilds a message on the hosting node; its reply is encoded
            /// into `reply`. A call without a port is refused.
            pub fn from_wire(
                wire: ShardWire,
                reply: Option<RpcReplyPort<Vec<u8>>>,
            ) -> Result<ShardMsg, FsError> {
                match wire {
                    $( ShardWire::$call { $($cf,)* } => match reply {
                        Some(port) => Ok(ShardMsg::$call {
                            $($cf,)*
                            reply: crate::remote::bridge_in(port),
                        }),
                        None => Err(FsError::Protocol(format!(
                            "shard request {} arrived without a reply port",
                            stringify!($call)
                        ))),
                    }, )*
                    $( ShardWire::$cast { $($sf,)* } => Ok(ShardMsg::$cast { $($sf,)* }), )*
                }
            }

            /// Answers the message with `error` (a call) or drops it (a cast).
            pub fn fail(self, error: FsError) {
                match self {
                    $( ShardMsg::$call { reply, .. } => {
                        let _ = reply.send(Err(error));
                    } )*
                    $( ShardMsg::$cast { .. } => {} )*
                }
            }

            /// The message's kind, as trace events name it.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( ShardMsg::$call { .. } => concat!("ShardMsg::", stringify!($call)), )*
                    $( ShardMsg::$cast { .. } => concat!("ShardMsg::", stringify!($cast)), )*
                }
            }

            /// Whether the message expects a reply.
            pub fn is_call(&self) -> bool {
                match self {
                    $( ShardMsg::$call { .. } => true, )*
                    $( ShardMsg::$cast { .. } => false, )*
                }
            }
        }
    };
}

/// One record of a shard's databases, for moving the shard to another node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// Which database (the store's table number).
    pub table: u8,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// A part of a shard's export, in key order, with where the next part starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportChunk {
    pub records: Vec<ShardRecord>,
    /// Table and key after the last record; `None` at the end.
    pub next: Option<(u8, Vec<u8>)>,
}

shard_messages! {
    /// Requests to one `NamespaceShard`. Sent by the namespace router and the
    /// intent driver on the same node. None may be lost silently: a shard that is
    /// gone drops the reply port and the caller sees `Unavailable`.
    pub enum ShardMsg {
        calls {
            /// The entry `name` in directory `parent` (held by this shard).
            Lookup { parent: Ino, name: String } -> DirEntry;
            /// The entry `name` in `parent`, with the inode's attributes when this
            /// shard owns the inode too (files usually; directories rarely).
            LookupAttr { parent: Ino, name: String } -> (DirEntry, Option<Attr>);
            /// Attributes of an inode owned by this shard.
            GetAttr { ino: Ino } -> Attr;
            /// Up to `limit` entries of directory `ino` after name `after`, in name order.
            ReadDir { ino: Ino, after: Option<String>, limit: u32 } -> Vec<DirEntry>;
            /// Like `ReadDir`, with the attributes of every entry whose inode this
            /// shard owns (files usually); `None` for the others.
            ReadDirPlus { ino: Ino, after: Option<String>, limit: u32 } -> Vec<(DirEntry, Option<Attr>)>;
            /// Create a file or symlink `name` in `parent`; its inode lives here too.
            /// `file` sets a new file's data layout and, for a writer, its lease.
            Create { parent: Ino, name: String, attrs: NewInode, file: Option<NewFile> } -> Attr;
            /// Create file `name` in `parent` for a writer: with its lease, and with
            /// its first block allocated in the same commit.
            CreateFile { parent: Ino, name: String, attrs: NewInode, file: NewFile } -> (Attr, BlockId);
            /// Open an existing file for writing: take its lease (EBUSY while another
            /// writer's lease is fresh), dropping its blocks when `truncate`. Replies
            /// with the attributes and the blocks the file has now.
            OpenWrite { ino: Ino, open: OpenForWrite } -> (Attr, Vec<BlockInfo>, Option<BlockId>);
            /// Allocate block `index` of a file for the writer holding `handle`.
            AddBlock { ino: Ino, handle: u64, index: u32 } -> BlockId;
            /// Close a file after writing: `blocks` replace the blocks at their
            /// indexes, `size` becomes the file's size (blocks past it are dropped),
            /// allocated blocks not listed are freed, and the lease is released;
            /// then `set` applies (no size), in the same commit.
            CompleteFile { ino: Ino, handle: u64, size: u64, blocks: Vec<BlockInfo>, ufs: Option<UfsState>, set: Option<SetAttr> } -> Attr;
            /// Attributes and committed blocks of a file owned here.
            FileBlocks { ino: Ino } -> (Attr, Vec<BlockInfo>);
            /// What each of these block ids (allocated by this shard) is used for.
            CheckBlocks { ids: Vec<BlockId>, node: String } -> Vec<BlockUse>;
            /// Blocks no longer referenced, to remove from their nodes.
            TakeFreed { limit: u32 } -> Vec<FreedBlock>;
            /// Create directory `name` in `parent` with its inode on this shard.
            MkdirLocal { parent: Ino, name: String, attrs: NewInode } -> Attr;
            /// Change attributes of an inode owned here.
            SetAttr { ino: Ino, set: SetAttr } -> Attr;
            /// Set an extended attribute of an inode owned here.
            SetXattr { ino: Ino, name: String, value: Vec<u8>, mode: XattrMode } -> ();
            /// Value of an extended attribute (ENODATA when absent).
            GetXattr { ino: Ino, name: String } -> Vec<u8>;
            /// Names of an inode's extended attributes, in byte order.
            ListXattr { ino: Ino } -> Vec<String>;
            /// Remove an extended attribute (ENODATA when absent).
            RemoveXattr { ino: Ino, name: String } -> ();
            /// Remove file or symlink `name` from `parent`.
            Unlink { parent: Ino, name: String } -> UnlinkOutcome;
            /// Remove empty directory `name` from `parent` when its inode is here too.
            RmdirLocal { parent: Ino, name: String } -> DirEntry;
            /// Rename within this shard (both parents here) when no other shard is involved.
            RenameLocal { src_parent: Ino, src_name: String, dst_parent: Ino, dst_name: String } -> RenameOutcome;
            /// Make `name` in `parent` a new link to `ino` when this shard holds
            /// both; `None` (nothing changed) when `ino` is held by another shard.
            LinkLocal { ino: Ino, parent: Ino, name: String } -> Option<Attr>;
            /// Validate and record a cross-shard operation coordinated by this shard.
            BeginIntent { action: IntentOp } -> Intent;
            /// Mark an intent as rolling back.
            AbortIntent { op: OpId } -> ();
            /// Apply one idempotent step of operation `op`.
            ApplyStep { op: OpId, step_no: u8, step: Step } -> StepResult;
            /// Delete a finished intent and the name locks it still holds here.
            EndIntent { op: OpId } -> ();
            /// Intents recorded here (for re-driving after a restart).
            ListIntents {} -> Vec<Intent>;
            /// Counters for `report`.
            Stats {} -> ShardStats;
            /// Full content, for consistency checks.
            Scan {} -> ShardScan;
            /// This node's own copy of the shard as it applied it so far
            /// (asked of each member directly, never a namespace read).
            Digest {} -> CopyDigest;
            /// The cluster map (shard 0 holds it); `None` before it is first set.
            GetMap {} -> Option<ClusterMap>;
            /// Stores `map` if the stored map's version is `expect` (0: none
            /// yet) and `map.version` is higher; replies with the map stored
            /// afterwards, so a caller that lost the race sees the winner.
            SetMap { expect: u64, map: ClusterMap } -> ClusterMap;
            /// Up to about `max_bytes` of this shard's records from `from`
            /// on, in key order (the first part of a shard move).
            Export { from: Option<(u8, Vec<u8>)>, max_bytes: u32 } -> ExportChunk;
            /// Writes records exported by another node into this shard's
            /// databases (a shard move's copy).
            Import { records: Vec<ShardRecord> } -> ();
            /// Deletes every record of this shard (before an import, and on
            /// the old node after a move).
            DropAll {} -> ();
            /// Refuses every later request that reads or changes the
            /// namespace (`Unavailable`, so callers retry) until `Unfreeze`;
            /// answers once the mutations accepted before are committed.
            Freeze {} -> ();
            /// Serves requests again.
            Unfreeze {} -> ();
            /// Up to `limit` blocks of files after `(ino, index)`, with each
            /// file's wanted replica count (for re-replication and decommission).
            ScanBlocks { after: Option<(Ino, u32)>, limit: u32 } -> Vec<(Ino, u16, BlockInfo)>;
            /// Sets the nodes of block `index` of `ino` when it is still block
            /// `id`; `false` when the file has moved on (the copy is then an orphan).
            SetLocs { ino: Ino, index: u32, id: BlockId, locs: Vec<String> } -> bool;
            /// A copy of block `id` on `node` is bad (scrub): forget that copy
            /// when the data is whole elsewhere (another copy, or the UFS
            /// object of a file that mirrors it); keep the only copy.
            /// Without `apply`, only says what it would do.
            DropCopy { id: BlockId, node: String, apply: bool } -> crate::block::CopyDrop;
            /// Takes the cluster's lock for moving directories across
            /// directories (shard 0 holds it, in memory, for `lease_ms`);
            /// `false` while another holder's lease runs.
            LockRenames { holder: String, lease_ms: u32 } -> bool;
            /// Releases the rename lock if `holder` has it.
            UnlockRenames { holder: String } -> ();
            /// The mount table (shard 0 holds it).
            GetMounts {} -> MountTable;
            /// Stores `table` if the stored table's version is `expect`
            /// (`Busy` otherwise, so a caller re-reads and tries again).
            SetMounts { expect: u64, table: MountTable } -> MountTable;
            /// Sets or clears what inode `ino` mirrors of its UFS object.
            SetUfs { ino: Ino, ufs: Option<UfsState> } -> Attr;
            /// Brings files of directory `parent` in line with their UFS
            /// objects (see `ShardStore::ufs_sync`); new files get `owner`.
            UfsSync { parent: Ino, mount: u32, files: Vec<UfsFile>, owner: NewInode, spec: FileSpec } -> Vec<(String, Attr)>;
            /// Compares UFS file `ino` with its object as the UFS has it now
            /// (see `ShardStore::ufs_refresh`).
            UfsRefresh { ino: Ino, mount: u32, file: UfsFile, now_ns: i64 } -> Attr;
            /// Allocates the cached copy of block `index` of UFS file `ino`
            /// while the file mirrors `expect`; `None`: read without caching.
            UfsAddBlock { ino: Ino, index: u32, expect: UfsFile } -> Option<BlockId>;
            /// Records a cached block allocated by `UfsAddBlock`; `false` when
            /// the file changed or another copy got there first.
            UfsCommitBlock { ino: Ino, info: BlockInfo, expect: UfsFile } -> bool;
            /// Records the outcome of persisting file `ino`: `state` is stored
            /// only while the file still waits with content from `since_ns`
            /// (a newer write is persisted by its own turn); `false` otherwise.
            UfsPersisted { ino: Ino, since_ns: i64, state: UfsState } -> bool;
            /// Appends changes to replay on mount `mount`'s UFS (shard 0
            /// keeps the journal); replies with the last sequence number.
            JournalAppend { mount: u32, ops: Vec<UfsOp> } -> u64;
            /// Up to `limit` journal entries in order.
            JournalRead { limit: u32 } -> Vec<JournalEntry>;
            /// Drops the journal entries up to `upto` (applied).
            JournalTrim { upto: u64 } -> ();
            /// Writes records of the node's own services (load jobs) into
            /// shard 0, under `rec/`; an empty value deletes the key.
            RecordPut { entries: Vec<(Vec<u8>, Vec<u8>)> } -> ();
            /// Up to `limit` records whose key starts with `prefix`, after `after`.
            RecordScan { prefix: Vec<u8>, after: Option<Vec<u8>>, limit: u32 } -> Vec<(Vec<u8>, Vec<u8>)>;
            /// Gives up a block allocated by `UfsAddBlock` (the fill failed).
            UfsAbortBlock { ino: Ino, id: BlockId } -> ();
            /// Drops the cached blocks of a file whose content is in the UFS.
            UfsEvict { ino: Ino } -> u32;
            /// Delegates directory `dir` to mount `holder` (see
            /// `crate::delegation`), setting `inos` inode numbers aside.
            Delegate { dir: Ino, holder: u64, inos: u32 } -> DirGrant;
            /// Renews `holder`'s delegation of `dir`.
            RenewDelegation { dir: Ino, holder: u64 } -> Renewal;
            /// Answered `true` once the shard wants `dir` back from `holder`,
            /// `false` at the holder's next renewal.
            AwaitRecall { dir: Ino, holder: u64 } -> bool;
            /// The holder's changes in its delegated directory `dir`, in order.
            DirOps { dir: Ino, holder: u64, ops: Vec<DirOp> } -> Vec<FsResult<DirOpDone>>;
            /// Ends `holder`'s delegation of `dir`.
            ReleaseDelegation { dir: Ino, holder: u64 } -> ();
        }
        casts {
            /// Forget freed blocks once their nodes removed them. May be lost: they
            /// are taken again and removal is idempotent.
            ForgetFreed { ids: Vec<BlockId> };
            /// Delete step records older than `before_ns` of operations no longer
            /// pending here (sent by the shard to itself now and then). May be
            /// lost: the next one sweeps.
            SweepOps { before_ns: i64 };
            /// Look at the shard's generation of recorded answers, and move it
            /// on where this member leads and has seen it for the records' TTL
            /// (sent by the shard to itself now and then). May be lost.
            AgeAnswers {};
            /// Free uncommitted blocks of writers that are gone (leases last
            /// renewed before `lease_before_ns`) and of UFS fills handed out
            /// before `fill_before_ns` (sent by the shard to itself now and
            /// then). May be lost: the next one reclaims.
            ReclaimPending { lease_before_ns: i64, fill_before_ns: i64 };
        }
    }
}

impl ShardMsg {
    /// Whether a frozen shard (one being moved) still handles the message:
    /// the move's own steps and reports.
    pub fn allowed_while_frozen(&self) -> bool {
        matches!(
            self,
            ShardMsg::Export { .. }
                | ShardMsg::Import { .. }
                | ShardMsg::DropAll { .. }
                | ShardMsg::Freeze { .. }
                | ShardMsg::Unfreeze { .. }
                | ShardMsg::Stats { .. }
                | ShardMsg::Digest { .. }
        )
    }

    /// A short name of the message kind, for traces and metrics.
    pub fn kind_name(&self) -> &'static str {
        match self {
            ShardMsg::Lookup { .. } => "lookup",
            ShardMsg::LookupAttr { .. } => "lookup_attr",
            ShardMsg::GetAttr { .. } => "getattr",
            ShardMsg::ReadDir { .. } => "readdir",
            ShardMsg::ReadDirPlus { .. } => "readdirplus",
            ShardMsg::Create { .. } => "create",
            ShardMsg::OpenWrite { .. } => "open_write",
            ShardMsg::CreateFile { .. } => "create_file",
            ShardMsg::AddBlock { .. } => "add_block",
            ShardMsg::CompleteFile { .. } => "complete_file",
            ShardMsg::FileBlocks { .. } => "file_blocks",
            ShardMsg::CheckBlocks { .. } => "check_blocks",
            ShardMsg::TakeFreed { .. } => "take_freed",
            ShardMsg::ForgetFreed { .. } => "forget_freed",
            ShardMsg::MkdirLocal { .. } => "mkdir_local",
            ShardMsg::SetAttr { .. } => "setattr",
            ShardMsg::Unlink { .. } => "unlink",
            ShardMsg::SetXattr { .. } => "setxattr",
            ShardMsg::GetXattr { .. } => "getxattr",
            ShardMsg::ListXattr { .. } => "listxattr",
            ShardMsg::RemoveXattr { .. } => "removexattr",
            ShardMsg::RmdirLocal { .. } => "rmdir_local",
            ShardMsg::RenameLocal { .. } => "rename_local",
            ShardMsg::LinkLocal { .. } => "link_local",
            ShardMsg::BeginIntent { .. } => "begin_intent",
            ShardMsg::AbortIntent { .. } => "abort_intent",
            ShardMsg::ApplyStep { .. } => "apply_step",
            ShardMsg::EndIntent { .. } => "end_intent",
            ShardMsg::SweepOps { .. } => "sweep_ops",
            ShardMsg::AgeAnswers { .. } => "age_answers",
            ShardMsg::ReclaimPending { .. } => "reclaim_pending",
            ShardMsg::ListIntents { .. } => "list_intents",
            ShardMsg::Stats { .. } => "stats",
            ShardMsg::Scan { .. } => "scan",
            ShardMsg::Digest { .. } => "digest",
            ShardMsg::GetMap { .. } => "get_map",
            ShardMsg::SetMap { .. } => "set_map",
            ShardMsg::Export { .. } => "export",
            ShardMsg::Import { .. } => "import",
            ShardMsg::DropAll { .. } => "drop_all",
            ShardMsg::Freeze { .. } => "freeze",
            ShardMsg::Unfreeze { .. } => "unfreeze",
            ShardMsg::ScanBlocks { .. } => "scan_blocks",
            ShardMsg::SetLocs { .. } => "set_locs",
            ShardMsg::DropCopy { .. } => "drop_copy",
            ShardMsg::LockRenames { .. } => "lock_renames",
            ShardMsg::UnlockRenames { .. } => "unlock_renames",
            ShardMsg::GetMounts { .. } => "get_mounts",
            ShardMsg::SetMounts { .. } => "set_mounts",
            ShardMsg::SetUfs { .. } => "set_ufs",
            ShardMsg::UfsSync { .. } => "ufs_sync",
            ShardMsg::UfsRefresh { .. } => "ufs_refresh",
            ShardMsg::UfsAddBlock { .. } => "ufs_add_block",
            ShardMsg::UfsCommitBlock { .. } => "ufs_commit_block",
            ShardMsg::UfsEvict { .. } => "ufs_evict",
            ShardMsg::Delegate { .. } => "delegate",
            ShardMsg::RenewDelegation { .. } => "renew_delegation",
            ShardMsg::AwaitRecall { .. } => "await_recall",
            ShardMsg::DirOps { .. } => "dir_ops",
            ShardMsg::ReleaseDelegation { .. } => "release_delegation",
            ShardMsg::UfsAbortBlock { .. } => "ufs_abort_block",
            ShardMsg::UfsPersisted { .. } => "ufs_persisted",
            ShardMsg::JournalAppend { .. } => "journal_append",
            ShardMsg::JournalRead { .. } => "journal_read",
            ShardMsg::JournalTrim { .. } => "journal_trim",
            ShardMsg::RecordPut { .. } => "record_put",
            ShardMsg::RecordScan { .. } => "record_scan",
        }
    }
}

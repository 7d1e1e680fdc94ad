//! The client protocol: what the client library sends to any node.
//!
//! A connection opens with [`crate::codec::Hello`] from each side, then the
//! node sends a [`HelloReply`] frame (its layout never changes, so a client of
//! any version can read a refusal). After that the client sends
//! [`RequestFrame`]s and the node answers [`ResponseFrame`]s with the same id,
//! in any order (requests run concurrently).
//!
//! Every request is a struct with its reply type named by [`Call::Reply`].

use serde::{Deserialize, Serialize};

use crate::attr::Attr;
use crate::block::{
    BlockId, BlockInfo, DataNode, FileSpec, FreeSummary, ReadBlock, TierKind, TierStats, Token,
};
use crate::delegation::DirOp;
use crate::error::{FsError, FsResult};
use crate::types::{Ino, SetAttr, ShardStats, XattrMode};

/// What the refusal of a client past the node's connection limit names (in
/// [`HelloReply::message`]): a client takes it as "busy", not as a
/// protocol it cannot speak.
pub const CONNECTION_LIMIT: &str = "(node.max_connections)";

/// The node's answer to a client's hello. Its layout is frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReply {
    pub accepted: bool,
    pub server_version: u16,
    /// Why the connection is refused, or empty.
    pub message: String,
    pub cluster_id: String,
    pub node_id: String,
    /// Random bytes the client answers with a [`ClientAuth`] proving it
    /// knows the cluster cookie.
    pub challenge: Vec<u8>,
}

/// The client's answer to the node's challenge: HMAC-SHA256 of the
/// challenge and the cluster id, keyed from the cluster cookie.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientAuth {
    pub proof: Vec<u8>,
}

/// Whether the node accepts the client after its [`ClientAuth`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthReply {
    pub accepted: bool,
    /// Why not, or empty.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestFrame {
    pub id: u64,
    pub request: Request,
    /// Trace the request in this trace (a traced command); without it the
    /// node samples requests at `trace.sample_rate`.
    pub trace: Option<crate::trace::TraceCtx>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseFrame {
    pub id: u64,
    pub result: FsResult<Response>,
}

/// A request with its reply type.
pub trait Call: Into<Request> {
    type Reply;
    fn reply(response: Response) -> FsResult<Self::Reply>;
}

/// Attributes of a path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub path: String,
}

/// Create a directory (`parents`: also missing ancestors, and no error if it exists).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mkdir {
    pub path: String,
    pub parents: bool,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// One page of a directory listing, with attributes of each entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct List {
    pub path: String,
    /// Continue after this name (from the previous page's last entry).
    pub after: Option<String>,
    pub limit: u32,
}

/// Create an empty file; `exclusive` fails with EEXIST if the path exists,
/// otherwise an existing file's times are set to now (like `touch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Touch {
    pub path: String,
    pub mode: u32,
    pub exclusive: bool,
    pub uid: u32,
    pub gid: u32,
}

/// Create symlink `link` pointing at `target`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Symlink {
    pub target: String,
    pub link: String,
    pub uid: u32,
    pub gid: u32,
}

/// Swap what `a` and `b` name, atomically (RENAME_EXCHANGE): both exist.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub a: String,
    pub b: String,
}

/// Make `link` a new name (hard link) of what `target` names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub target: String,
    pub link: String,
}

/// Make a FIFO, socket or device node (`kind`) at `path`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mknod {
    pub path: String,
    pub kind: crate::types::FileKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The target of a symlink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Readlink {
    pub path: String,
}

/// Move `src` to `dst`, replacing a file or empty directory at `dst` (POSIX rename).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rename {
    pub src: String,
    pub dst: String,
}

/// Remove a file, symlink or (with `recursive`, or when empty with `dir`) a directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Remove {
    pub path: String,
    pub recursive: bool,
    /// Remove an empty directory (rmdir).
    pub dir: bool,
}

/// Change attributes of a path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetAttrs {
    pub path: String,
    pub set: SetAttr,
    /// Follow a symlink at the end of the path (chmod) or change the link
    /// itself (lchown, lutimes).
    pub follow: bool,
}

/// Set an extended attribute of a path (following a final symlink).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetXattr {
    pub path: String,
    pub name: String,
    pub value: Vec<u8>,
    pub mode: XattrMode,
}

/// Value of an extended attribute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GetXattr {
    pub path: String,
    pub name: String,
}

/// Names of a path's extended attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListXattr {
    pub path: String,
}

/// Remove an extended attribute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoveXattr {
    pub path: String,
    pub name: String,
}

/// Open a file for writing, taking its write lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenFile {
    pub path: String,
    /// Create the file when it does not exist.
    pub create: bool,
    /// Fail with EEXIST when it exists (O_EXCL).
    pub exclusive: bool,
    /// Drop its content (O_TRUNC).
    pub truncate: bool,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub spec: FileSpec,
    /// Who writes (host and process), shown by `stat` while the file is open.
    pub client: String,
    /// The writer starts at the end (its first block is the last one).
    pub append: bool,
}

/// A file open for writing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteOpen {
    pub attr: Attr,
    pub handle: u64,
    /// The blocks the file has (an appending writer continues after them).
    pub blocks: Vec<BlockInfo>,
    /// The block the writer starts in, allocated with the open.
    pub first: Option<BlockGrant>,
}

/// Allocate the next block of a file being written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddBlock {
    pub ino: u64,
    pub handle: u64,
    pub index: u32,
}

/// A new block: where to write it, with the token that allows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockGrant {
    pub id: BlockId,
    pub index: u32,
    pub token: Token,
    pub node: DataNode,
}

/// Close a written file: its new blocks and final size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompleteFile {
    /// The path the file was opened at (a file under a mount is written to
    /// its UFS object there).
    pub path: String,
    /// The writer gave up: the content stays as it was.
    pub abort: bool,
    pub ino: u64,
    pub handle: u64,
    pub size: u64,
    pub blocks: Vec<BlockInfo>,
    /// Attributes (no size) set in the same commit, after the close: what
    /// the writer's client set through the file while writing it.
    pub set: Option<SetAttr>,
    /// The last block, written short-circuit on the node this call goes
    /// to: that node commits it first (its entry in `blocks` gets the
    /// block's checksum), saving the writer a call to its data port.
    pub commit: Option<crate::block::LocalCommit>,
}

/// Open a file for reading: its blocks with tokens and the nodes holding them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenRead {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadOpen {
    pub attr: Attr,
    pub blocks: Vec<ReadBlock>,
    pub nodes: Vec<DataNode>,
    /// For a file whose content is in a UFS: blocks not cached are read
    /// through this node from the object (`DataRequest::Fill`).
    pub ufs: Option<UfsRead>,
    /// The node keeps the blocks of this version for the reader (when the
    /// file is overwritten, truncated or removed meanwhile) until it sends
    /// [`CloseRead`] with this id or its connection ends (0: nothing held).
    pub hold: u64,
}

/// Client request: the readers whose opens answered `holds` are done; the
/// blocks of the versions they read may go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseRead {
    pub holds: Vec<u64>,
}

/// How a reader gets the blocks of a UFS file that are not cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UfsRead {
    pub token: Token,
    pub node: DataNode,
}

/// Drop cached blocks of a file or tree that have another copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FreePath {
    pub path: String,
}

/// Blocks of a file with where each replica is and in which tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Blocks {
    pub path: String,
}

/// Client request: the blocks `ids` on the node asked were just read
/// without it (a mount's passthrough opens: the kernel reads their files
/// itself), so its tier evictor counts them as recently used. Blocks the
/// node does not hold are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TouchBlocks {
    pub ids: Vec<crate::block::BlockId>,
}

/// Client request: lay the blocks of a file out in one extent file on the
/// node asked (every block must be there), so that a mount on its host can
/// pass the whole file through to it. Replies with the file's blocks as
/// [`Blocks`] does, after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assemble {
    pub path: String,
}

/// Client request: as [`Assemble`], first copying the blocks of the file
/// that are only on other nodes to the node asked (each verified against
/// its checksums, and recorded as one more replica), so that a mount on
/// its host can pass the file through. The node copies when one of its
/// tiers has room for the whole file, one file at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyHere {
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockReplica {
    pub node_id: String,
    /// `None` when the node does not have the block (lost or being written).
    pub tier: Option<TierKind>,
    /// The file holding the block on the node asked (`None` elsewhere).
    pub path: Option<String>,
    /// Where the block's bytes start in `path` (non-zero in an extent file).
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockDetail {
    pub info: BlockInfo,
    pub replicas: Vec<BlockReplica>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileBlocks {
    pub attr: Attr,
    pub blocks: Vec<BlockDetail>,
}

impl FileBlocks {
    /// Each block's offset in the file, when the blocks cover the file end
    /// to end (block `i` at `i` block sizes, every one full but the last);
    /// `None` for an empty file, or one with holes or cut blocks.
    pub fn layout(&self) -> Option<Vec<u64>> {
        let bs = self.attr.block_size;
        let last = self.blocks.len().checked_sub(1)?;
        let mut out = Vec::with_capacity(self.blocks.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let off = (i as u64).checked_mul(bs)?;
            let full = if i == last {
                off + b.info.len == self.attr.size
            } else {
                b.info.len == bs
            };
            if b.info.index as usize != i || !full || b.info.stored < b.info.len {
                return None;
            }
            out.push(off);
        }
        Some(out)
    }

    /// Whether every block has a copy on the node asked.
    pub fn all_here(&self) -> bool {
        self.blocks
            .iter()
            .all(|b| b.replicas.iter().any(|r| r.path.is_some()))
    }

    /// The one file on the node asked that holds the whole file's bytes at
    /// their offsets in the file: a one-block file's block file, or the
    /// extent file its blocks were laid out in.
    pub fn backing_file(&self) -> Option<&str> {
        let layout = self.layout()?;
        let mut found: Option<&str> = None;
        for (b, off) in self.blocks.iter().zip(layout) {
            let here = b.replicas.iter().find(|r| r.path.is_some())?;
            let path = here.path.as_deref()?;
            if here.offset != off || found.is_some_and(|f| f != path) {
                return None;
            }
            found = Some(path);
        }
        found
    }
}

/// Mount a UFS location at a namespace path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mount {
    /// The mount (its `id` and `created_ns` are set by the cluster).
    pub info: crate::mount::MountInfo,
    /// Owner of the mount point when it is created.
    pub uid: u32,
    pub gid: u32,
}

/// Remove the mount at a path (the UFS keeps its objects).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Umount {
    pub path: String,
}

/// Every mount, secrets redacted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListMounts;

/// Start a load job: cache everything under a path of a mount (or a UFS
/// location under a mount's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Load {
    pub path: String,
    /// Skip files already cached whole and unchanged.
    pub no_overwrite: bool,
}

/// A load job's state and progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadStatus {
    pub id: String,
}

/// Stop a load job (what it cached stays).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelLoad {
    pub id: String,
}

/// Every load job the cluster keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListLoads;

/// Nodes, shards and counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report;

/// Check the whole namespace for dangling entries, orphans and pending intents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fsck;

/// An entry of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListEntry {
    pub name: String,
    pub attr: Attr,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub entries: Vec<ListEntry>,
    /// More entries follow the last one.
    pub more: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveSummary {
    pub files: u64,
    pub dirs: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub node_id: String,
    pub rpc_addr: String,
    pub cluster_addr: String,
    pub started_ns: i64,
    pub data_dir: String,
    pub data_addr: String,
    pub shards: Vec<ShardStats>,
    pub tiers: Vec<TierStats>,
    /// Checksum mismatches this node found in block bytes.
    pub checksum_errors: u64,
    /// `up`, `down`, `left`, or `unreachable` (up but not answering).
    pub state: String,
    pub state_since_ns: i64,
    /// fs_mode files waiting for their upload to the UFS (counted by the
    /// node that drives uploads, the one serving shard 0; zero elsewhere).
    pub persist: PersistLag,
}

/// What write-back has not yet uploaded to the UFS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistLag {
    pub files: u64,
    pub bytes: u64,
    /// When the oldest waiting change was made (Unix ns; 0: none waits).
    pub oldest_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReport {
    pub cluster_id: String,
    pub shard_count: u32,
    pub nodes: Vec<NodeReport>,
    /// The cluster map as the answering node knows it.
    pub map: crate::members::ClusterMap,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsckReport {
    pub inodes: u64,
    pub dentries: u64,
    pub directories: u64,
    pub pending_intents: u64,
    pub locks: u64,
    /// One line per inconsistency found; empty when the namespace is sound.
    pub problems: Vec<String>,
    /// Replicated shards whose members' copies were compared (each found
    /// identical, or named in `problems`).
    pub compared_copies: u64,
}

/// The nodes of the cluster as the answering node sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Members;

/// Move a shard to another node (copy, then switch the map).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveShard {
    pub shard: u16,
    pub to: String,
}

/// Spread the shards evenly over the nodes that are up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebalance;

/// Move a node's shards and blocks away, then let it leave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decommission {
    pub node: String,
}

/// One shard moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMove {
    pub shard: u16,
    pub from: String,
    pub to: String,
}

/// What a decommission did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecommissionReport {
    pub shards: Vec<ShardMove>,
    /// Blocks copied to other nodes.
    pub blocks_moved: u64,
    /// Blocks that could not be copied (their only copy stays on the node).
    pub blocks_failed: u64,
}

macro_rules! calls {
    ($($req:ident => $reply:ty, $variant:ident;)*) => {
        /// Every client request.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub enum Request {
            $($req($req),)*
        }

        impl Request {
            pub fn kind_name(&self) -> &'static str {
                match self {
                    $(Request::$req(_) => stringify!($req),)*
                }
            }
        }

        $(
            impl From<$req> for Request {
                fn from(r: $req) -> Request {
                    Request::$req(r)
                }
            }

            impl Call for $req {
                type Reply = $reply;
                fn reply(response: Response) -> FsResult<$reply> {
                    match response {
                        Response::$variant(v) => Ok(v),
                        other => Err(FsError::Protocol(format!(
                            "unexpected reply {} to {}",
                            other.kind_name(),
                            stringify!($req)
                        ))),
                    }
                }
            }
        )*
    };
}

calls! {
    Stat => Attr, Attr;
    Mkdir => Attr, Attr;
    List => Listing, Listing;
    Touch => Attr, Attr;
    Symlink => Attr, Attr;
    Mknod => Attr, Attr;
    Link => Attr, Attr;
    Exchange => (), Done;
    Readlink => String, Target;
    Rename => (), Done;
    Remove => RemoveSummary, Removed;
    SetAttrs => Attr, Attr;
    SetXattr => (), Done;
    GetXattr => Vec<u8>, Bytes;
    ListXattr => Vec<String>, Names;
    RemoveXattr => (), Done;
    Report => ClusterReport, Report;
    Fsck => FsckReport, Fsck;
    OpenFile => WriteOpen, WriteOpen;
    AddBlock => BlockGrant, Grant;
    CompleteFile => Attr, Attr;
    OpenRead => ReadOpen, ReadOpen;
    FreePath => FreeSummary, Freed;
    Blocks => FileBlocks, FileBlocks;
    Members => Vec<crate::members::MemberView>, Members;
    MoveShard => ShardMove, Moved;
    Rebalance => Vec<ShardMove>, Moves;
    Decommission => DecommissionReport, Decommissioned;
    Mount => crate::mount::MountInfo, Mounted;
    Umount => crate::mount::MountInfo, Mounted;
    ListMounts => Vec<crate::mount::MountInfo>, MountList;
    Load => crate::mount::LoadJob, Job;
    LoadStatus => crate::mount::LoadJob, Job;
    CancelLoad => crate::mount::LoadJob, Job;
    ListLoads => Vec<crate::mount::LoadJob>, Jobs;
    TraceEvents => Vec<NodeTrace>, Traces;
    Actors => Vec<crate::stats::NodeActors>, ActorTrees;
    RecordTrace => (), Done;
    Scrub => Vec<NodeScrub>, Scrubbed;
    Delegate => crate::delegation::DirGrant, DirGrant;
    RenewDelegation => crate::delegation::Renewal, Renewal;
    AwaitRecall => bool, Recall;
    DirOps => Vec<FsResult<DirOpReply>>, DirOps;
    ReleaseDelegation => (), Done;
    Assemble => FileBlocks, FileBlocks;
    CopyHere => FileBlocks, FileBlocks;
    TouchBlocks => (), Done;
    CloseRead => (), Done;
}

// ---- directory delegations (see `crate::delegation`) ----

/// What a [`DirOp`] did, as the client sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DirOpReply {
    /// The file is open for writing by the holder, as after `OpenFile`
    /// (without a first block, and with no lease, when created complete).
    Created(Box<WriteOpen>),
    Renamed,
}

/// Client request: delegate the directory at `path` to mount `holder`,
/// setting aside `inos` inode numbers for its creates. Refused with
/// `InUse` while another mount holds it or another operation holds one of
/// its names, with `TooBig` for a directory of more than
/// [`crate::delegation::MAX_DELEGATED_ENTRIES`] entries, and with
/// `NotSupported` under a cache_mode mount (its creates check the UFS
/// first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegate {
    pub path: String,
    pub holder: u64,
    pub inos: u32,
    /// The layout the holder asks for new files (zero fields: the
    /// directory's mount or the cluster's defaults).
    pub spec: FileSpec,
}

/// Client request: renew `holder`'s delegation of directory `dir`
/// (`Stale` when it has none any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewDelegation {
    pub dir: Ino,
    pub holder: u64,
}

/// Client request: answers `true` once the shard wants directory `dir`
/// back, `false` at the holder's next renewal (ask again then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitRecall {
    pub dir: Ino,
    pub holder: u64,
}

/// Client request: apply the holder's changes in directory `dir`, in
/// order; one result per change. `Stale` (for all) when the holder no
/// longer holds the directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirOps {
    pub dir: Ino,
    pub holder: u64,
    pub ops: Vec<DirOp>,
}

/// Client request: give directory `dir` back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseDelegation {
    pub dir: Ino,
    pub holder: u64,
}

/// Verify every block of every node (or of `node`) against the checksums in
/// its index (`admin scrub`). With `repair`, a bad copy is dropped when the
/// block has another copy or its file's UFS object holds the bytes; the
/// only copy of data is reported and kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scrub {
    pub node: Option<String>,
    pub repair: bool,
}

/// One node's scrub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeScrub {
    pub node: String,
    /// Blocks verified and their bytes.
    pub blocks: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub problems: Vec<ScrubProblem>,
    /// Why the node could not scrub (then the counts are 0).
    pub error: Option<String>,
}

/// A block that failed its verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubProblem {
    pub block: crate::block::BlockId,
    pub tier: String,
    pub path: String,
    /// What is wrong: missing, short, a checksum mismatch in a unit.
    pub problem: String,
    /// What repair did, or without it what `--repair` would do.
    pub action: String,
    /// Whether the block's data is still whole somewhere (another copy, the UFS).
    pub recoverable: bool,
}

/// Trace events recorded by a client (a FUSE mount) for the node to keep
/// in its ring; at most [`MAX_RECORDED_EVENTS`] at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordTrace {
    pub events: Vec<crate::trace::TraceEvent>,
}

/// The most events one [`RecordTrace`] may carry.
pub const MAX_RECORDED_EVENTS: usize = 10_000;

/// The supervision tree of every node, or of `node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actors {
    pub node: Option<String>,
}

/// Trace events of every node (or of `query.node`) matching `query`.
/// `cursors` gives, per node, the `next_seq` of a previous answer (to
/// follow); a node without one starts at `query.from_seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEvents {
    pub query: crate::trace::TraceQuery,
    pub cursors: Vec<(String, u64)>,
}

/// One node's answer to [`TraceEvents`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTrace {
    pub node: String,
    pub batch: crate::trace::TraceBatch,
    /// Why the node could not answer (then `batch` is empty).
    pub error: Option<String>,
}

/// Every reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Attr(Attr),
    Listing(Listing),
    Target(String),
    Done(()),
    Removed(RemoveSummary),
    Bytes(Vec<u8>),
    Names(Vec<String>),
    Report(ClusterReport),
    Fsck(FsckReport),
    WriteOpen(WriteOpen),
    Grant(BlockGrant),
    ReadOpen(ReadOpen),
    Freed(FreeSummary),
    FileBlocks(FileBlocks),
    Members(Vec<crate::members::MemberView>),
    Moved(ShardMove),
    Moves(Vec<ShardMove>),
    Decommissioned(DecommissionReport),
    Mounted(crate::mount::MountInfo),
    MountList(Vec<crate::mount::MountInfo>),
    Job(crate::mount::LoadJob),
    Jobs(Vec<crate::mount::LoadJob>),
    Traces(Vec<NodeTrace>),
    ActorTrees(Vec<crate::stats::NodeActors>),
    Scrubbed(Vec<NodeScrub>),
    DirGrant(crate::delegation::DirGrant),
    Renewal(crate::delegation::Renewal),
    Recall(bool),
    DirOps(Vec<FsResult<DirOpReply>>),
}

impl Response {
    pub fn kind_name(&self) -> &'static str {
        match self {
            Response::Attr(_) => "Attr",
            Response::Listing(_) => "Listing",
            Response::Target(_) => "Target",
            Response::Done(_) => "Done",
            Response::Removed(_) => "Removed",
            Response::Bytes(_) => "Bytes",
            Response::Names(_) => "Names",
            Response::Report(_) => "Report",
            Response::Fsck(_) => "Fsck",
            Response::WriteOpen(_) => "WriteOpen",
            Response::Grant(_) => "Grant",
            Response::ReadOpen(_) => "ReadOpen",
            Response::Freed(_) => "Freed",
            Response::FileBlocks(_) => "FileBlocks",
            Response::Members(_) => "Members",
            Response::Moved(_) => "Moved",
            Response::Moves(_) => "Moves",
            Response::Decommissioned(_) => "Decommissioned",
            Response::Mounted(_) => "Mounted",
            Response::MountList(_) => "MountList",
            Response::Job(_) => "Job",
            Response::Jobs(_) => "Jobs",
            Response::Traces(_) => "Traces",
            Response::ActorTrees(_) => "ActorTrees",
            Response::Scrubbed(_) => "Scrubbed",
            Response::DirGrant(_) => "DirGrant",
            Response::Renewal(_) => "Renewal",
            Response::Recall(_) => "Recall",
            Response::DirOps(_) => "DirOps",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{from_bytes, to_bytes};
    use proptest::prelude::*;

    #[test]
    fn frames_roundtrip() {
        let frame = RequestFrame {
            id: 9,
            request: Mkdir {
                path: "/a".into(),
                parents: true,
                mode: 0o755,
                uid: 0,
                gid: 0,
            }
            .into(),
            trace: Some(crate::trace::TraceCtx { trace: 5, span: 0 }),
        };
        let bytes = to_bytes("request", &frame).unwrap();
        assert_eq!(
            from_bytes::<RequestFrame>("request", &bytes).unwrap(),
            frame
        );
    }

    #[test]
    fn wrong_reply_is_a_protocol_error() {
        let err = Stat::reply(Response::Done(())).unwrap_err();
        assert!(matches!(err, FsError::Protocol(_)));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder.
        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = from_bytes::<RequestFrame>("request", &bytes);
            let _ = from_bytes::<ResponseFrame>("response", &bytes);
            let _ = from_bytes::<HelloReply>("hello", &bytes);
        }

        /// Truncating a valid frame gives an error, never a panic or a wrong value.
        #[test]
        fn truncated_frames_are_errors(cut in 0usize..40) {
            let frame = RequestFrame {
                id: 77,
                request: Rename { src: "/some/where".into(), dst: "/else/where".into() }.into(),
                trace: None,
            };
            let bytes = to_bytes("request", &frame).unwrap();
            if cut < bytes.len() {
                prop_assert!(from_bytes::<RequestFrame>("request", &bytes[..cut]).is_err());
            }
        }
    }
}

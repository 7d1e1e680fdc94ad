//! File data: blocks, tiers, access tokens, and the data-port protocol.
//!
//! A file's bytes are split into blocks of the file's block size. Block `i`
//! holds file bytes `[i * block_size, i * block_size + len)`; a missing block
//! or bytes past a block's `len` but below the file size read as zeros (a
//! sparse file). Blocks are immutable once committed: an overwrite writes a
//! new block and the shard switches the file's list at close, so a reader
//! holding the old block keeps reading consistent bytes.
//!
//! Every block carries a crc32c per [`CHECKSUM_UNIT`] bytes. The data port
//! sends them with the bytes, and a client on the node's host gets them with
//! the block file's path (short-circuit), so every read is verified by the
//! reader itself, whichever way the bytes came.

use serde::{Deserialize, Serialize};

use crate::codec::{from_bytes, CodecError, Versioned};
use crate::error::{FsError, FsResult};
use crate::types::Ino;

/// A block id: the allocating shard in the top bits, as inode ids.
pub type BlockId = u64;

/// Bytes covered by one stored crc32c.
pub const CHECKSUM_UNIT: usize = 64 * 1024;
/// Largest run of bytes in one data-port frame.
pub const MAX_CHUNK: usize = 1 << 20;
/// A chunk length that announces an error instead of bytes: a
/// [`DataReply::Error`] frame follows and the stream ends.
pub const ERROR_CHUNK: u32 = u32::MAX;
/// Default block size of new files.
pub const DEFAULT_BLOCK_SIZE: u64 = 64 << 20;
/// Smallest block size a file may have.
pub const MIN_BLOCK_SIZE: u64 = CHECKSUM_UNIT as u64;
/// Largest block size a file may have.
pub const MAX_BLOCK_SIZE: u64 = 2 << 30;

/// Room a writer reserves in a tier for a new block at first. It reserves
/// more as it writes ([`next_reservation`]), so that many writers of small
/// files on a small tier do not each hold a whole block's room.
pub const FIRST_RESERVATION: u64 = 256 << 10;

/// The room a writer that has reserved `reserved` bytes of a block of at
/// most `cap` bytes asks for when it needs `need`: at least double, so a
/// whole block takes a few requests.
pub fn next_reservation(reserved: u64, need: u64, cap: u64) -> u64 {
    need.max(reserved.saturating_mul(2)).min(cap).max(need)
}

/// Checks a requested block size: a multiple of the checksum unit within limits.
pub fn check_block_size(size: u64) -> FsResult<u64> {
    if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&size)
        || !size.is_multiple_of(CHECKSUM_UNIT as u64)
    {
        return Err(FsError::InvalidArgument(format!(
            "block size {size} must be a multiple of 64KiB between 64KiB and 2GiB"
        )));
    }
    Ok(size)
}

/// crc32c (Castagnoli, as iSCSI and ext4 use it) of `data`, computed with
/// the widest SIMD the CPU has (tens of GB/s), so that verifying every byte
/// read costs little next to moving it.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// An incremental crc32c.
#[derive(Clone, Copy)]
pub struct Crc32c(crc_fast::Digest);

impl Default for Crc32c {
    fn default() -> Self {
        Crc32c(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi))
    }
}

impl Crc32c {
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    pub fn value(&self) -> u32 {
        self.0.finalize() as u32
    }
}

/// Number of checksum units covering `len` bytes.
pub fn units(len: u64) -> usize {
    len.div_ceil(CHECKSUM_UNIT as u64) as usize
}

/// The crc32c of every checksum unit of `data` (the last may be short).
pub fn unit_crcs(data: &[u8]) -> Vec<u32> {
    data.chunks(CHECKSUM_UNIT).map(crc32c).collect()
}

/// The checksum recorded for a whole block: the crc32c of its unit crcs
/// (big-endian). Any change of the block's bytes changes a unit crc and so
/// this value; computing it costs nothing next to the data (combining crcs
/// over the data's length would cost more than hashing the data again).
pub fn block_crc(crcs: &[u32]) -> u32 {
    let mut c = Crc32c::default();
    for crc in crcs {
        c.update(&crc.to_be_bytes());
    }
    c.value()
}

/// Storage tiers, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TierKind {
    Mem,
    Ssd,
    Hdd,
}

impl TierKind {
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Mem => "MEM",
            TierKind::Ssd => "SSD",
            TierKind::Hdd => "HDD",
        }
    }

    pub fn parse(text: &str) -> FsResult<TierKind> {
        match text.to_ascii_uppercase().as_str() {
            "MEM" => Ok(TierKind::Mem),
            "SSD" => Ok(TierKind::Ssd),
            "HDD" | "DISK" => Ok(TierKind::Hdd),
            _ => Err(FsError::InvalidArgument(format!(
                "unknown storage tier {text:?} (expected MEM, SSD or HDD)"
            ))),
        }
    }
}

impl std::fmt::Display for TierKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One block of a file, as its shard records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    pub id: BlockId,
    /// Index of the block in the file (file offset / block size).
    pub index: u32,
    /// File bytes this block holds (may be less than `stored` after a truncate).
    pub len: u64,
    /// Bytes in the block's file.
    pub stored: u64,
    /// [`block_crc`] of the `stored` bytes.
    pub crc: u32,
    /// Nodes holding a replica, by node id.
    pub locs: Vec<String>,
}

impl Versioned for BlockInfo {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "block record";
}

/// How a writer asks for a file's data to be laid out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSpec {
    /// 0: the cluster default.
    pub block_size: u64,
    /// 0: the cluster default.
    pub replicas: u16,
    /// Tier new blocks go to; `None`: the fastest tier with room.
    pub storage: Option<TierKind>,
}

/// The claim of one writer on a file: set at open for write, cleared at close.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteLease {
    pub handle: u64,
    /// Who writes (host and process), for `stat` and errors.
    pub client: String,
    /// Renewed by every block the writer adds.
    pub renewed_ns: i64,
}

/// What a shard tells about a block id a node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockUse {
    /// Part of a file.
    Live,
    /// Allocated to a writer that has not closed the file yet.
    Pending,
    /// Unknown: the block belongs to nothing and may be removed.
    Unknown,
}

/// What a shard did with a bad copy of a block ([`crate::shard::ShardMsg::DropCopy`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyDrop {
    /// The node is no longer one of the block's copies; `left` remain (and
    /// re-replication tops the file up).
    Dropped { left: u32 },
    /// It was the only cached copy of a UFS file: the block is forgotten and
    /// read from the UFS object again.
    Refetch,
    /// The only copy of data nobody else holds: kept.
    OnlyCopy,
    /// The only copy until its upload to the UFS (fs_mode) is done: kept
    /// for now, droppable once uploaded.
    Uploading,
    /// No file uses the block on that node (already replaced or freed).
    Unused,
}

/// A block the shard no longer references, to be removed from its nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreedBlock {
    pub id: BlockId,
    pub locs: Vec<String>,
}

impl Versioned for FreedBlock {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "freed block";
}

/// Owner of an allocated block, for `CheckBlocks` and garbage collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockOwner {
    pub ino: Ino,
    pub index: u32,
    /// Allocated but not yet part of the file's committed list.
    pub pending: bool,
}

impl Versioned for BlockOwner {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "block owner";
}

// ---- access tokens ----------------------------------------------------------

/// What a token allows on one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    Read,
    Write,
    /// Fill a UFS file's blocks from its object (the token's `block` is
    /// the file's inode).
    Fill,
}

/// Proof that a shard allowed `access` to `block` until `expires_s` (Unix
/// seconds): an HMAC keyed by the cluster secret, checked by the data port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub block: BlockId,
    pub access: Access,
    pub expires_s: u64,
    pub mac: [u8; 16],
}

impl Token {
    /// The bytes the MAC covers.
    pub fn signed_bytes(block: BlockId, access: Access, expires_s: u64) -> [u8; 17] {
        let mut b = [0u8; 17];
        b[..8].copy_from_slice(&block.to_be_bytes());
        b[8] = match access {
            Access::Read => b'r',
            Access::Write => b'w',
            Access::Fill => b'f',
        };
        b[9..].copy_from_slice(&expires_s.to_be_bytes());
        b
    }
}

/// Where a block's data server is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataNode {
    pub node_id: String,
    /// `host:port` of the data port.
    pub data_addr: String,
    /// Identifies the node's host (boot id and host name): a client with the
    /// same key may read and write block files directly.
    pub host_key: String,
}

/// A block to read: where it is and the token to read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBlock {
    pub info: BlockInfo,
    pub token: Token,
}

// ---- the data port ----------------------------------------------------------

/// The first bytes of a data-port connection (a client connecting to the
/// wrong port gets a clear refusal instead of garbage).
pub const DATA_MAGIC: [u8; 4] = *b"CRVB";
/// Version of the data-port protocol.
pub const DATA_VERSION: u16 = 4;

/// A request frame on the data port: the request and the trace it joins.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DataFrame {
    pub trace: Option<crate::trace::TraceCtx>,
    pub request: DataRequest,
}

/// [`DataFrame`] as a client writes it (same bytes, borrowed request).
#[derive(Debug, Serialize)]
pub struct DataFrameRef<'a> {
    pub trace: Option<crate::trace::TraceCtx>,
    pub request: &'a DataRequest,
}

/// A request on the data port, framed as `u32` length + postcard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataRequest {
    /// Stream bytes `[offset, offset + len)` of a block. The node answers
    /// [`DataReply::Reading`] with the unit-aligned range it will send, then
    /// that range as chunks.
    Read { token: Token, offset: u64, len: u64 },
    /// Store a new block. The node answers [`DataReply::Ready`]; the client
    /// sends chunks (each a whole number of checksum units but the last),
    /// then an empty chunk; the node answers [`DataReply::Committed`].
    Write {
        token: Token,
        tier: Option<TierKind>,
        /// Bytes the client expects to send (space is reserved for them).
        size_hint: u64,
    },
    /// Short-circuit read: the block file's path and checksums.
    OpenLocal { token: Token },
    /// Short-circuit write: a file to write the new block into, and where
    /// in it ([`DataReply::Local`]'s `offset`). Asked again for the same
    /// block, grows its reservation to `size_hint`.
    CreateLocal {
        token: Token,
        tier: Option<TierKind>,
        size_hint: u64,
        /// The block (id, length) this writer wrote just before, on this
        /// node, ending where this one starts in the file and not
        /// committed yet: the node may place the new block right after it
        /// in one extent file, so that a file written in order on one node
        /// is one file there (which a mount can pass through).
        after: Option<(BlockId, u64)>,
    },
    /// Commit a block written through [`DataRequest::CreateLocal`].
    CommitLocal {
        token: Token,
        len: u64,
        crcs: Vec<u32>,
    },
    /// Drop a block being written (the writer gives up).
    Abort { token: Token },
    /// Stream bytes `[offset, offset + len)` of block `index` of the UFS
    /// file at `path` (the token names its inode) from the UFS object,
    /// caching the block on this node as it passes (when the mount caches).
    /// Answered like [`DataRequest::Read`].
    Fill {
        token: Token,
        path: String,
        index: u32,
        offset: u64,
        len: u64,
    },
}

impl DataRequest {
    pub fn kind_name(&self) -> &'static str {
        match self {
            DataRequest::Read { .. } => "read",
            DataRequest::Write { .. } => "write",
            DataRequest::OpenLocal { .. } => "open_local",
            DataRequest::CreateLocal { .. } => "create_local",
            DataRequest::CommitLocal { .. } => "commit_local",
            DataRequest::Abort { .. } => "abort",
            DataRequest::Fill { .. } => "fill",
        }
    }
}

/// A block written short-circuit whose commit goes with its file's close
/// (`rpc::CompleteFile::commit`), to the node that holds it: what
/// [`DataRequest::CommitLocal`] carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalCommit {
    pub token: Token,
    pub len: u64,
    pub crcs: Vec<u32>,
}

/// A reply on the data port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataReply {
    /// Sent first on every connection.
    Hello {
        accepted: bool,
        message: String,
        node_id: String,
        host_key: String,
    },
    Reading {
        offset: u64,
        len: u64,
    },
    Ready,
    Committed {
        len: u64,
        crc: u32,
    },
    Local {
        path: String,
        len: u64,
        crcs: Vec<u32>,
        /// Where the block's bytes start in `path` (an extent file).
        offset: u64,
    },
    Done,
    Error(FsError),
}

impl DataReply {
    pub fn kind_name(&self) -> &'static str {
        match self {
            DataReply::Hello { .. } => "Hello",
            DataReply::Reading { .. } => "Reading",
            DataReply::Ready => "Ready",
            DataReply::Committed { .. } => "Committed",
            DataReply::Local { .. } => "Local",
            DataReply::Done => "Done",
            DataReply::Error(_) => "Error",
        }
    }
}

/// The header of a chunk of block bytes: `u32` length, then one `u32` crc32c
/// per checksum unit of the chunk, then the bytes. A zero length ends a write.
pub fn chunk_header(len: usize, crcs: &[u32], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(len as u32).to_be_bytes());
    for crc in crcs {
        out.extend_from_slice(&crc.to_be_bytes());
    }
}

/// Verifies `data` (starting at a unit boundary) against its unit crcs.
/// Names the first unit that does not match.
pub fn verify_units(data: &[u8], crcs: &[u32], first_unit: usize, what: &str) -> FsResult<()> {
    for (i, unit) in data.chunks(CHECKSUM_UNIT).enumerate() {
        let want = crcs.get(i).copied();
        let got = crc32c(unit);
        if want != Some(got) {
            return Err(FsError::Corrupt(format!(
                "{what}: checksum mismatch in unit {} (expected {:08x}, read {got:08x})",
                first_unit + i,
                want.unwrap_or(0)
            )));
        }
    }
    Ok(())
}

// ---- the BlockManager actor -------------------------------------------------

type Reply<T> = ractor::RpcReplyPort<FsResult<T>>;

/// Usage of one storage tier of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierStats {
    pub kind: TierKind,
    pub path: String,
    pub capacity: u64,
    /// Bytes of committed blocks.
    pub used: u64,
    /// Bytes reserved for blocks being written.
    pub reserved: u64,
    pub blocks: u64,
    /// Bytes of `used` that were freed but a reader still holds: removed
    /// block files a process keeps open (they are free when it closes them).
    pub held: u64,
}

/// What a [`BlockMsg::Reclaim`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Bytes freed on this node.
    pub freed: u64,
    /// Bytes of blocks on this node that will be droppable once their
    /// upload to the UFS is done (what a writer may wait for).
    pub uploading: u64,
}

/// Space reserved for a block being written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub tier: TierKind,
    /// The file to write the block into: its temporary file, or the
    /// extent file it continues.
    pub path: String,
    /// Where the block starts in `path`.
    pub offset: u64,
}

/// A block as the node's index records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRecord {
    /// Position of the tier in the node's tier list.
    pub tier: u8,
    pub kind: TierKind,
    pub len: u64,
    /// crc32c of each checksum unit.
    pub crcs: Vec<u32>,
    pub created_ns: i64,
    pub last_access_ns: i64,
    /// Set when the block's bytes are in an extent file shared with the
    /// other blocks of its file (laid out at their file offsets, so that
    /// the whole file can be handed to the kernel as one backing file);
    /// `None` for a block file of its own.
    pub extent: Option<ExtentRef>,
}

impl BlockRecord {
    /// Where the block's bytes start in the file holding them.
    pub fn offset(&self) -> u64 {
        self.extent.map_or(0, |e| e.offset)
    }
}

/// A block's place in an extent file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentRef {
    /// The extent file (`TIER/extents/ID`).
    pub id: u64,
    /// Where the block's bytes start in it.
    pub offset: u64,
}

/// [`BlockRecord`] as version 1 stored it (every block in a file of its own).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct BlockRecordV1 {
    tier: u8,
    kind: TierKind,
    len: u64,
    crcs: Vec<u32>,
    created_ns: i64,
    last_access_ns: i64,
}

impl Versioned for BlockRecord {
    const VERSION: u8 = 2;
    const WHAT: &'static str = "block index record";
    fn migrate(version: u8, payload: &[u8]) -> Result<Self, CodecError> {
        match version {
            1 => from_bytes::<BlockRecordV1>(Self::WHAT, payload).map(|v| BlockRecord {
                tier: v.tier,
                kind: v.kind,
                len: v.len,
                crcs: v.crcs,
                created_ns: v.created_ns,
                last_access_ns: v.last_access_ns,
                extent: None,
            }),
            found => Err(CodecError::UnknownVersion {
                what: Self::WHAT,
                found,
            }),
        }
    }
}

/// Where a block moves and what to copy, for the tier evictor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovePlan {
    pub from: String,
    /// Where the block's bytes start in `from` (an extent file's offset).
    pub from_offset: u64,
    pub to_tmp: String,
    pub record: BlockRecord,
    pub to_tier: u8,
}

/// Copying the blocks of one file into an extent file, planned by the
/// block manager and done by its caller off the manager's mailbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssemblePlan {
    pub extent: u64,
    pub tier: u8,
    /// The temporary file to copy into.
    pub tmp: String,
    pub parts: Vec<AssemblePart>,
}

/// One block of an [`AssemblePlan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssemblePart {
    pub block: BlockId,
    /// The file holding the block on this node (empty for a block copied
    /// from another node: see `fetched`).
    pub from: String,
    pub from_offset: u64,
    /// Where the block goes in the extent file (its offset in the file).
    pub offset: u64,
    /// The block's record here; for a fetched block its length only (its
    /// checksums come with its bytes).
    pub record: BlockRecord,
    /// Not on this node: the caller copies it from another node's data
    /// port into the extent, and it is recorded here when the extent is.
    pub fetched: bool,
}

/// What `free` did on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeSummary {
    /// Blocks dropped from the cache.
    pub freed: u64,
    pub freed_bytes: u64,
    /// Blocks kept because they are the only copy of their data.
    pub kept_only_copy: u64,
    /// Blocks not cached on this node.
    pub not_here: u64,
}

/// Requests to a node's `BlockManager`. Block bytes never travel in these
/// messages: only ids, sizes, paths and checksums.
#[derive(Debug)]
pub enum BlockMsg {
    /// Reserve space for a new block in `tier` (or the fastest with room).
    /// Asked again for a block being written, grows its reservation to
    /// `size` (a writer that grows it), or is refused as unavailable (a
    /// copy or fill of a known length: another is writing the block).
    Reserve {
        block: BlockId,
        tier: Option<TierKind>,
        size: u64,
        /// The writer grows the reservation as it writes: a first part
        /// ([`FIRST_RESERVATION`]) is reserved, in the fastest tier with
        /// room for `size` where one has it. Writers of a known length
        /// (fills, copies) ask for all.
        grows: bool,
        /// A block being written just before it by the same writer, and
        /// its length: the new block may follow it in one extent file
        /// (see [`DataRequest::CreateLocal`]).
        after: Option<(BlockId, u64)>,
        reply: Reply<Reservation>,
    },
    /// Make a written block permanent: the index records it, then its file
    /// takes its final name. Replies with the block's whole crc32c.
    Commit {
        block: BlockId,
        len: u64,
        crcs: Vec<u32>,
        reply: Reply<u32>,
    },
    /// Drop a block being written and its reservation.
    Abort { block: BlockId },
    /// Remove committed blocks (freed by their files). Idempotent.
    Remove {
        ids: Vec<BlockId>,
        reply: Option<Reply<u64>>,
    },
    /// Least recently used blocks of a tier, oldest first, covering `bytes`.
    Coldest {
        tier: u8,
        bytes: u64,
        reply: Reply<Vec<(BlockId, u64)>>,
    },
    /// Plan moving a block to a lower tier with room.
    PrepareMove {
        block: BlockId,
        reply: Reply<MovePlan>,
    },
    /// Finish (or, with `ok` false, abandon) a planned move.
    FinishMove {
        block: BlockId,
        to_tier: u8,
        ok: bool,
        reply: Reply<()>,
    },
    /// Plan copying blocks (with their offsets in their file) into one
    /// extent file in a tier with room for them all: `blocks` of this node,
    /// and `fetch` (id, offset, length) blocks the caller copies from other
    /// nodes.
    PrepareAssemble {
        blocks: Vec<(BlockId, u64)>,
        fetch: Vec<(BlockId, u64, u64)>,
        reply: Reply<AssemblePlan>,
    },
    /// Finish (or, with `ok` false, abandon) a planned extent: the blocks
    /// still as planned are read from it from now on, and the fetched ones
    /// (with the checksums of their units) not here meanwhile are recorded
    /// in it. Replies with the extent file's path.
    FinishAssemble {
        extent: u64,
        ok: bool,
        fetched: Vec<(BlockId, Vec<u32>)>,
        reply: Reply<String>,
    },
    /// Drop cached blocks that have another copy (replica or UFS).
    Free {
        ids: Vec<BlockId>,
        reply: Reply<FreeSummary>,
    },
    /// Usage of every tier.
    Stats { reply: Reply<Vec<TierStats>> },
    /// Periodic work: access times, freed blocks, orphans, stale reservations.
    Tick,
    /// Make room for the reservation of `block` (to `size`, growing as the
    /// writer writes when `grows`, as [`BlockMsg::Reserve`] asks) in
    /// `tier` (or any tier) now, before a writer is refused: remove the freed blocks of the shards this node
    /// serves that no reader holds, free the removed files their last
    /// holder closed, then drop the least recently used blocks whose data
    /// is whole elsewhere (another copy, or the UFS object of a persisted
    /// or cache_mode file) until a tier has room. Replies once done (with
    /// the bytes freed on this node).
    Reclaim {
        block: BlockId,
        size: u64,
        grows: bool,
        tier: Option<TierKind>,
        /// Drop clean cached blocks too (not for a load job's blocks: a
        /// load of more than the cache would drop what it loaded).
        drop_clean: bool,
        reply: Reply<Reclaimed>,
    },
    /// A tier's evictor failed (its supervisor restarts it): the moves
    /// in progress are undone.
    EvictorFailed { tier: u8 },
}

impl ractor::Message for BlockMsg {}

impl BlockMsg {
    pub fn kind_name(&self) -> &'static str {
        match self {
            BlockMsg::Reserve { .. } => "reserve",
            BlockMsg::Commit { .. } => "commit",
            BlockMsg::Abort { .. } => "abort",
            BlockMsg::Remove { .. } => "remove",
            BlockMsg::Coldest { .. } => "coldest",
            BlockMsg::PrepareMove { .. } => "prepare_move",
            BlockMsg::FinishMove { .. } => "finish_move",
            BlockMsg::PrepareAssemble { .. } => "prepare_assemble",
            BlockMsg::FinishAssemble { .. } => "finish_assemble",
            BlockMsg::Free { .. } => "free",
            BlockMsg::Stats { .. } => "stats",
            BlockMsg::Tick => "tick",
            BlockMsg::Reclaim { .. } => "reclaim",
            BlockMsg::EvictorFailed { .. } => "evictor_failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_crc_changes_with_any_unit() {
        let mut data: Vec<u8> = (0..(3 * CHECKSUM_UNIT + 1234))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let crcs = unit_crcs(&data);
        assert_eq!(crcs.len(), 4);
        let before = block_crc(&crcs);
        data[2 * CHECKSUM_UNIT + 9] ^= 1;
        assert_ne!(block_crc(&unit_crcs(&data)), before);
    }

    #[test]
    fn block_records_of_version_1_read_as_blocks_of_their_own() {
        let v1 = BlockRecordV1 {
            tier: 1,
            kind: TierKind::Ssd,
            len: 70_000,
            crcs: vec![1, 2],
            created_ns: 5,
            last_access_ns: 6,
        };
        let mut stored = vec![1u8];
        stored.extend(postcard::to_allocvec(&v1).unwrap());
        let read: BlockRecord = crate::codec::decode_versioned(&stored).unwrap();
        assert_eq!((read.tier, read.kind, read.len), (1, TierKind::Ssd, 70_000));
        assert_eq!(
            (&read.crcs, read.extent, read.offset()),
            (&vec![1, 2], None, 0)
        );
        let now = BlockRecord {
            extent: Some(ExtentRef {
                id: 9,
                offset: 64 << 20,
            }),
            ..read
        };
        let again = crate::codec::encode_versioned(&now);
        assert_eq!(again[0], 2);
        let back: BlockRecord = crate::codec::decode_versioned(&again).unwrap();
        assert_eq!(back.offset(), 64 << 20);
        assert_eq!(back, now);
    }

    #[test]
    fn crc32c_is_castagnoli() {
        // The check value of CRC-32C (RFC 3720).
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        let mut c = Crc32c::default();
        c.update(b"12345");
        c.update(b"6789");
        assert_eq!(c.value(), 0xe306_9283);
    }

    #[test]
    fn block_sizes_are_checked() {
        assert!(check_block_size(64 << 20).is_ok());
        assert!(check_block_size(100).is_err());
        assert!(check_block_size(65 * 1024).is_err());
        assert!(check_block_size(4 << 30).is_err());
    }

    #[test]
    fn verification_names_the_bad_unit() {
        let mut data = vec![5u8; 2 * CHECKSUM_UNIT];
        let crcs = unit_crcs(&data);
        verify_units(&data, &crcs, 0, "block 1").unwrap();
        data[CHECKSUM_UNIT + 3] ^= 1;
        let err = verify_units(&data, &crcs, 0, "block 1").unwrap_err();
        assert!(err.to_string().contains("unit 1"), "{err}");
    }
}

//! Directory delegations: a mount that creates many files in one directory
//! asks the directory's shard to delegate it. While the delegation lasts,
//! the mount knows every name in the directory (the grant lists them), so
//! it answers lookups of new names and creates itself, with inode numbers
//! the grant set aside, and sends the creates in batches ([`DirOp`]); a
//! file's close waits for its batch. The shard refuses (`Busy`, retried by
//! the caller) what another client would see differently before those
//! batches arrive: creating, removing or renaming names in the directory,
//! listing it, looking up a name it does not have, and reading or changing
//! the directory's own attributes; it asks the holder to give the
//! directory back first (a recall), and takes it back itself once the
//! holder stops renewing (or has renewed for [`RECALL_GRACE_MS`] since
//! the recall).

use serde::{Deserialize, Serialize};

use crate::attr::Attr;
use crate::block::{BlockId, FileSpec, WriteLease};
use crate::codec::Versioned;
use crate::types::{DirEntry, Ino, NewInode};

/// How long a delegation lasts without renewal (the holder renews it four
/// times as often). A holder that dies holds its directories this long.
pub const DELEGATION_LEASE_MS: u32 = 2_000;

/// After a recall, how long a holder that keeps renewing (and sending
/// batches) keeps the directory while it sends the creates it answered:
/// a slow disk or a loaded host must not turn them into lost files. A
/// holder that stops renewing loses the directory a lease after its last
/// renewal, as before the recall.
pub const RECALL_GRACE_MS: u32 = 15_000;

/// The most entries a delegated directory may have (the grant lists them
/// all).
pub const MAX_DELEGATED_ENTRIES: u32 = 100_000;

/// The most inode numbers one grant sets aside.
pub const MAX_GRANT_INOS: u32 = 4_096;

/// The stored record of a delegation (`delegations` table, key: the
/// directory's inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegationRecord {
    /// The mount holding the directory (a random id it chose at start).
    pub holder: u64,
}

impl Versioned for DelegationRecord {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "directory delegation";
}

/// What a holder gets with a delegation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirGrant {
    /// The directory as of the grant.
    pub dir: Attr,
    /// Every entry of the directory.
    pub entries: Vec<DirEntry>,
    /// Inode numbers set aside for the holder's creates: `first_ino` and
    /// the `inos - 1` after it.
    pub first_ino: Ino,
    pub inos: u32,
    pub lease_ms: u32,
    /// The layout new files in the directory get (filled in by the node
    /// that serves the mount: a UFS mount's layout, then the defaults).
    pub spec: FileSpec,
    /// No UFS mount covers the directory: a file closed before its create
    /// was sent may be created complete ([`DirOp::Create`]'s `complete`).
    pub plain: bool,
}

/// The answer to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewal {
    /// The delegation now lasts this long from the renewal's sending.
    pub lease_ms: u32,
    /// The shard wants the directory back: send what is pending, then
    /// release it (no longer renewed).
    pub recalled: bool,
}

/// A change the holder made in its delegated directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirOp {
    /// File `name` made with inode `ino` (from the grant) for a writer:
    /// with its lease and its first block; or, when `complete` (the file
    /// was closed empty before its create was sent), empty and closed.
    Create {
        name: String,
        ino: Ino,
        attrs: NewInode,
        spec: FileSpec,
        lease: WriteLease,
        complete: bool,
    },
    /// File `from` (inode `ino`) renamed to `to`, a name the directory
    /// does not have. Made again (a batch sent twice), it finds `to`
    /// naming `ino` and answers done.
    Rename { from: String, to: String, ino: Ino },
}

impl DirOp {
    /// Whether the holder answered the change before sending it (a
    /// create) or waits for it (a rename, answered once durable).
    pub fn answered_before(&self) -> bool {
        matches!(
            self,
            DirOp::Create {
                complete: false,
                ..
            }
        )
    }
}

/// What a [`DirOp`] did, at the shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirOpDone {
    /// The file, and its first block unless it was created complete.
    Created {
        attr: Box<Attr>,
        block: Option<BlockId>,
    },
    Renamed,
}

// The client's requests (`Delegate`, `RenewDelegation`, `AwaitRecall`,
// `DirOps`, `ReleaseDelegation`) are in `crate::rpc`.

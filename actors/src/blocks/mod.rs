//! Block storage of a node: tiers of block files, their LMDB index, the
//! `BlockManager` actor that changes both, and a `TierEvictor` per tier.
//!
//! Layout of a tier directory:
//!
//! ```text
//! <tier>/blocks/<xx>/<id as 16 hex digits>   committed blocks (xx: low byte of the id)
//! <tier>/tmp/<id as 16 hex digits>           blocks being written or moved
//! <tier>/extents/<extent as 16 hex digits>   blocks of one file at their file offsets
//! <tier>/tmp/extent-<extent>                 an extent file being filled
//! ```
//!
//! An extent file is filled in `tmp` and renamed into place when a file's
//! blocks are laid out in it after their commit (`Assemble`), or grows in
//! place as a writer writes a file's blocks one after another (a run,
//! `runs`): each block is committed at its offset there.
//!
//! A block is written to `tmp`, then committed: its record goes into the
//! index (LMDB, synced), then the file takes its final name. A restart
//! finishes renames the index already records and deletes every other
//! temporary file, so a block is either in the index with its file, or gone.
//! Committed block files never change; a move writes a copy in the other
//! tier, switches the index, then unlinks the old file. A reader that opened
//! the old file keeps reading the same bytes (the unlinked inode lives while
//! open); a new open finds the new path through the index.
//!
//! Modules: `store` (the block files and their index), `handle` (the
//! node's reference to its current BlockManager), `manager` (the
//! BlockManager actor: reservations, commits, moves, removal), `runs`
//! (blocks written one after another into one extent file), `tier` (a
//! tier's configuration and accounting), `holds` (what
//! readers still need of freed blocks), `room` (clean cached blocks dropped
//! for a writer that finds no room), `sweep` (freed blocks removed once
//! no reader holds them, and orphans, in the background), `evictor` (the
//! TierEvictor of a tier) and `copy` (verified copies for moves and extent
//! files).

mod copy;
mod evictor;
mod handle;
mod holds;
mod manager;
mod room;
mod runs;
mod store;
mod sweep;
mod tier;

pub use copy::fill_extent;
pub use evictor::{EvictArgs, EvictMsg, EvictState, TierEvictor};
pub use handle::BlockManagerRef;
pub use holds::{ConnHolds, ReadHolds};
pub use manager::{BlockArgs, BlockConf, BlockManager, BlockState};
pub use store::{BlockStore, Reconciled, TierInfo};

pub use curvine_messages::human_bytes as human;

use curvine_messages::FsError;

fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> FsError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        FsError::NoSpace(format!("{what}: {e}"))
    } else {
        FsError::Io(format!("{what}: {e}"))
    }
}

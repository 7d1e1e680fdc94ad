//! The block a [`super::writer::FileWriter`] is writing: its sink (a block
//! file on this host, or a stream to a node's data port), the room reserved
//! for it, and why a step of a write stopped.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use curvine_messages::block::{Crc32c, CHECKSUM_UNIT};
use curvine_messages::rpc::BlockGrant;
use curvine_messages::{FsError, FsResult};
use curvine_wire::data::{io_err, DataConn};

pub(super) enum SinkKind {
    Local {
        file: File,
        conn: DataConn,
        crcs: Vec<u32>,
        unit_crc: Box<Crc32c>,
        unit_fill: usize,
        /// Room the node reserved for the block so far (more is asked for
        /// before writing past it).
        reserved: u64,
        /// Where the block starts in `file` (an extent file holds several).
        base: u64,
    },
    Remote {
        tx: mpsc::Sender<Vec<u8>>,
        task: JoinHandle<FsResult<(u64, u32)>>,
        buf: Vec<u8>,
        /// As for `Local`: the node is asked for more before bytes past it
        /// are sent, so that a tier without room refuses a write before
        /// any of its bytes are taken, not after it was acknowledged.
        reserved: u64,
    },
}

impl SinkKind {
    pub(super) fn reserved(&self) -> u64 {
        match self {
            SinkKind::Local { reserved, .. } | SinkKind::Remote { reserved, .. } => *reserved,
        }
    }
}

/// Why a step of a write stopped.
pub(super) enum Stop {
    /// No room for its bytes (a tier full, ENOSPC): nothing of the step was
    /// stored and the writer is as it was before it, so the bytes written
    /// before stay and a later write that finds room succeeds.
    Refused(FsError),
    /// Anything else: the writer cannot go on.
    Failed(FsError),
}

impl From<FsError> for Stop {
    fn from(e: FsError) -> Stop {
        Stop::Failed(e)
    }
}

impl Stop {
    pub(super) fn into_error(self) -> FsError {
        match self {
            Stop::Refused(e) | Stop::Failed(e) => e,
        }
    }
}

/// A refusal when the node had no room, else a failure.
pub(super) fn refused_if_full(e: FsError) -> Stop {
    if matches!(e, FsError::NoSpace(_)) {
        Stop::Refused(e)
    } else {
        Stop::Failed(e)
    }
}

/// The new block being written.
pub(super) struct Sink {
    pub(super) grant: BlockGrant,
    /// Bytes written into the block so far.
    pub(super) len: u64,
    pub(super) kind: SinkKind,
}

/// Opens the file a block is written into directly: a new temporary file,
/// or at `offset` of the extent file it continues.
pub(super) fn open_block_file(path: &str, offset: u64) -> std::io::Result<File> {
    if offset == 0 {
        return OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path);
    }
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    Ok(file)
}

/// Appends bytes to a block file written directly, with its unit crcs. A
/// file system without room for them (ENOSPC, EDQUOT: a DIR tier on a disk
/// others fill) refuses them, with the file's position put back.
pub(super) fn write_local(sink: &mut Sink, data: &[u8]) -> Result<(), Stop> {
    let len = sink.len;
    let SinkKind::Local {
        file,
        crcs,
        unit_crc,
        unit_fill,
        base,
        ..
    } = &mut sink.kind
    else {
        return Err(Stop::Failed(FsError::Io(
            "the block is not written locally".into(),
        )));
    };
    if let Err(e) = file.write_all(data) {
        let what = format!("block {:#x}", sink.grant.id);
        let full = matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT));
        // What part of the bytes went in is cut off again (the block is
        // the last thing in its file).
        let back = file
            .set_len(*base + len)
            .and_then(|()| file.seek(SeekFrom::Start(*base + len)));
        return Err(if full && back.is_ok() {
            Stop::Refused(FsError::NoSpace(format!("{what}: {e}")))
        } else {
            Stop::Failed(io_err(what, e))
        });
    }
    let mut rest = data;
    while !rest.is_empty() {
        let n = (CHECKSUM_UNIT - *unit_fill).min(rest.len());
        unit_crc.update(&rest[..n]);
        *unit_fill += n;
        rest = &rest[n..];
        if *unit_fill == CHECKSUM_UNIT {
            crcs.push(unit_crc.value());
            **unit_crc = Crc32c::default();
            *unit_fill = 0;
        }
    }
    Ok(())
}

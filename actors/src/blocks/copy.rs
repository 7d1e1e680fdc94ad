//! Verified copies of block bytes: a block moving to another tier, and the
//! blocks of a file laid out in an extent file. Every checksum unit is
//! checked as it is read, so bad bytes never enter a tier.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use curvine_messages::block::{verify_units, AssemblePlan, BlockRecord, CHECKSUM_UNIT};
use curvine_messages::FsResult;

use super::io_err;

/// Copies `record.len` bytes of a block from `src` (at `from_offset`) to
/// `dst` (at `to_offset`), verifying every checksum unit.
pub(crate) fn copy_block(
    (src, src_name): (&File, &str),
    from_offset: u64,
    record: &BlockRecord,
    (dst, dst_name): (&File, &str),
    to_offset: u64,
) -> FsResult<()> {
    let mut buf = vec![0u8; 16 * CHECKSUM_UNIT];
    let mut done: u64 = 0;
    while done < record.len {
        let want = ((record.len - done) as usize).min(buf.len());
        src.read_exact_at(&mut buf[..want], from_offset + done)
            .map_err(|e| io_err(src_name, e))?;
        let first = (done / CHECKSUM_UNIT as u64) as usize;
        let crcs = &record.crcs[first.min(record.crcs.len())..];
        verify_units(&buf[..want], crcs, first, src_name)?;
        dst.write_all_at(&buf[..want], to_offset + done)
            .map_err(|e| io_err(dst_name, e))?;
        done += want as u64;
    }
    Ok(())
}

/// Creates (or truncates) a temporary file to copy into.
pub(crate) fn create_tmp(path: &str) -> FsResult<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| io_err(path, e))
}

/// Fills the temporary file of an extent with the blocks of `plan` on this
/// node, each at its offset in its file, verified; fsynced when `sync`.
/// Creates the file; fetched parts are the caller's to write after.
pub fn fill_extent(plan: &AssemblePlan, sync: bool) -> FsResult<()> {
    let dst = create_tmp(&plan.tmp)?;
    for part in plan.parts.iter().filter(|p| !p.fetched) {
        let src = File::open(&part.from).map_err(|e| io_err(&part.from, e))?;
        copy_block(
            (&src, &part.from),
            part.from_offset,
            &part.record,
            (&dst, &plan.tmp),
            part.offset,
        )?;
    }
    if sync {
        dst.sync_data().map_err(|e| io_err(&plan.tmp, e))?;
    }
    Ok(())
}

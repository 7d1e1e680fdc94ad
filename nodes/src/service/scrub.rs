//! `admin scrub`: verifies every block a node holds against the unit
//! checksums of its index, off the block manager's mailbox, one block at a
//! time on a blocking thread. With repair, a bad copy goes when the data is
//! whole elsewhere: the file's shard forgets the copy (another node keeps
//! one, and re-replication tops the file up again; or the file reads the
//! block from its UFS object again), then this node removes it. The only
//! copy of data is reported and kept.

use std::io::{Read, Seek};
use std::sync::Arc;
use std::time::Instant;

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::namespace::Namespace;
use curvine_messages::block::{crc32c, BlockId, BlockMsg, BlockRecord, CopyDrop, CHECKSUM_UNIT};
use curvine_messages::rpc::{NodeScrub, ScrubProblem};
use curvine_messages::{FsError, FsResult};

/// What reading a block found.
enum Verdict {
    /// Whole: its bytes.
    Good(u64),
    /// Gone from the index meanwhile (freed or replaced): nothing to say.
    Gone,
    Bad(ScrubProblem),
}

/// Reads block `id` and checks it against `rec`; when its file moved
/// meanwhile (a tier move), follows it once.
fn verify(store: &BlockStore, id: BlockId, rec: &BlockRecord) -> Verdict {
    let mut rec = rec.clone();
    for attempt in 0..2 {
        let path = store.file_of(id, &rec);
        let problem = |what: String| {
            Verdict::Bad(ScrubProblem {
                block: id,
                tier: store.tier_kind(rec.tier as usize).to_string(),
                path: path.display().to_string(),
                problem: what,
                action: String::new(),
                recoverable: false,
            })
        };
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match store.get(id) {
                Ok(None) => return Verdict::Gone,
                Ok(Some(now))
                    if attempt == 0 && (now.tier, now.extent) != (rec.tier, rec.extent) =>
                {
                    rec = now;
                    continue;
                }
                _ => return problem("missing: the index lists it, its file is gone".into()),
            },
            Err(e) => return problem(format!("cannot open: {e}")),
        };
        if let Err(e) = file.seek(std::io::SeekFrom::Start(rec.offset())) {
            return problem(format!("cannot seek to its extent offset: {e}"));
        }
        let mut unit = vec![0u8; CHECKSUM_UNIT];
        let mut total = 0u64;
        for (n, want) in rec.crcs.iter().enumerate() {
            let expect = (rec.len - total).min(CHECKSUM_UNIT as u64) as usize;
            let mut got = 0;
            while got < expect {
                match file.read(&mut unit[got..expect]) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(e) => return problem(format!("read error in unit {n}: {e}")),
                }
            }
            if got < expect {
                return problem(format!(
                    "short: {} bytes, the index says {}",
                    total + got as u64,
                    rec.len
                ));
            }
            let crc = crc32c(&unit[..expect]);
            if crc != *want {
                return problem(format!(
                    "checksum mismatch in unit {n} (expected {want:08x}, read {crc:08x})"
                ));
            }
            total += expect as u64;
        }
        // (An extent file holds the blocks after this one.)
        let mut extra = [0u8; 1];
        if rec.extent.is_none() && matches!(file.read(&mut extra), Ok(1)) {
            return problem(format!("longer than the {} bytes the index says", rec.len));
        }
        return Verdict::Good(total);
    }
    Verdict::Gone
}

/// What becomes of the data once a copy is dropped.
fn said(drop: &CopyDrop) -> String {
    match drop {
        CopyDrop::Dropped { left } => {
            format!(
                "{left} other cop{} remain",
                if *left == 1 { "y" } else { "ies" }
            )
        }
        CopyDrop::Refetch => "the file reads it from its UFS object again".into(),
        CopyDrop::OnlyCopy => "the only copy of this data".into(),
        CopyDrop::Uploading => "the only copy until its upload to the UFS is done".into(),
        CopyDrop::Unused => "no file uses it on this node".into(),
    }
}

/// The scrub of this node's blocks.
pub struct Scrub {
    namespace: Arc<Namespace>,
    blocks: Arc<BlockStore>,
    manager: BlockManagerRef,
    node_id: String,
}

impl Scrub {
    pub fn new(
        namespace: Arc<Namespace>,
        blocks: Arc<BlockStore>,
        manager: BlockManagerRef,
        node_id: String,
    ) -> Scrub {
        Scrub {
            namespace,
            blocks,
            manager,
            node_id,
        }
    }

    /// Verifies every block of this node; with `repair`, drops bad copies
    /// whose data is whole elsewhere.
    pub async fn scrub_local(&self, repair: bool) -> FsResult<NodeScrub> {
        let started = Instant::now();
        let all = self.blocks.all()?;
        let (mut blocks, mut bytes, mut problems) = (0u64, 0u64, Vec::new());
        for (id, rec) in all {
            let store = self.blocks.clone();
            let verdict = tokio::task::spawn_blocking(move || verify(&store, id, &rec))
                .await
                .map_err(|e| FsError::Io(format!("scrub of block {id:#x}: {e}")))?;
            match verdict {
                Verdict::Good(n) => {
                    blocks += 1;
                    bytes += n;
                }
                Verdict::Gone => {}
                Verdict::Bad(mut p) => {
                    blocks += 1;
                    self.settle_problem(&mut p, repair).await;
                    tracing::warn!(block = %format!("{id:#x}"), path = %p.path, problem = %p.problem, action = %p.action, "scrub found a bad block");
                    problems.push(p);
                }
            }
        }
        Ok(NodeScrub {
            node: self.node_id.clone(),
            blocks,
            bytes,
            seconds: started.elapsed().as_secs_f64(),
            problems,
            error: None,
        })
    }

    /// Asks the block's shard what the copy is worth and, with `repair`,
    /// drops it where the data is whole elsewhere.
    async fn settle_problem(&self, p: &mut ScrubProblem, repair: bool) {
        let (id, node) = (p.block, self.node_id.clone());
        let outcome = self.namespace.drop_copy(id, &node, repair).await;
        let (recoverable, action) = match outcome {
            Err(e) => (false, format!("could not ask the block's shard: {e}")),
            Ok(drop @ (CopyDrop::OnlyCopy | CopyDrop::Uploading)) => {
                (false, format!("kept: {}", said(&drop)))
            }
            Ok(drop) if !repair => (
                true,
                format!("--repair would drop this copy; {}", said(&drop)),
            ),
            Ok(drop) => {
                let removed = self
                    .manager
                    .call(move |r| BlockMsg::Remove {
                        ids: vec![id],
                        reply: Some(r),
                    })
                    .await;
                match removed {
                    Ok(_) => (true, format!("dropped this copy; {}", said(&drop))),
                    Err(e) => (
                        true,
                        format!("forgotten ({}), but not removed: {e}", said(&drop)),
                    ),
                }
            }
        };
        p.recoverable = recoverable;
        p.action = action;
    }
}

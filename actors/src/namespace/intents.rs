//! The intent driver: a cross-shard operation recorded by its home shard
//! is driven step by step (each step idempotent), rolled back when a step
//! fails before the irreversible one, and driven again after a restart.

use std::ops::Range;
use std::time::{Duration, Instant};

use rand::Rng;

use curvine_messages::shard::{Intent, IntentOp, ShardMsg, Step, StepResult};
use curvine_messages::{shard_of, Attr, DirEntry, FileKind, FsError, FsResult, Ino, OpId, ShardId};

use super::Namespace;
use crate::store::check_rename_kinds;

/// How long a rename waits for a target name another operation holds
/// before it rolls back and tries again (a random length in this range,
/// so that two renames waiting for each other do not step back together).
const LOCK_WAIT: Range<Duration> = Duration::from_millis(50)..Duration::from_millis(300);

impl Namespace {
    /// Drives an intent in a task of its own: a caller that gives up (timeout,
    /// disconnect) does not leave it half done.
    pub(super) async fn drive_in_task(&self, intent: Intent) -> FsResult<Option<Attr>> {
        let this = self
            .me
            .upgrade()
            .ok_or_else(|| FsError::Unavailable("the node is stopping".into()))?;
        let nodes = self.intent_nodes(&intent);
        // The steps stay in the caller's trace.
        let ctx = crate::trace::current();
        let task = tokio::spawn(crate::trace::scope(
            ctx,
            async move { this.drive(intent).await },
        ));
        // A step waits for a node that is down (it must not be rolled back
        // while the node may still apply it); the caller learns at once.
        let down = async {
            let waits = nodes.iter().map(|n| Box::pin(self.cluster.wait_down(n)));
            match waits.len() {
                0 => std::future::pending().await,
                _ => futures_select_all(waits.collect()).await,
            }
        };
        tokio::select! {
            r = tokio::time::timeout(self.timeout, task) => match r {
                Ok(Ok(result)) => result,
                Ok(Err(join)) => Err(FsError::Io(format!("intent driver failed: {join}"))),
                Err(_) => Err(FsError::TimedOut(
                    "operation still in progress; it is finished or rolled back in the background".into(),
                )),
            },
            e = down => Err(match e {
                FsError::NodeDown(d) => FsError::NodeDown(format!(
                    "{d}; the operation completes or is undone when that node is back"
                )),
                other => other,
            }),
        }
    }

    /// The other nodes an intent's steps go to.
    fn intent_nodes(&self, intent: &Intent) -> Vec<String> {
        let shards: Vec<ShardId> = match &intent.action {
            IntentOp::Mkdir {
                parent,
                child_shard,
                ..
            } => vec![shard_of(*parent), *child_shard],
            IntentOp::Rmdir { parent, ino, .. } => vec![shard_of(*parent), shard_of(*ino)],
            IntentOp::Rename {
                src_parent,
                dst_parent,
                ino,
                ..
            } => vec![shard_of(*src_parent), shard_of(*dst_parent), shard_of(*ino)],
            IntentOp::DropLink { ino } => vec![shard_of(*ino)],
            IntentOp::Link { parent, ino, .. } => vec![shard_of(*parent), shard_of(*ino)],
            IntentOp::Exchange {
                a_parent,
                b_parent,
                ino,
                ..
            } => vec![shard_of(*a_parent), shard_of(*b_parent), shard_of(*ino)],
        };
        let map = self.cluster.map();
        // A replicated shard's steps go to whichever member leads it: a
        // node of it that is down is not waited for.
        let mut nodes: Vec<String> = shards
            .into_iter()
            .filter(|s| !map.replicated(*s))
            .filter_map(|s| map.owner(s).map(str::to_string))
            .filter(|n| *n != self.cluster.node_id)
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Records a cross-shard operation in shard `home` and drives it.
    pub(super) async fn begin_and_drive(
        &self,
        home: ShardId,
        action: IntentOp,
    ) -> FsResult<Option<Attr>> {
        let intent = self
            .call(home, move |reply| ShardMsg::BeginIntent {
                action: action.clone(),
                reply,
            })
            .await?;
        self.drive_in_task(intent).await
    }

    /// Drives an intent to its end from its first step (finished steps return
    /// their recorded results). Returns the created directory for mkdir.
    pub async fn drive(&self, intent: Intent) -> FsResult<Option<Attr>> {
        let op = intent.op;
        let aborting = intent.aborting;
        match intent.action {
            IntentOp::Mkdir {
                parent,
                name,
                attrs,
                child_shard,
            } => {
                // The directory's inode in its own shard, then its name.
                let step = (child_shard, Step::CreateDirInode { attrs, parent });
                self.make_then_name(op, aborting, step, parent, name, "mkdir")
                    .await
            }
            IntentOp::Rmdir { parent, name, ino } => {
                self.drive_rmdir(op, aborting, parent, name, ino).await
            }
            IntentOp::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ino,
                kind,
            } => {
                let (src, dst) = ((src_parent, src_name), (dst_parent, dst_name));
                self.drive_rename(op, aborting, src, dst, ino, kind).await
            }
            IntentOp::DropLink { ino } => {
                self.step(shard_of(ino), op, 1, Step::DropLink { ino })
                    .await?;
                self.end_intent(op).await?;
                Ok(None)
            }
            IntentOp::Link { parent, name, ino } => {
                // A hard link across shards: the name was reserved when the
                // intent was recorded; the inode's count goes up in its own
                // shard, then the name is made. A crash between the two is
                // finished by the re-drive; a gone inode or a directory
                // rolls the link back.
                let step = (shard_of(ino), Step::AddLink { ino });
                self.make_then_name(op, aborting, step, parent, name, "link")
                    .await
            }
            IntentOp::Exchange {
                a_parent,
                a_name,
                b_parent,
                b_name,
                ino,
                kind,
            } => {
                let (a, b) = ((a_parent, a_name), (b_parent, b_name));
                self.drive_exchange(op, aborting, a, b, (ino, kind)).await
            }
        }
    }

    /// The two steps of a mkdir or link across shards: `step` on its shard
    /// (decisive: its failure rolls the operation back) gives the inode,
    /// which then gets `name` in `parent`, held by the operation's shard.
    async fn make_then_name(
        &self,
        op: OpId,
        aborting: bool,
        (shard, step): (ShardId, Step),
        parent: Ino,
        name: String,
        what: &str,
    ) -> FsResult<Option<Attr>> {
        if aborting {
            self.end_intent(op).await?;
            return Err(FsError::Io(format!("{what} was rolled back")));
        }
        let attr = match self.decisive_step(shard, op, 1, step, None).await {
            Ok(StepResult::Created(attr)) => *attr,
            Ok(other) => {
                return Err(FsError::Corrupt(format!(
                    "{what} step 1 returned {other:?}"
                )))
            }
            Err(e) => return self.abort(op, &[], e).await,
        };
        let link = Step::LinkName {
            parent,
            name,
            ino: attr.ino,
            kind: attr.kind,
        };
        self.step(shard_of(op), op, 2, link).await?;
        self.end_intent(op).await?;
        Ok(Some(attr))
    }

    /// An rmdir of a directory held by another shard: the directory goes
    /// when it is empty (step 1), then its name (step 2).
    async fn drive_rmdir(
        &self,
        op: OpId,
        aborting: bool,
        parent: Ino,
        name: String,
        ino: Ino,
    ) -> FsResult<Option<Attr>> {
        let home = shard_of(op);
        if aborting {
            self.end_intent(op).await?;
            return Err(FsError::NotEmpty(String::new()));
        }
        if let Err(e) = self
            .decisive_step(shard_of(ino), op, 1, Step::RemoveDirIfEmpty { ino }, None)
            .await
        {
            return self.abort(op, &[], e).await;
        }
        self.step(home, op, 2, Step::UnlinkName { parent, name, ino })
            .await?;
        self.end_intent(op).await?;
        Ok(None)
    }

    /// A rename across shards, of `ino` (a `kind`) from `src` to `dst`
    /// (each a directory and a name): the target name is locked (step 1)
    /// and a directory it names removed when empty (step 2), then the new
    /// name is linked (3), the old one unlinked (4), a moved directory's
    /// parent set (5) and a replaced file's link dropped (6). Step 8
    /// releases the target name when the rename is rolled back or has
    /// nothing to do.
    async fn drive_rename(
        &self,
        op: OpId,
        aborting: bool,
        src: (Ino, String),
        dst: (Ino, String),
        ino: Ino,
        kind: FileKind,
    ) -> FsResult<Option<Attr>> {
        let home = shard_of(op);
        let ((src_parent, src_name), (dst_parent, dst_name)) = (src, dst);
        let dst_home = shard_of(dst_parent);
        let (existing, unlock_dst) = self
            .lock_target(op, aborting, "rename", dst_parent, &dst_name)
            .await?;
        if let Some(e) = &existing {
            if e.ino == ino {
                // Both names are links to one inode: POSIX does nothing.
                self.step(dst_home, op, 8, unlock_dst.1).await?;
                self.end_intent(op).await?;
                return Ok(None);
            }
            if let Err(err) = check_rename_kinds(kind, e.kind) {
                return self.abort(op, &[unlock_dst], err).await;
            }
            if e.kind == FileKind::Dir {
                if let Err(err) = self
                    .decisive_step(
                        shard_of(e.ino),
                        op,
                        2,
                        Step::RemoveDirIfEmpty { ino: e.ino },
                        None,
                    )
                    .await
                {
                    return self.abort(op, &[unlock_dst], err).await;
                }
            }
        }
        self.step(
            dst_home,
            op,
            3,
            Step::LinkName {
                parent: dst_parent,
                name: dst_name,
                ino,
                kind,
            },
        )
        .await?;
        self.step(
            home,
            op,
            4,
            Step::UnlinkName {
                parent: src_parent,
                name: src_name,
                ino,
            },
        )
        .await?;
        if kind == FileKind::Dir && src_parent != dst_parent {
            self.step(
                shard_of(ino),
                op,
                5,
                Step::SetDirParent {
                    ino,
                    parent: dst_parent,
                },
            )
            .await?;
        }
        let mut touched = vec![dst_home, shard_of(ino)];
        if let Some(e) = existing.clone().filter(|e| e.kind != FileKind::Dir) {
            self.step(shard_of(e.ino), op, 6, Step::DropLink { ino: e.ino })
                .await?;
            touched.push(shard_of(e.ino));
        } else if let Some(e) = &existing {
            touched.push(shard_of(e.ino));
        }
        self.end_intent(op).await?;
        Ok(None)
    }

    /// An exchange of what `a` and `b` name (each a directory and a name;
    /// `a`'s inode is `ino`, a `kind`): `b`'s name is locked (step 1; it
    /// must exist), then each name is pointed at the other's inode (3 and
    /// 4, which release the names), and directories that moved between
    /// directories get their new parent (5, 6). Step 8 releases `b`'s name
    /// when the exchange is rolled back or has nothing to do.
    async fn drive_exchange(
        &self,
        op: OpId,
        aborting: bool,
        a: (Ino, String),
        b: (Ino, String),
        (ino, kind): (Ino, FileKind),
    ) -> FsResult<Option<Attr>> {
        let ((a_parent, a_name), (b_parent, b_name)) = (a, b);
        let b_home = shard_of(b_parent);
        let (other, unlock_b) = self
            .lock_target(op, aborting, "exchange", b_parent, &b_name)
            .await?;
        let Some(other) = other else {
            let missing = FsError::NotFound(b_name.clone());
            return self.abort(op, &[unlock_b], missing).await;
        };
        if other.ino == ino {
            self.step(b_home, op, 8, unlock_b.1).await?;
            self.end_intent(op).await?;
            return Ok(None);
        }
        let to_a = Step::LinkName {
            parent: b_parent,
            name: b_name,
            ino,
            kind,
        };
        self.step(b_home, op, 3, to_a).await?;
        let to_b = Step::LinkName {
            parent: a_parent,
            name: a_name,
            ino: other.ino,
            kind: other.kind,
        };
        self.step(shard_of(op), op, 4, to_b).await?;
        if a_parent != b_parent {
            if kind == FileKind::Dir {
                let moved = Step::SetDirParent {
                    ino,
                    parent: b_parent,
                };
                self.step(shard_of(ino), op, 5, moved).await?;
            }
            if other.kind == FileKind::Dir {
                let moved = Step::SetDirParent {
                    ino: other.ino,
                    parent: a_parent,
                };
                self.step(shard_of(other.ino), op, 6, moved).await?;
            }
        }
        self.end_intent(op).await?;
        Ok(None)
    }

    /// The start of a rename or exchange (`what`): the operation is rolled
    /// back when `aborting`; otherwise the target name `parent`/`name` is
    /// reserved (step 1, decisive; a name another operation holds, which
    /// may wait for this one's source name, is waited for a random while
    /// before stepping back). Returns what the name holds and the step that
    /// releases it (step 8); an error ends the operation.
    async fn lock_target(
        &self,
        op: OpId,
        aborting: bool,
        what: &str,
        parent: Ino,
        name: &str,
    ) -> FsResult<(Option<DirEntry>, (ShardId, Step))> {
        let home = shard_of(parent);
        let unlock = Step::UnlockName {
            parent,
            name: name.to_string(),
        };
        if aborting {
            self.step(home, op, 8, unlock).await?;
            self.end_intent(op).await?;
            return Err(FsError::Io(format!("{what} was rolled back")));
        }
        let busy_until = Instant::now() + rand::thread_rng().gen_range(LOCK_WAIT);
        let lock = Step::LockName {
            parent,
            name: name.to_string(),
        };
        match self
            .decisive_step(home, op, 1, lock, Some(busy_until))
            .await
        {
            Ok(StepResult::Existing(e)) => Ok((e, (home, unlock))),
            Ok(other) => Err(FsError::Corrupt(format!(
                "{what} step 1 returned {other:?}"
            ))),
            Err(e) => self.abort(op, &[], e).await,
        }
    }

    /// A step before the irreversible one, after which the operation goes
    /// on or is rolled back: its failure is recorded for every driver of
    /// the operation ([`Step::Refuse`]), so that all of them choose alike
    /// (a driver that found a directory not empty, or stopped waiting for
    /// a name, never rolls back what another finishes). `busy_until`
    /// bounds the wait for a name another operation holds
    /// ([`Self::step_waiting`]).
    async fn decisive_step(
        &self,
        shard: ShardId,
        op: OpId,
        step_no: u8,
        step: Step,
        busy_until: Option<Instant>,
    ) -> FsResult<StepResult> {
        let tried = self
            .step_waiting(shard, op, step_no, step, busy_until)
            .await;
        let result = match tried {
            Ok(result) => result,
            Err(error) => {
                self.step(shard, op, step_no, Step::Refuse { error })
                    .await?
            }
        };
        match result {
            StepResult::Refused(error) => Err(error),
            other => Ok(other),
        }
    }

    /// Rolls an intent back before anything irreversible happened: mark it,
    /// release names on other shards, then end it. Returns `error`.
    async fn abort<T>(&self, op: OpId, unlocks: &[(ShardId, Step)], error: FsError) -> FsResult<T> {
        self.abort_intent(op).await?;
        for (shard, step) in unlocks {
            self.step(*shard, op, 8, step.clone()).await?;
        }
        self.end_intent(op).await?;
        Err(error)
    }

    /// Drives every intent recorded in `shard` (after it started). Returns how many.
    pub async fn redrive(&self, shard: ShardId) -> FsResult<usize> {
        self.redrive_older(shard, std::time::Duration::ZERO).await
    }

    /// [`Self::redrive`] of the intents recorded at least `age` ago: those
    /// whose coordinator gave up (its calls timed out, or its node died
    /// without the shard changing leader) would otherwise hold their names
    /// until the next change of leader.
    pub async fn redrive_older(&self, shard: ShardId, age: std::time::Duration) -> FsResult<usize> {
        let cutoff = curvine_messages::now_ns() - age.as_nanos() as i64;
        let intents: Vec<_> = self
            .call_until(shard, None, None, |reply| ShardMsg::ListIntents { reply })
            .await?
            .into_iter()
            .filter(|i| i.created_ns <= cutoff)
            .collect();
        let count = intents.len();
        // All at once: one may wait for another (an rmdir answered Busy
        // until a mkdir into the directory finishes).
        let drives = intents.into_iter().map(|intent| async move {
            let op = intent.op;
            let action = format!("{:?}", intent.action);
            tracing::info!(shard, op = format!("{op:#x}"), action, "re-driving intent");
            match self.drive(intent).await {
                Ok(_) => tracing::info!(
                    shard,
                    op = format!("{op:#x}"),
                    "re-drove intent to completion"
                ),
                Err(e) => {
                    tracing::info!(shard, op = format!("{op:#x}"), outcome = %e, "re-drove intent (rolled back, or not finished)")
                }
            }
        });
        futures::future::join_all(drives).await;
        Ok(count)
    }
}

/// The first of several futures to finish.
async fn futures_select_all<F: std::future::Future + Unpin>(futures: Vec<F>) -> F::Output {
    let mut futures = futures;
    std::future::poll_fn(move |cx| {
        for f in futures.iter_mut() {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(f).poll(cx) {
                return std::task::Poll::Ready(out);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

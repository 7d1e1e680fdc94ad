//! Conformance suite of the shard store, on real LMDB environments. Every
//! case runs twice: with one environment per shard and with both shards in
//! one shared environment (the two `meta.layout`s).

use std::sync::Arc;
use std::time::Duration;

use curvine_actors::engine::Engine;
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions, MAX_LINKS};
use curvine_actors::txn::WriteTxn;
use curvine_actors::writer::Writer;
use curvine_messages::block::{BlockInfo, BlockUse, FileSpec, WriteLease};
use curvine_messages::cluster::ClusterMap;
use curvine_messages::shard::{
    IntentOp, NewFile, OpenForWrite, RenameOutcome, Step, StepResult, UnlinkOutcome,
};
use curvine_messages::{
    make_id, now_ns, shard_of, Attr, FileKind, FsError, FsResult, NewInode, XattrMode, ROOT_INO,
};

struct Fixture {
    _dir: tempfile::TempDir,
    shards: Vec<Arc<ShardStore>>,
}

fn options() -> StoreOptions {
    StoreOptions {
        map_size: 64 << 20,
        max_readers: 32,
        sync_commit: true,
        wal: true,
        wal_size: 1 << 20,
        checkpoint_interval: Duration::from_millis(500),
        replica_id: 1,
    }
}

fn identity(shard: u16) -> ShardIdentity {
    ShardIdentity {
        cluster_id: "c1".into(),
        shard,
        shard_count: 2,
    }
}

fn fixture(shared: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let shared_engine = shared.then(|| Engine::open(&dir.path().join("meta"), &options()).unwrap());
    let shards = (0..2u16)
        .map(|s| {
            let engine = match &shared_engine {
                Some(engine) => engine.clone(),
                None => Engine::open(&dir.path().join(format!("s{s}")), &options()).unwrap(),
            };
            Arc::new(ShardStore::open(&engine, &identity(s)).unwrap())
        })
        .collect();
    Fixture { _dir: dir, shards }
}

impl Fixture {
    fn write<T>(
        &self,
        shard: usize,
        f: impl FnOnce(&ShardStore, &mut WriteTxn) -> FsResult<T>,
    ) -> FsResult<T> {
        self.shards[shard].write_now(f)
    }

    fn read<T>(
        &self,
        shard: usize,
        f: impl FnOnce(&ShardStore, &heed::RoTxn) -> FsResult<T>,
    ) -> FsResult<T> {
        let store = &self.shards[shard];
        let txn = store.read_txn().unwrap();
        f(store, &txn)
    }
}

fn file() -> NewInode {
    NewInode {
        kind: FileKind::File,
        mode: 0o644,
        uid: 1,
        gid: 2,
        symlink: None,
        now_ns: now_ns(),
    }
}

fn dir() -> NewInode {
    NewInode {
        kind: FileKind::Dir,
        ..file()
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod per_shard_env {
            $(#[test] fn $name() { super::$name(super::fixture(false)); })*
        }
        mod shared_env {
            $(#[test] fn $name() { super::$name(super::fixture(true)); })*
        }
    };
}

conformance!(
    formats_root_and_keeps_counters_across_reopen,
    create_rules,
    mkdir_and_rmdir_keep_link_counts,
    unlink_rules_and_remote_inodes,
    hard_links_in_a_shard_and_across_shards,
    a_file_has_at_most_max_links_names,
    rename_local_rules,
    steps_are_idempotent_and_locks_hold_names,
    a_refused_step_is_refused_for_every_driver,
    xattr_rules,
    stats_and_scan_see_only_their_shard,
    file_blocks_lease_commit_and_free,
    a_shard_moves_to_another_store_whole,
    answers_of_calls_are_kept_per_shard_and_expire,
);

fn formats_root_and_keeps_counters_across_reopen(f: Fixture) {
    let root = f.read(0, |s, t| s.getattr(t, ROOT_INO)).unwrap();
    assert_eq!(
        (root.kind, root.nlink, root.parent),
        (FileKind::Dir, 2, ROOT_INO)
    );
    assert!(matches!(
        f.read(1, |s, t| s.getattr(t, ROOT_INO)),
        Err(FsError::NotFound(_))
    ));
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    assert_eq!(shard_of(a.ino), 0);
    // Reopening the same path (as a restarted shard does) sees the same data
    // and allocates fresh ids.
    let engine = f.shards[0].engine().clone();
    let again = ShardStore::open(&engine, &identity(0)).unwrap();
    let txn = again.read_txn().unwrap();
    assert_eq!(again.lookup(&txn, ROOT_INO, "a").unwrap().ino, a.ino);
    drop(txn);
    let b = again
        .write_now(|s, w| s.create(w, ROOT_INO, "b", &file(), None))
        .unwrap();
    assert!(b.ino > a.ino);
    // Another cluster's identity is refused, naming both.
    let other = ShardIdentity {
        cluster_id: "c2".into(),
        ..identity(0)
    };
    let err = ShardStore::open(&engine, &other).err().unwrap().to_string();
    assert!(
        err.contains("cluster c1") && err.contains("cluster c2"),
        "{err}"
    );
}

fn create_rules(f: Fixture) {
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    assert_eq!(
        (a.kind, a.nlink, a.mode, a.uid, a.gid),
        (FileKind::File, 1, 0o644, 1, 2)
    );
    assert!(matches!(
        f.write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None)),
        Err(FsError::AlreadyExists(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.create(t, a.ino, "x", &file(), None)),
        Err(FsError::NotADirectory(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.create(t, make_id(0, 999), "x", &file(), None)),
        Err(FsError::NotFound(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.create(t, ROOT_INO, "d", &dir(), None)),
        Err(FsError::InvalidArgument(_))
    ));
    let link = NewInode {
        kind: FileKind::Symlink,
        symlink: Some("/t".into()),
        ..file()
    };
    let l = f
        .write(0, |s, t| s.create(t, ROOT_INO, "l", &link, None))
        .unwrap();
    assert_eq!((l.size, l.symlink.as_deref()), (2, Some("/t")));
    let root = f.read(0, |s, t| s.getattr(t, ROOT_INO)).unwrap();
    assert!(root.mtime_ns >= a.mtime_ns);
    let names: Vec<String> = f
        .read(0, |s, t| s.readdir(t, ROOT_INO, None, 10))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a", "l"]);
    let after: Vec<String> = f
        .read(0, |s, t| s.readdir(t, ROOT_INO, Some("a"), 10))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(after, ["l"]);
}

fn mkdir_and_rmdir_keep_link_counts(f: Fixture) {
    let d = f
        .write(0, |s, t| s.mkdir_local(t, ROOT_INO, "d", &dir()))
        .unwrap();
    assert_eq!((d.nlink, d.parent), (2, ROOT_INO));
    assert_eq!(f.read(0, |s, t| s.getattr(t, ROOT_INO)).unwrap().nlink, 3);
    f.write(0, |s, t| s.create(t, d.ino, "f", &file(), None))
        .unwrap();
    assert!(matches!(
        f.write(0, |s, t| s.rmdir_local(t, ROOT_INO, "d")),
        Err(FsError::NotEmpty(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.unlink(t, ROOT_INO, "d")),
        Err(FsError::IsADirectory(_))
    ));
    f.write(0, |s, t| s.unlink(t, d.ino, "f")).unwrap();
    // A name in it held by a mkdir across shards not yet finished: the
    // directory is not removed under it (the mkdir's name would have no
    // directory to go in), and the caller may retry.
    let pending = f
        .write(0, |s, t| {
            s.begin_intent(
                t,
                &IntentOp::Mkdir {
                    parent: d.ino,
                    name: "y".into(),
                    attrs: dir(),
                    child_shard: 1,
                },
            )
        })
        .unwrap();
    match f.write(0, |s, t| s.rmdir_local(t, ROOT_INO, "d")) {
        Err(e @ FsError::Busy(_)) => assert!(e.is_retryable()),
        other => panic!("removed a directory with a name held in it: {other:?}"),
    }
    // The operation holding the name is not kept out by its own hold (a
    // rename of a directory's entry over the directory itself).
    f.write(0, |s, t| {
        s.apply_step(t, pending.op, 3, &Step::RemoveDirIfEmpty { ino: d.ino })
    })
    .unwrap();
    f.write(0, |s, t| {
        s.apply_step(
            t,
            pending.op,
            4,
            &Step::UnlinkName {
                parent: ROOT_INO,
                name: "d".into(),
                ino: d.ino,
            },
        )
    })
    .unwrap();
    f.write(0, |s, t| s.end_intent(t, pending.op)).unwrap();
    assert_eq!(f.read(0, |s, t| s.getattr(t, ROOT_INO)).unwrap().nlink, 2);
    assert!(matches!(
        f.read(0, |s, t| s.getattr(t, d.ino)),
        Err(FsError::NotFound(_))
    ));
    f.write(0, |s, t| s.create(t, ROOT_INO, "file", &file(), None))
        .unwrap();
    assert!(matches!(
        f.write(0, |s, t| s.rmdir_local(t, ROOT_INO, "file")),
        Err(FsError::NotADirectory(_))
    ));
}

fn unlink_rules_and_remote_inodes(f: Fixture) {
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    assert!(matches!(
        f.write(0, |s, t| s.unlink(t, ROOT_INO, "a")),
        Ok(UnlinkOutcome::Done(_))
    ));
    assert!(f.read(0, |s, t| s.inode(t, a.ino)).unwrap().is_none());
    assert!(matches!(
        f.write(0, |s, t| s.unlink(t, ROOT_INO, "a")),
        Err(FsError::NotFound(_))
    ));
    // An entry whose inode lives on shard 1 (a directory of shard 1 moved a
    // file here): unlink removes the entry and records the remote drop.
    let sub = f
        .write(0, |s, t| {
            s.begin_intent(
                t,
                &IntentOp::Mkdir {
                    parent: ROOT_INO,
                    name: "sub".into(),
                    attrs: dir(),
                    child_shard: 1,
                },
            )
        })
        .unwrap();
    let created = f
        .write(1, |s, t| {
            s.apply_step(
                t,
                sub.op,
                1,
                &Step::CreateDirInode {
                    attrs: dir(),
                    parent: ROOT_INO,
                },
            )
        })
        .unwrap();
    let StepResult::Created(sub_dir) = created else {
        panic!("{created:?}")
    };
    f.write(0, |s, t| {
        s.apply_step(
            t,
            sub.op,
            2,
            &Step::LinkName {
                parent: ROOT_INO,
                name: "sub".into(),
                ino: sub_dir.ino,
                kind: FileKind::Dir,
            },
        )
    })
    .unwrap();
    f.write(0, |s, t| s.end_intent(t, sub.op)).unwrap();
    let remote = f
        .write(1, |s, t| s.create(t, sub_dir.ino, "r", &file(), None))
        .unwrap();
    let mv = f
        .write(1, |s, t| {
            s.begin_intent(
                t,
                &IntentOp::Rename {
                    src_parent: sub_dir.ino,
                    src_name: "r".into(),
                    dst_parent: ROOT_INO,
                    dst_name: "r".into(),
                    ino: 0,
                    kind: FileKind::File,
                },
            )
        })
        .unwrap();
    f.write(0, |s, t| {
        s.apply_step(
            t,
            mv.op,
            1,
            &Step::LockName {
                parent: ROOT_INO,
                name: "r".into(),
            },
        )
    })
    .unwrap();
    f.write(0, |s, t| {
        s.apply_step(
            t,
            mv.op,
            3,
            &Step::LinkName {
                parent: ROOT_INO,
                name: "r".into(),
                ino: remote.ino,
                kind: FileKind::File,
            },
        )
    })
    .unwrap();
    f.write(1, |s, t| {
        s.apply_step(
            t,
            mv.op,
            4,
            &Step::UnlinkName {
                parent: sub_dir.ino,
                name: "r".into(),
                ino: remote.ino,
            },
        )
    })
    .unwrap();
    f.write(1, |s, t| s.end_intent(t, mv.op)).unwrap();
    match f.write(0, |s, t| s.unlink(t, ROOT_INO, "r")).unwrap() {
        UnlinkOutcome::Pending(entry, intent) => {
            assert_eq!(entry.ino, remote.ino);
            assert_eq!(intent.action, IntentOp::DropLink { ino: remote.ino });
            f.write(1, |s, t| {
                s.apply_step(t, intent.op, 1, &Step::DropLink { ino: remote.ino })
            })
            .unwrap();
            f.write(0, |s, t| s.end_intent(t, intent.op)).unwrap();
        }
        other => panic!("expected a pending drop, got {other:?}"),
    }
    assert!(f.read(1, |s, t| s.inode(t, remote.ino)).unwrap().is_none());
    assert!(f.read(0, |s, t| s.intents(t)).unwrap().is_empty());
}

fn hard_links_in_a_shard_and_across_shards(f: Fixture) {
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    // In one shard: one commit.
    let linked = f
        .write(0, |s, t| s.link_local(t, a.ino, ROOT_INO, "b"))
        .unwrap()
        .expect("both here");
    assert_eq!(linked.nlink, 2);
    assert!(linked.ctime_ns >= a.ctime_ns);
    assert!(matches!(
        f.write(0, |s, t| s.link_local(t, a.ino, ROOT_INO, "b")),
        Err(FsError::AlreadyExists(_))
    ));
    let d = f
        .write(0, |s, t| s.mkdir_local(t, ROOT_INO, "d", &dir()))
        .unwrap();
    assert!(matches!(
        f.write(0, |s, t| s.link_local(t, d.ino, ROOT_INO, "d2")),
        Err(FsError::NotPermitted(_))
    ));
    // Unlink of one name keeps the inode for the other.
    f.write(0, |s, t| s.unlink(t, ROOT_INO, "a")).unwrap();
    assert_eq!(f.read(0, |s, t| s.getattr(t, a.ino)).unwrap().nlink, 1);
    // A directory of shard 1 cannot link an inode of shard 0 in one
    // commit: nothing changes, the caller runs an intent.
    let made = f
        .write(1, |s, t| {
            s.apply_step(
                t,
                make_id(1, 9_999),
                1,
                &Step::CreateDirInode {
                    attrs: dir(),
                    parent: ROOT_INO,
                },
            )
        })
        .unwrap();
    let StepResult::Created(remote_dir) = made else {
        panic!("{made:?}")
    };
    assert_eq!(
        f.write(1, |s, t| s.link_local(t, a.ino, remote_dir.ino, "x"))
            .unwrap(),
        None
    );
    assert_eq!(f.read(0, |s, t| s.getattr(t, a.ino)).unwrap().nlink, 1);
    // The intent adds the link (step 1, applied once however often it is
    // driven), then the name.
    assert_eq!(
        f.write(0, |s, t| s.link_local(t, a.ino, ROOT_INO, "c"))
            .unwrap()
            .map(|a| a.nlink),
        Some(2)
    );
    let op = f
        .write(0, |s, t| {
            s.begin_intent(
                t,
                &IntentOp::Link {
                    parent: ROOT_INO,
                    name: "e".into(),
                    ino: a.ino,
                },
            )
        })
        .unwrap();
    assert!(matches!(
        f.write(0, |s, t| s.begin_intent(
            t,
            &IntentOp::Link {
                parent: ROOT_INO,
                name: "e".into(),
                ino: a.ino,
            },
        )),
        Err(FsError::Busy(_))
    ));
    for _ in 0..2 {
        let added = f
            .write(0, |s, t| {
                s.apply_step(t, op.op, 1, &Step::AddLink { ino: a.ino })
            })
            .unwrap();
        let StepResult::Created(attr) = added else {
            panic!("{added:?}")
        };
        assert_eq!(attr.nlink, 3);
    }
    f.write(0, |s, t| {
        s.apply_step(
            t,
            op.op,
            2,
            &Step::LinkName {
                parent: ROOT_INO,
                name: "e".into(),
                ino: a.ino,
                kind: FileKind::File,
            },
        )
    })
    .unwrap();
    f.write(0, |s, t| s.end_intent(t, op.op)).unwrap();
    assert_eq!(f.read(0, |s, t| s.getattr(t, a.ino)).unwrap().nlink, 3);
    // The last name takes the inode with it.
    for name in ["b", "c", "e"] {
        f.write(0, |s, t| s.unlink(t, ROOT_INO, name)).unwrap();
    }
    assert!(f.read(0, |s, t| s.inode(t, a.ino)).unwrap().is_none());
}

/// LINK_MAX: a file has at most `MAX_LINKS` names, then `link` answers
/// EMLINK (LinkLimit), in one shard and through an intent's step.
fn a_file_has_at_most_max_links_names(f: Fixture) {
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    let last = f
        .write(0, |s, t| {
            let mut last = None;
            for i in 1..MAX_LINKS {
                last = s.link_local(t, a.ino, ROOT_INO, &format!("l{i}"))?;
            }
            Ok(last)
        })
        .unwrap()
        .expect("both here");
    assert_eq!(last.nlink, MAX_LINKS);
    assert!(matches!(
        f.write(0, |s, t| s.link_local(t, a.ino, ROOT_INO, "one-more")),
        Err(FsError::LinkLimit(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.apply_step(
            t,
            make_id(0, 9_998),
            1,
            &Step::AddLink { ino: a.ino }
        )),
        Err(FsError::LinkLimit(_))
    ));
    assert!(f
        .read(0, |s, t| s.dentry(t, ROOT_INO, "one-more"))
        .unwrap()
        .is_none());
    // One name gone, one may come.
    f.write(0, |s, t| s.unlink(t, ROOT_INO, "l1")).unwrap();
    f.write(0, |s, t| s.link_local(t, a.ino, ROOT_INO, "one-more"))
        .unwrap();
    assert_eq!(
        f.read(0, |s, t| s.getattr(t, a.ino)).unwrap().nlink,
        MAX_LINKS
    );
}

fn rename_local_rules(f: Fixture) {
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    let b = f
        .write(0, |s, t| s.create(t, ROOT_INO, "b", &file(), None))
        .unwrap();
    let d = f
        .write(0, |s, t| s.mkdir_local(t, ROOT_INO, "d", &dir()))
        .unwrap();
    let e = f
        .write(0, |s, t| s.mkdir_local(t, ROOT_INO, "e", &dir()))
        .unwrap();
    let rename =
        |src: &str, dst: &str| f.write(0, |s, t| s.rename_local(t, ROOT_INO, src, ROOT_INO, dst));
    assert!(matches!(rename("a", "d"), Err(FsError::IsADirectory(_))));
    assert!(matches!(rename("d", "a"), Err(FsError::NotADirectory(_))));
    assert!(matches!(rename("missing", "x"), Err(FsError::NotFound(_))));
    // A file replaces a file: the replaced inode goes.
    assert_eq!(rename("a", "b").unwrap(), RenameOutcome::Done);
    assert!(f.read(0, |s, t| s.inode(t, b.ino)).unwrap().is_none());
    assert_eq!(
        f.read(0, |s, t| s.lookup(t, ROOT_INO, "b")).unwrap().ino,
        a.ino
    );
    // A directory replaces an empty directory, not a full one.
    f.write(0, |s, t| s.create(t, e.ino, "inside", &file(), None))
        .unwrap();
    assert!(matches!(rename("d", "e"), Err(FsError::NotEmpty(_))));
    f.write(0, |s, t| s.unlink(t, e.ino, "inside")).unwrap();
    assert_eq!(rename("d", "e").unwrap(), RenameOutcome::Done);
    assert!(f.read(0, |s, t| s.inode(t, e.ino)).unwrap().is_none());
    assert_eq!(f.read(0, |s, t| s.getattr(t, ROOT_INO)).unwrap().nlink, 3);
    // Moving a directory into another local directory updates '..' and links.
    let g = f
        .write(0, |s, t| s.mkdir_local(t, ROOT_INO, "g", &dir()))
        .unwrap();
    assert_eq!(
        f.write(0, |s, t| s.rename_local(t, ROOT_INO, "e", g.ino, "moved"))
            .unwrap(),
        RenameOutcome::Done
    );
    assert_eq!(f.read(0, |s, t| s.getattr(t, d.ino)).unwrap().parent, g.ino);
    assert_eq!(f.read(0, |s, t| s.getattr(t, g.ino)).unwrap().nlink, 3);
    assert_eq!(f.read(0, |s, t| s.getattr(t, ROOT_INO)).unwrap().nlink, 3);
    // Renaming onto itself does nothing.
    assert_eq!(rename("b", "b").unwrap(), RenameOutcome::Done);
}

fn steps_are_idempotent_and_locks_hold_names(f: Fixture) {
    let intent = f
        .write(0, |s, t| {
            s.begin_intent(
                t,
                &IntentOp::Mkdir {
                    parent: ROOT_INO,
                    name: "x".into(),
                    attrs: dir(),
                    child_shard: 1,
                },
            )
        })
        .unwrap();
    // The name is reserved: other operations on it wait.
    assert!(matches!(
        f.write(0, |s, t| s.create(t, ROOT_INO, "x", &file(), None)),
        Err(FsError::Busy(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.begin_intent(
            t,
            &IntentOp::Mkdir {
                parent: ROOT_INO,
                name: "x".into(),
                attrs: dir(),
                child_shard: 1
            }
        )),
        Err(FsError::Busy(_))
    ));
    let step = Step::CreateDirInode {
        attrs: dir(),
        parent: ROOT_INO,
    };
    let first = f
        .write(1, |s, t| s.apply_step(t, intent.op, 1, &step))
        .unwrap();
    let again = f
        .write(1, |s, t| s.apply_step(t, intent.op, 1, &step))
        .unwrap();
    assert_eq!(first, again, "a repeated step returns its recorded result");
    let StepResult::Created(attr): StepResult = first else {
        panic!()
    };
    assert_eq!(
        f.read(1, |s, t| s.scan(t)).unwrap().inodes.len(),
        1,
        "created once"
    );
    assert_eq!(
        f.read(0, |s, t| s.intents(t)).unwrap(),
        vec![intent.clone()]
    );
    f.write(0, |s, t| {
        s.apply_step(
            t,
            intent.op,
            2,
            &Step::LinkName {
                parent: ROOT_INO,
                name: "x".into(),
                ino: attr.ino,
                kind: FileKind::Dir,
            },
        )
    })
    .unwrap();
    f.write(0, |s, t| s.end_intent(t, intent.op)).unwrap();
    assert!(f.read(0, |s, t| s.intents(t)).unwrap().is_empty());
    assert_eq!(f.read(0, |s, t| s.stats(t)).unwrap().locks, 0);
    assert_eq!(
        f.read(0, |s, t| s.lookup(t, ROOT_INO, "x")).unwrap().ino,
        attr.ino
    );
    // A step that arrives after the operation ended (a second driver that
    // was retrying it) returns what it did the first time: no second inode.
    let late = f
        .write(1, |s, t| s.apply_step(t, intent.op, 1, &step))
        .unwrap();
    assert_eq!(late, StepResult::Created(attr.clone()));
    assert_eq!(f.read(1, |s, t| s.scan(t)).unwrap().inodes.len(), 1);
    // Step records are swept once old, and only when their intent is gone.
    let held = f
        .write(0, |s, t| {
            s.begin_intent(
                t,
                &IntentOp::Rmdir {
                    parent: ROOT_INO,
                    name: "x".into(),
                    ino: 0,
                },
            )
        })
        .unwrap();
    f.write(1, |s, t| {
        s.apply_step(
            t,
            held.op,
            1,
            &Step::SetDirParent {
                ino: attr.ino,
                parent: ROOT_INO,
            },
        )
    })
    .unwrap();
    let swept = f
        .write(1, |s, t| s.sweep_op_records(t, now_ns() + 1))
        .unwrap();
    // With one environment per shard: the finished operation's step 1 and
    // the held one's (its intent is in the other environment). With one
    // environment for both: the finished operation's two steps (the step
    // table is the environment's), while the held one's stays.
    assert_eq!(swept, 2);
    let kept = f
        .write(1, |s, t| s.sweep_op_records(t, now_ns() + 1))
        .unwrap();
    assert_eq!(
        kept, 0,
        "the held operation's record stays where its intent is seen"
    );
}

/// A step refused by one driver of an operation is refused for all: a
/// later driver cannot apply it. A step applied first stays applied, and
/// the refusal returns what it did.
fn a_refused_step_is_refused_for_every_driver(f: Fixture) {
    let begin = |name: &str| {
        let action = IntentOp::Mkdir {
            parent: ROOT_INO,
            name: name.into(),
            attrs: dir(),
            child_shard: 1,
        };
        f.write(0, |s, t| s.begin_intent(t, &action)).unwrap()
    };
    let (refused, applied) = (begin("p"), begin("q"));
    let lock = |name: &str| Step::LockName {
        parent: ROOT_INO,
        name: name.into(),
    };
    let refuse = Step::Refuse {
        error: FsError::NotEmpty(String::new()),
    };
    let first = f
        .write(0, |s, t| s.apply_step(t, refused.op, 5, &refuse))
        .unwrap();
    assert_eq!(first, StepResult::Refused(FsError::NotEmpty(String::new())));
    let late = f
        .write(0, |s, t| s.apply_step(t, refused.op, 5, &lock("r")))
        .unwrap();
    assert_eq!(late, first, "the refused step is not applied afterwards");
    let locks = || f.read(0, |s, t| s.stats(t)).unwrap().locks;
    assert_eq!(locks(), 2, "only the intents' own names are held");
    let locked = f
        .write(0, |s, t| s.apply_step(t, applied.op, 5, &lock("s")))
        .unwrap();
    assert_eq!(locked, StepResult::Existing(None));
    let refusal = f
        .write(0, |s, t| s.apply_step(t, applied.op, 5, &refuse))
        .unwrap();
    assert_eq!(refusal, locked, "a step applied first stays applied");
    assert_eq!(locks(), 3, "'s' stays held");
    // Rolling back an operation another driver already ended is no error.
    f.write(0, |s, t| s.abort_intent(t, refused.op)).unwrap();
    f.write(0, |s, t| s.end_intent(t, refused.op)).unwrap();
    f.write(0, |s, t| s.abort_intent(t, refused.op)).unwrap();
}

fn xattr_rules(f: Fixture) {
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    f.write(0, |s, t| {
        s.set_xattr(t, a.ino, "user.k", b"v1", XattrMode::Any)
    })
    .unwrap();
    assert!(matches!(
        f.write(0, |s, t| s.set_xattr(
            t,
            a.ino,
            "user.k",
            b"v2",
            XattrMode::Create
        )),
        Err(FsError::AlreadyExists(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.set_xattr(
            t,
            a.ino,
            "user.n",
            b"v",
            XattrMode::Replace
        )),
        Err(FsError::NoData(_))
    ));
    f.write(0, |s, t| {
        s.set_xattr(t, a.ino, "user.k", b"v2", XattrMode::Replace)
    })
    .unwrap();
    f.write(0, |s, t| {
        s.set_xattr(t, a.ino, "user.a", b"", XattrMode::Any)
    })
    .unwrap();
    assert_eq!(
        f.read(0, |s, t| s.get_xattr(t, a.ino, "user.k")).unwrap(),
        b"v2"
    );
    assert_eq!(
        f.read(0, |s, t| s.list_xattr(t, a.ino)).unwrap(),
        ["user.a", "user.k"]
    );
    let big = vec![0u8; 64 * 1024 + 1];
    assert!(matches!(
        f.write(0, |s, t| s.set_xattr(
            t,
            a.ino,
            "user.big",
            &big,
            XattrMode::Any
        )),
        Err(FsError::TooBig(_))
    ));
    let long = "n".repeat(256);
    assert!(matches!(
        f.write(0, |s, t| s.set_xattr(t, a.ino, &long, b"", XattrMode::Any)),
        Err(FsError::NameTooLong(_))
    ));
    f.write(0, |s, t| s.remove_xattr(t, a.ino, "user.k"))
        .unwrap();
    assert!(matches!(
        f.write(0, |s, t| s.remove_xattr(t, a.ino, "user.k")),
        Err(FsError::NoData(_))
    ));
    // Attributes go with their inode.
    f.write(0, |s, t| s.unlink(t, ROOT_INO, "a")).unwrap();
    let b = f
        .write(0, |s, t| s.create(t, ROOT_INO, "b", &file(), None))
        .unwrap();
    assert!(f.read(0, |s, t| s.list_xattr(t, b.ino)).unwrap().is_empty());
    assert!(matches!(
        f.read(0, |s, t| s.list_xattr(t, a.ino)),
        Err(FsError::NotFound(_))
    ));
}

fn stats_and_scan_see_only_their_shard(f: Fixture) {
    f.write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), None))
        .unwrap();
    let d = f
        .write(0, |s, t| s.mkdir_local(t, ROOT_INO, "d", &dir()))
        .unwrap();
    let _ = d;
    let s0 = f.read(0, |s, t| s.stats(t)).unwrap();
    let s1 = f.read(1, |s, t| s.stats(t)).unwrap();
    assert_eq!((s0.inodes, s0.dentries), (3, 2));
    assert_eq!((s1.inodes, s1.dentries), (0, 0));
    let scan: Vec<Attr> = f.read(1, |s, t| s.scan(t)).unwrap().inodes;
    assert!(scan.is_empty());
}

fn answers_of_calls_are_kept_per_shard_and_expire(f: Fixture) {
    use curvine_messages::ReqId;
    let now = now_ns();
    let first = ReqId {
        at_ns: now,
        nonce: 7,
    };
    let a = f
        .write(0, |s, t| {
            let a = s.create(t, ROOT_INO, "a", &file(), None)?;
            s.record_answer(t, first, &a)?;
            Ok(a)
        })
        .unwrap();
    // The call made again finds its answer; another call, or the same
    // call id on another shard, finds none.
    assert_eq!(
        f.read(0, |s, t| s.answered::<Attr>(t, first)).unwrap(),
        Some(a.clone())
    );
    let other = ReqId {
        at_ns: now,
        nonce: 8,
    };
    assert_eq!(
        f.read(0, |s, t| s.answered::<Attr>(t, other)).unwrap(),
        None
    );
    assert_eq!(
        f.read(1, |s, t| s.answered::<Attr>(t, first)).unwrap(),
        None
    );
    // Answers are not step records, and go with their own shard only.
    assert_eq!(f.read(0, |s, t| s.scan(t)).unwrap().op_records, 0);
    assert_eq!(f.read(0, |s, t| s.answers_kept(t)).unwrap(), 1);
    assert_eq!(f.read(1, |s, t| s.answers_kept(t)).unwrap(), 0);
    let moved = f.read(0, |s, t| s.export_all(t)).unwrap();
    assert!(
        moved.iter().any(|r| r.table == 11 && r.key.len() == 21),
        "shard 0's export lacks its answer"
    );
    let others = f.read(1, |s, t| s.export_all(t)).unwrap();
    assert!(
        !others.iter().any(|r| r.table == 11),
        "shard 1's export carries shard 0's answer"
    );
    // The digest leaves answers out: members expire them on their own.
    let (_, with_answer) = f.read(0, |s, t| s.digest(t)).unwrap();
    let other_call = ReqId {
        at_ns: now,
        nonce: 11,
    };
    f.write(0, |s, t| s.record_answer(t, other_call, &3u32))
        .unwrap();
    assert_eq!(f.read(0, |s, t| s.digest(t)).unwrap().1, with_answer);
    // How long an answer is kept depends on no clock: a call whose node
    // is an hour behind, or a year ahead, is answered alike. Answers go
    // two generations later (the leader moves a shard's generation on once
    // it has seen it for the TTL: `AnswerAge`).
    let behind = ReqId {
        at_ns: now - 3_600_000_000_000,
        nonce: 9,
    };
    let ahead = ReqId {
        at_ns: now + 365 * 86_400_000_000_000,
        nonce: 10,
    };
    f.write(0, |s, t| s.record_answer(t, behind, &1u32))
        .unwrap();
    f.write(0, |s, t| s.record_answer(t, ahead, &5u32)).unwrap();
    f.write(1, |s, t| s.record_answer(t, behind, &4u32))
        .unwrap();
    // (Each environment expires the answers of all its shards.)
    let expire =
        |f: &Fixture| -> usize { f.shards.iter().map(|s| s.expire_answers().unwrap()).sum() };
    let shared = f.shards[0].same_env(&f.shards[1]);
    assert_eq!(expire(&f), 0, "nothing is old yet");
    let rotate = |f: &Fixture, shard: usize, expect: u32| -> u32 {
        f.write(shard, |s, t| s.rotate_answers(t, expect)).unwrap()
    };
    assert_eq!(rotate(&f, 0, 0), 1);
    assert_eq!(
        rotate(&f, 0, 0),
        1,
        "a rotation sent twice moves the generation once"
    );
    assert_eq!(expire(&f), 0);
    assert_eq!(
        f.read(0, |s, t| s.answered::<u32>(t, behind)).unwrap(),
        Some(1)
    );
    assert_eq!(
        f.read(0, |s, t| s.answered::<u32>(t, ahead)).unwrap(),
        Some(5)
    );
    // A call answered in generation 1 is found in generation 2 too.
    let later = ReqId {
        at_ns: now,
        nonce: 12,
    };
    f.write(0, |s, t| s.record_answer(t, later, &6u32)).unwrap();
    assert_eq!(rotate(&f, 0, 1), 2);
    // Shard 0's generation 0 goes, but not while its environment holds a
    // shard still at generation 0 (shard 1, in a shared environment).
    assert_eq!(expire(&f), if shared { 0 } else { 4 });
    assert_eq!(rotate(&f, 1, 0), 1);
    assert_eq!(rotate(&f, 1, 1), 2);
    assert_eq!(
        expire(&f),
        if shared { 5 } else { 1 },
        "generation 0 of both shards goes"
    );
    assert_eq!(
        f.read(0, |s, t| s.answered::<u32>(t, behind)).unwrap(),
        None
    );
    assert_eq!(f.read(0, |s, t| s.answered::<u32>(t, ahead)).unwrap(), None);
    assert_eq!(
        f.read(1, |s, t| s.answered::<u32>(t, behind)).unwrap(),
        None
    );
    assert_eq!(
        f.read(0, |s, t| s.answered::<u32>(t, later)).unwrap(),
        Some(6)
    );
    assert_eq!(f.read(0, |s, t| s.answers_kept(t)).unwrap(), 1);
    // The generation moves with the shard.
    let moved = f.read(0, |s, t| s.export_all(t)).unwrap();
    assert!(
        moved.iter().any(|r| r.table == 11 && r.key.len() == 5),
        "shard 0's export lacks its generation of answers"
    );
    // Dropping the shard drops its answers.
    f.write(0, |s, t| s.drop_all(t)).unwrap();
    assert_eq!(f.read(0, |s, t| s.answers_kept(t)).unwrap(), 0);
}

#[test]
fn group_commit_isolates_failing_and_panicking_mutations() {
    let f = fixture(true);
    let writer = Writer::for_store(&f.shards[0], 64, Duration::from_micros(200));
    let (tx, rx) = std::sync::mpsc::channel::<(usize, FsResult<()>)>();
    for i in 0..40usize {
        let store = f.shards[0].clone();
        let tx = tx.clone();
        writer.submit(
            move |txn| {
                match i % 10 {
                    // Fails after nothing was written.
                    3 => return Err(FsError::InvalidArgument("refused".into())),
                    // Panics after writing: must leave nothing.
                    7 => {
                        store.create(txn, ROOT_INO, &format!("p{i}"), &file(), None)?;
                        panic!("mutation {i} panics");
                    }
                    _ => {}
                }
                store
                    .create(txn, ROOT_INO, &format!("f{i}"), &file(), None)
                    .map(|_| ())
            },
            move |r| tx.send((i, r)).unwrap(),
        );
    }
    let mut results: Vec<(usize, FsResult<()>)> = (0..40)
        .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    results.sort_by_key(|(i, _)| *i);
    for (i, r) in &results {
        match i % 10 {
            3 => assert!(matches!(r, Err(FsError::InvalidArgument(_))), "{i}: {r:?}"),
            7 => assert!(matches!(r, Err(FsError::Io(_))), "{i}: {r:?}"),
            _ => assert!(r.is_ok(), "{i}: {r:?}"),
        }
    }
    let names: Vec<String> = f
        .read(0, |s, t| s.readdir(t, ROOT_INO, None, 100))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 32);
    assert!(names.iter().all(|n| n.starts_with('f')), "{names:?}");
}

fn lease(handle: u64) -> WriteLease {
    WriteLease {
        handle,
        client: format!("test:{handle}"),
        renewed_ns: now_ns(),
    }
}

fn info(id: u64, index: u32, len: u64) -> BlockInfo {
    BlockInfo {
        id,
        index,
        len,
        stored: len,
        crc: 7,
        locs: vec!["n1".into()],
    }
}

fn file_blocks_lease_commit_and_free(f: Fixture) {
    let spec = FileSpec {
        block_size: 1 << 20,
        replicas: 1,
        storage: None,
    };
    let new = NewFile {
        spec: spec.clone(),
        lease: Some(lease(1)),
    };
    let a = f
        .write(0, |s, t| s.create(t, ROOT_INO, "a", &file(), Some(&new)))
        .unwrap();
    assert_eq!(a.block_size, 1 << 20);
    assert!(a.writing.is_some());
    // Only the lease holder adds blocks; another writer is refused.
    assert!(matches!(
        f.write(0, |s, t| s.add_block(t, a.ino, 2, 0)),
        Err(FsError::InUse(_))
    ));
    assert!(matches!(
        f.write(0, |s, t| s.open_write(
            t,
            a.ino,
            &OpenForWrite {
                lease: lease(2),
                spec: spec.clone(),
                truncate: false,
                lease_timeout_ns: i64::MAX,
                first_block: None
            }
        )),
        Err(FsError::InUse(_))
    ));
    let b0 = f.write(0, |s, t| s.add_block(t, a.ino, 1, 0)).unwrap();
    let b1 = f.write(0, |s, t| s.add_block(t, a.ino, 1, 1)).unwrap();
    let unused = f.write(0, |s, t| s.add_block(t, a.ino, 1, 2)).unwrap();
    assert_eq!(shard_of(b0), 0);
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(t, &[b0, unused, 12345], ""))
            .unwrap(),
        vec![BlockUse::Pending, BlockUse::Pending, BlockUse::Unknown]
    );
    // Before the close nothing is visible.
    assert!(f
        .read(0, |s, t| s.file_blocks(t, a.ino))
        .unwrap()
        .is_empty());
    // A block claimed at the wrong index, or of another file, is refused.
    assert!(f
        .write(0, |s, t| s.complete_file(
            t,
            a.ino,
            1,
            10,
            &[info(b0, 1, 10)]
        ))
        .is_err());
    let size = (1 << 20) + 100;
    let done = f
        .write(0, |s, t| {
            s.complete_file(t, a.ino, 1, size, &[info(b0, 0, 1 << 20), info(b1, 1, 100)])
        })
        .unwrap();
    assert_eq!(done.size, size);
    assert!(done.writing.is_none());
    let (_, blocks) = f.read(0, |s, t| s.file_with_blocks(t, a.ino)).unwrap();
    assert_eq!(
        blocks.iter().map(|b| b.id).collect::<Vec<_>>(),
        vec![b0, b1]
    );
    // The unused allocation is freed; the committed blocks are live.
    let freed = f.read(0, |s, t| s.take_freed(t, 100)).unwrap();
    assert_eq!(freed.iter().map(|b| b.id).collect::<Vec<_>>(), vec![unused]);
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(t, &[b0, b1, unused], ""))
            .unwrap(),
        vec![BlockUse::Live, BlockUse::Live, BlockUse::Unknown]
    );
    f.write(0, |s, t| s.forget_freed(t, &[unused])).unwrap();
    // Truncating drops the blocks past the size and shortens the last one.
    let set = curvine_messages::SetAttr {
        size: Some(50),
        ..Default::default()
    };
    f.write(0, |s, t| s.setattr(t, a.ino, &set)).unwrap();
    let (_, blocks) = f.read(0, |s, t| s.file_with_blocks(t, a.ino)).unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!((blocks[0].len, blocks[0].stored), (50, 1 << 20));
    assert_eq!(f.read(0, |s, t| s.take_freed(t, 100)).unwrap()[0].id, b1);
    // The other shard sees none of it, even in a shared environment.
    assert!(f.read(1, |s, t| s.take_freed(t, 100)).unwrap().is_empty());
    // Removing the file frees its blocks.
    f.write(0, |s, t| s.unlink(t, ROOT_INO, "a")).unwrap();
    let mut ids: Vec<u64> = f
        .read(0, |s, t| s.take_freed(t, 100))
        .unwrap()
        .iter()
        .map(|b| b.id)
        .collect();
    ids.sort();
    assert_eq!(ids, vec![b0, b1]);
    // A lease is held while it is fresh; an expired one is taken over and
    // its uncommitted blocks go.
    let c = f
        .write(0, |s, t| {
            s.create(
                t,
                ROOT_INO,
                "c",
                &file(),
                Some(&NewFile {
                    spec: spec.clone(),
                    lease: Some(lease(5)),
                }),
            )
        })
        .unwrap();
    let stale = f.write(0, |s, t| s.add_block(t, c.ino, 5, 0)).unwrap();
    let taken = f.write(0, |s, t| {
        s.open_write(
            t,
            c.ino,
            &OpenForWrite {
                lease: lease(6),
                spec: spec.clone(),
                truncate: true,
                lease_timeout_ns: 1_000_000_000,
                first_block: None,
            },
        )
    });
    assert!(matches!(taken, Err(FsError::InUse(_))), "{taken:?}");
    let taken = f
        .write(0, |s, t| {
            s.open_write(
                t,
                c.ino,
                &OpenForWrite {
                    lease: lease(6),
                    spec: spec.clone(),
                    truncate: true,
                    lease_timeout_ns: 0,
                    first_block: None,
                },
            )
        })
        .unwrap();
    assert_eq!(taken.0.writing.unwrap().handle, 6);
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(t, &[stale], "")).unwrap(),
        vec![BlockUse::Unknown]
    );
    // A writer that died and that nobody takes over: its blocks go once
    // its lease has run out, and the file is no longer being written; a
    // live lease keeps them.
    let dead = f.write(0, |s, t| s.add_block(t, c.ino, 6, 0)).unwrap();
    let renewed = f
        .read(0, |s, t| s.getattr(t, c.ino))
        .unwrap()
        .writing
        .unwrap()
        .renewed_ns;
    assert_eq!(
        f.write(0, |s, t| s.reclaim_pending(t, renewed, 0)).unwrap(),
        0,
        "a fresh lease keeps its blocks"
    );
    assert_eq!(
        f.write(0, |s, t| s.reclaim_pending(t, renewed + 1, 0))
            .unwrap(),
        1
    );
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(t, &[dead], "")).unwrap(),
        vec![BlockUse::Unknown]
    );
    assert!(f
        .read(0, |s, t| s.getattr(t, c.ino))
        .unwrap()
        .writing
        .is_none());
    assert!(f
        .read(0, |s, t| s.take_freed(t, 100))
        .unwrap()
        .iter()
        .any(|b| b.id == dead));

    // A writer's create allocates the first block in the same commit; an
    // append allocates the block holding the end of the file.
    let e_file = NewFile {
        spec: spec.clone(),
        lease: Some(lease(7)),
    };
    let (e, first) = f
        .write(0, |s, t| s.create_file(t, ROOT_INO, "e", &file(), &e_file))
        .unwrap();
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(t, &[first], "")).unwrap(),
        vec![BlockUse::Pending]
    );
    let size = (1 << 20) + 10;
    let second = f.write(0, |s, t| s.add_block(t, e.ino, 7, 1)).unwrap();
    f.write(0, |s, t| {
        s.complete_file(
            t,
            e.ino,
            7,
            size,
            &[info(first, 0, 1 << 20), info(second, 1, 10)],
        )
    })
    .unwrap();
    let (_, _, at_end) = f
        .write(0, |s, t| {
            s.open_write(
                t,
                e.ino,
                &OpenForWrite {
                    lease: lease(8),
                    spec: spec.clone(),
                    truncate: false,
                    lease_timeout_ns: 0,
                    first_block: Some(true),
                },
            )
        })
        .unwrap();
    let at_end = at_end.expect("a block for the append");
    let (_, _, at_start) = f
        .write(0, |s, t| {
            s.open_write(
                t,
                e.ino,
                &OpenForWrite {
                    lease: lease(9),
                    spec: spec.clone(),
                    truncate: false,
                    lease_timeout_ns: 0,
                    first_block: Some(false),
                },
            )
        })
        .unwrap();
    assert_ne!(at_start, Some(at_end));
    // Both were allocated: the taken-over lease's block is freed, the new one pending.
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(
            t,
            &[at_end, at_start.unwrap()],
            ""
        ))
        .unwrap(),
        vec![BlockUse::Unknown, BlockUse::Pending]
    );
    assert!(matches!(
        f.write(0, |s, t| s.create_file(t, ROOT_INO, "e", &file(), &e_file)),
        Err(FsError::AlreadyExists(_))
    ));
}

#[test]
fn inode_records_of_release_1_are_migrated() {
    use curvine_messages::codec::{decode_versioned, to_bytes};
    let v1 = curvine_messages::AttrV1 {
        ino: 5,
        kind: FileKind::File,
        mode: 0o600,
        uid: 1,
        gid: 2,
        size: 42,
        atime_ns: 1,
        mtime_ns: 2,
        ctime_ns: 3,
        nlink: 1,
        symlink: None,
        block_size: 0,
        replicas: 0,
        parent: 0,
    };
    let mut bytes = vec![1u8];
    bytes.extend(to_bytes("v1", &v1).unwrap());
    let attr: Attr = decode_versioned(&bytes).unwrap();
    assert_eq!((attr.ino, attr.size, attr.mode), (5, 42, 0o600));
    assert!(attr.writing.is_none() && attr.storage.is_none());
}

/// A shard move: export in small chunks, import into another node's store
/// after dropping what was there, then drop the old copy.
fn a_shard_moves_to_another_store_whole(f: Fixture) {
    let map = ClusterMap::single("n1", 2);
    f.write(0, |s, t| s.set_cluster_map(t, 0, &map)).unwrap();
    // A stale compare-and-set loses and sees the stored map.
    let stale = f
        .write(0, |s, t| s.set_cluster_map(t, 0, &map.with_owner(1, "n2")))
        .unwrap();
    assert_eq!(stale, map);
    let spec = FileSpec {
        block_size: 1 << 20,
        replicas: 2,
        storage: None,
    };
    let new = NewFile {
        spec,
        lease: Some(lease(1)),
    };
    let mut files = Vec::new();
    for i in 0..40 {
        let a = f
            .write(0, |s, t| {
                s.create(t, ROOT_INO, &format!("file-{i:02}"), &file(), Some(&new))
            })
            .unwrap();
        let b = f.write(0, |s, t| s.add_block(t, a.ino, 1, 0)).unwrap();
        f.write(0, |s, t| {
            s.complete_file(t, a.ino, 1, 10, &[info(b, 0, 10)])
        })
        .unwrap();
        f.write(0, |s, t| {
            s.set_xattr(t, a.ino, "user.k", b"v", XattrMode::Any)
        })
        .unwrap();
        files.push((a.ino, b));
    }
    // Blocks are seen per node; the scan pages through all of them.
    let (ino, block) = files[3];
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(t, &[block], "n2")).unwrap(),
        vec![BlockUse::Unknown]
    );
    assert!(f
        .write(0, |s, t| s.set_locs(
            t,
            ino,
            0,
            block,
            &["n1".into(), "n2".into()]
        ))
        .unwrap());
    assert!(!f
        .write(0, |s, t| s.set_locs(t, ino, 0, block + 1000, &[]))
        .unwrap());
    assert_eq!(
        f.read(0, |s, t| s.check_blocks(t, &[block], "n2")).unwrap(),
        vec![BlockUse::Live]
    );
    let first = f.read(0, |s, t| s.scan_blocks(t, None, 25)).unwrap();
    let rest = f
        .read(0, |s, t| {
            s.scan_blocks(t, Some((first[24].0, first[24].2.index)), 25)
        })
        .unwrap();
    assert_eq!((first.len(), rest.len()), (25, 15));
    assert!(first.iter().all(|(_, replicas, _)| *replicas == 2));

    let before = f.read(0, |s, t| s.scan(t)).unwrap();
    let g = fixture(true);
    g.write(0, |s, t| s.drop_all(t)).unwrap();
    let mut cursor = None;
    let mut chunks = 0;
    loop {
        let chunk = f.read(0, |s, t| s.export(t, cursor.clone(), 512)).unwrap();
        chunks += 1;
        g.write(0, |s, t| s.import(t, &chunk.records)).unwrap();
        match chunk.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert!(chunks > 3, "small chunks: {chunks}");
    let after = g.read(0, |s, t| s.scan(t)).unwrap();
    assert_eq!(before, after);
    assert_eq!(g.read(0, |s, t| s.cluster_map(t)).unwrap(), Some(map));
    assert_eq!(
        g.read(0, |s, t| s.get_xattr(t, files[7].0, "user.k"))
            .unwrap(),
        b"v".to_vec()
    );
    // Shard 1 of the other store was not touched by the import.
    assert!(g.read(1, |s, t| s.scan(t)).unwrap().inodes.is_empty());
    // Ids go on from the moved counters, never reused.
    let next = g
        .write(0, |s, t| s.create(t, ROOT_INO, "later", &file(), None))
        .unwrap();
    assert!(files.iter().all(|(ino, _)| *ino < next.ino));
    // The old copy goes; the other shard of its store stays.
    f.write(0, |s, t| s.drop_all(t)).unwrap();
    assert!(matches!(
        f.read(0, |s, t| s.getattr(t, ROOT_INO)),
        Err(FsError::NotFound(_))
    ));
    assert_eq!(f.read(0, |s, t| s.cluster_map(t)).unwrap(), None);
    // A record of another shard is refused by an import.
    let foreign = f.read(1, |s, t| s.export(t, None, 1 << 20)).unwrap();
    assert!(g.write(0, |s, t| s.import(t, &foreign.records)).is_err());
}

//! Directory delegations through real shard actors over LMDB: a grant lists
//! the directory and sets inode numbers aside; what another client would
//! see differently waits for the holder to give the directory back (its
//! recall), and a holder that stops renewing loses it; the holder's
//! batched creates land with the inode numbers it chose; the record
//! survives the shard actor's restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use curvine_actors::engine::Engine;
use curvine_actors::host::{HostArgs, ShardDirectory, ShardHost};
use curvine_actors::namespace::Namespace;
use curvine_actors::shard::ShardArgs;
use curvine_actors::stats::Metrics;
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_actors::supervisor::{RestartPolicy, Supervisor};
use curvine_messages::block::{FileSpec, WriteLease};
use curvine_messages::delegation::{DirOp, DirOpDone, DELEGATION_LEASE_MS};
use curvine_messages::{now_ns, FileKind, FsError, Ino, NewInode};
use ractor::Actor;

const SHARDS: u16 = 2;

async fn start(dir: &std::path::Path) -> (Arc<Namespace>, ShardDirectory) {
    let options = StoreOptions {
        map_size: 64 << 20,
        max_readers: 32,
        sync_commit: true,
        wal: true,
        wal_size: 1 << 20,
        checkpoint_interval: Duration::from_millis(500),
        replica_id: 1,
    };
    let engine = Engine::open(&dir.join("meta"), &options).unwrap();
    let metrics = Metrics::new();
    let shards = (0..SHARDS)
        .map(|shard| {
            let id = ShardIdentity {
                cluster_id: "c".into(),
                shard,
                shard_count: SHARDS as u32,
            };
            ShardArgs {
                store: Arc::new(ShardStore::open(&engine, &id).unwrap()),
                group_commit_max: 64,
                commit_delay: Duration::ZERO,
                op_record_ttl: Duration::from_secs(3600),
                write_lease: Duration::from_secs(60),
                tracer: curvine_actors::trace::Tracer::new("n", 1_000, 0.0),
                metrics: metrics.clone(),
            }
        })
        .collect();
    let directory = ShardDirectory::new(SHARDS as u32);
    let args = HostArgs {
        shards,
        directory: directory.clone(),
        policy: RestartPolicy {
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_restarts: 5,
            window: Duration::from_secs(60),
        },
        on_started: Arc::new(|_| {}),
        metrics,
    };
    Actor::spawn(None, Supervisor, ShardHost::supervisor(args))
        .await
        .unwrap();
    let namespace = Namespace::new(directory.clone(), Duration::from_secs(10));
    (namespace, directory)
}

fn create(name: &str, ino: Ino, handle: u64) -> DirOp {
    create_as(name, ino, handle, false)
}

fn create_as(name: &str, ino: Ino, handle: u64, complete: bool) -> DirOp {
    DirOp::Create {
        complete,
        name: name.into(),
        ino,
        attrs: NewInode {
            kind: FileKind::File,
            mode: 0o644,
            uid: 7,
            gid: 8,
            symlink: None,
            now_ns: now_ns(),
        },
        spec: FileSpec {
            block_size: 1 << 20,
            replicas: 1,
            storage: None,
        },
        lease: WriteLease {
            handle,
            client: "test".into(),
            renewed_ns: now_ns(),
        },
    }
}

fn names(listing: &curvine_messages::rpc::Listing) -> Vec<&str> {
    listing.entries.iter().map(|e| e.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn others_wait_for_the_holder_to_give_the_directory_back() {
    let tmp = tempfile::tempdir().unwrap();
    let (ns, _) = start(tmp.path()).await;
    let d = ns.mkdir("/d", false, 0o755, 0, 0).await.unwrap();
    ns.touch("/d/a", 0o644, true, 0, 0).await.unwrap();

    let grant = ns.delegate(d.ino, 1, 8).await.unwrap();
    assert_eq!(grant.dir.ino, d.ino);
    let listed: Vec<&str> = grant.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(listed, vec!["a"]);
    assert_eq!(grant.inos, 8);
    assert_eq!(grant.lease_ms, DELEGATION_LEASE_MS);
    // Another mount cannot have it meanwhile.
    match ns.delegate(d.ino, 2, 8).await {
        Err(FsError::InUse(_)) => {}
        other => panic!("a second holder got {other:?}"),
    }
    // What exists reads the same for everyone: no recall.
    assert_eq!(ns.stat("/d/a", false).await.unwrap().kind, FileKind::File);
    assert_eq!(ns.stat("/d", false).await.unwrap().ino, d.ino);
    let renewal = ns.renew_delegation(d.ino, 1).await.unwrap();
    assert!(!renewal.recalled);

    // The holder's create lands with the inode it chose.
    let done = ns
        .dir_ops(d.ino, 1, vec![create("c", grant.first_ino, 11)])
        .await
        .unwrap();
    let DirOpDone::Created { attr, .. } = done[0].clone().unwrap() else {
        panic!("not a create: {:?}", done);
    };
    assert_eq!(attr.ino, grant.first_ino);
    assert_eq!((attr.uid, attr.gid, attr.block_size), (7, 8, 1 << 20));
    // The same batch again (a retry) finds its file.
    let again = ns
        .dir_ops(d.ino, 1, vec![create("c", grant.first_ino, 11)])
        .await
        .unwrap();
    let DirOpDone::Created { attr: same, .. } = again[0].clone().unwrap() else {
        panic!("not a create: {:?}", again);
    };
    assert_eq!(same.ino, attr.ino);
    assert!(matches!(
        done[0],
        Ok(DirOpDone::Created { block: Some(_), .. })
    ));
    // A file closed empty before its create was sent is created complete.
    let closed = ns
        .dir_ops(
            d.ino,
            1,
            vec![create_as("empty", grant.first_ino + 4, 16, true)],
        )
        .await
        .unwrap();
    let DirOpDone::Created { attr: empty, block } = closed[0].clone().unwrap() else {
        panic!("not a create: {:?}", closed);
    };
    assert_eq!((empty.size, block), (0, None));
    assert!(empty.writing.is_none(), "{empty:?}");
    assert!(ns.stat("/d/empty", false).await.unwrap().writing.is_none());
    // A name taken or an inode not set aside fails alone.
    let mixed = ns
        .dir_ops(
            d.ino,
            1,
            vec![
                create("a", grant.first_ino + 1, 12),
                create("e", grant.first_ino + 100, 13),
                create("f", grant.first_ino + 2, 14),
            ],
        )
        .await
        .unwrap();
    assert!(
        matches!(mixed[0], Err(FsError::AlreadyExists(_))),
        "{mixed:?}"
    );
    assert!(
        matches!(mixed[1], Err(FsError::InvalidArgument(_))),
        "{mixed:?}"
    );
    assert!(mixed[2].is_ok(), "{mixed:?}");

    // A rename of the holder's to a name the directory lacks; made again
    // (a retried batch) it is done already; a wrong inode is refused.
    let rename = DirOp::Rename {
        from: "f".into(),
        to: "g".into(),
        ino: grant.first_ino + 2,
    };
    for _ in 0..2 {
        let done = ns.dir_ops(d.ino, 1, vec![rename.clone()]).await.unwrap();
        assert!(matches!(done[0], Ok(DirOpDone::Renamed)), "{done:?}");
    }
    assert_eq!(
        ns.stat("/d/g", false).await.unwrap().ino,
        grant.first_ino + 2
    );
    let wrong = DirOp::Rename {
        from: "c".into(),
        to: "h".into(),
        ino: grant.first_ino + 3,
    };
    let done = ns.dir_ops(d.ino, 1, vec![wrong]).await.unwrap();
    assert!(matches!(done[0], Err(FsError::NotFound(_))), "{done:?}");

    // Another client's create waits for the recall and the release.
    let recall = {
        let ns = ns.clone();
        tokio::spawn(async move { ns.await_recall(d.ino, 1).await })
    };
    let touch = {
        let ns = ns.clone();
        tokio::spawn(async move { ns.touch("/d/b", 0o644, true, 0, 0).await })
    };
    assert!(
        recall.await.unwrap().unwrap(),
        "the holder was not asked back"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !touch.is_finished(),
        "a create went through a delegated directory"
    );
    assert!(ns.renew_delegation(d.ino, 1).await.unwrap().recalled);
    // Asked back, it is not granted again to its holder either.
    assert!(matches!(
        ns.delegate(d.ino, 1, 8).await,
        Err(FsError::InUse(_))
    ));
    ns.release_delegation(d.ino, 1).await.unwrap();
    touch.await.unwrap().unwrap();
    let listing = ns.list("/d", None, 100).await.unwrap();
    assert_eq!(names(&listing), vec!["a", "b", "c", "empty", "g"]);
    // The holder lost it: its late changes are refused.
    match ns
        .dir_ops(d.ino, 1, vec![create("g", grant.first_ino + 3, 15)])
        .await
    {
        Err(FsError::Stale(_)) => {}
        other => panic!("changes after the release got {other:?}"),
    }
    assert!(matches!(
        ns.renew_delegation(d.ino, 1).await,
        Err(FsError::Stale(_))
    ));
    // And the directory can be delegated again, to anyone.
    let regrant = ns.delegate(d.ino, 2, 4).await.unwrap();
    assert_eq!(regrant.entries.len(), 5);
    assert!(regrant.first_ino >= grant.first_ino + 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stops_renewing_loses_the_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let (ns, directory) = start(tmp.path()).await;
    let d = ns.mkdir("/e", false, 0o755, 0, 0).await.unwrap();
    let grant = ns.delegate(d.ino, 5, 4).await.unwrap();

    // The record outlives the shard actor: the restarted one holds the
    // directory for a full lease (its holder may just have renewed).
    let shard = curvine_messages::shard_of(d.ino);
    let before = directory.get(shard).unwrap();
    before.kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while directory
        .get(shard)
        .map_or(true, |now| now.get_id() == before.get_id())
    {
        assert!(Instant::now() < deadline, "the shard did not come back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!ns.renew_delegation(d.ino, 5).await.unwrap().recalled);

    // A negative lookup conflicts (the holder may have made the name);
    // nobody renews, so it goes through once the lease has run out.
    let started = Instant::now();
    match ns.stat("/e/nothing", false).await {
        Err(FsError::NotFound(_)) => {}
        other => panic!("stat of a missing name got {other:?}"),
    }
    let waited = started.elapsed();
    let lease = Duration::from_millis(u64::from(DELEGATION_LEASE_MS));
    assert!(
        waited >= lease / 2 && waited < lease * 3,
        "waited {waited:?} for a lease of {lease:?}"
    );
    ns.touch("/e/x", 0o644, true, 0, 0).await.unwrap();
    match ns
        .dir_ops(d.ino, 5, vec![create("y", grant.first_ino, 1)])
        .await
    {
        Err(FsError::Stale(_)) => {}
        other => panic!("changes after the lease ran out got {other:?}"),
    }
    let listing = ns.list("/e", None, 100).await.unwrap();
    assert_eq!(names(&listing), vec!["x"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recalled_holder_that_keeps_renewing_sends_what_it_answered() {
    let tmp = tempfile::tempdir().unwrap();
    let (ns, _) = start(tmp.path()).await;
    let d = ns.mkdir("/r", false, 0o755, 0, 0).await.unwrap();
    let grant = ns.delegate(d.ino, 3, 4).await.unwrap();
    let recall = {
        let ns = ns.clone();
        tokio::spawn(async move { ns.await_recall(d.ino, 3).await })
    };
    let touch = {
        let ns = ns.clone();
        tokio::spawn(async move { ns.touch("/r/other", 0o644, true, 0, 0).await })
    };
    assert!(recall.await.unwrap().unwrap());
    // The holder's batch is slow (a loaded host, a slow sync): longer
    // than a lease. It renews meanwhile, so the directory stays its own.
    let lease = Duration::from_millis(u64::from(DELEGATION_LEASE_MS));
    let until = Instant::now() + lease + lease / 2;
    while Instant::now() < until {
        assert!(ns.renew_delegation(d.ino, 3).await.unwrap().recalled);
        tokio::time::sleep(lease / 5).await;
    }
    assert!(
        !touch.is_finished(),
        "the create went through a held directory"
    );
    let done = ns
        .dir_ops(d.ino, 3, vec![create("answered", grant.first_ino, 21)])
        .await
        .unwrap();
    assert!(done[0].is_ok(), "{done:?}");
    ns.release_delegation(d.ino, 3).await.unwrap();
    touch.await.unwrap().unwrap();
    let listing = ns.list("/r", None, 100).await.unwrap();
    assert_eq!(names(&listing), vec!["answered", "other"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_file_closes_with_the_attributes_set_through_it() {
    // What the mount sends for a file tar made: its close carries the
    // mode, owner and times set while it was written, in one commit.
    let tmp = tempfile::tempdir().unwrap();
    let (ns, _) = start(tmp.path()).await;
    let d = ns.mkdir("/t", false, 0o755, 0, 0).await.unwrap();
    let grant = ns.delegate(d.ino, 1, 8).await.unwrap();
    let ino = grant.first_ino;
    ns.dir_ops(
        d.ino,
        1,
        vec![create("f", ino, 21), create("g", ino + 1, 22)],
    )
    .await
    .unwrap();
    let set = curvine_messages::SetAttr {
        mode: Some(0o4750),
        uid: Some(1234),
        gid: Some(567),
        size: None,
        atime: None,
        mtime: Some(curvine_messages::TimeSet::Ns(1_600_000_000_000_000_000)),
    };
    let attr = ns
        .complete_file(ino, 21, 0, Vec::new(), Some(set.clone()))
        .await
        .unwrap();
    assert_eq!((attr.mode, attr.uid, attr.gid), (0o4750, 1234, 567));
    assert_eq!(attr.mtime_ns, 1_600_000_000_000_000_000);
    assert!(attr.writing.is_none());
    let seen = ns.stat("/t/f", false).await.unwrap();
    assert_eq!(
        (seen.mode, seen.uid, seen.mtime_ns),
        (0o4750, 1234, attr.mtime_ns)
    );
    // A close cannot change the size besides: nothing of it applies.
    let with_size = curvine_messages::SetAttr {
        size: Some(5),
        ..set
    };
    match ns
        .complete_file(ino + 1, 22, 0, Vec::new(), Some(with_size))
        .await
    {
        Err(FsError::InvalidArgument(_)) => {}
        other => panic!("a close changing the size gave {other:?}"),
    }
    let g = ns.stat("/t/g", false).await.unwrap();
    assert_eq!((g.mode, g.uid), (0o644, 7));
    assert!(g.writing.is_some(), "the refused close released the lease");
}

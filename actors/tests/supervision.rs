//! A shard actor that dies is restarted by its host with backoff, the
//! directory points at the new actor, and requests work again; a shard that
//! keeps dying makes the host give up (escalate) instead of looping forever.

use std::sync::Arc;
use std::time::{Duration, Instant};

use curvine_actors::engine::Engine;
use curvine_actors::host::{HostArgs, ShardDirectory, ShardHost};
use curvine_actors::namespace::Namespace;
use curvine_actors::shard::ShardArgs;
use curvine_actors::stats::Metrics;
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_actors::supervisor::{RestartPolicy, Supervisor};
use ractor::{Actor, ActorStatus};

fn start_stores(dir: &std::path::Path, metrics: &Metrics) -> Vec<ShardArgs> {
    let options = StoreOptions {
        map_size: 64 << 20,
        max_readers: 32,
        sync_commit: true,
        wal: true,
        wal_size: 1 << 20,
        checkpoint_interval: std::time::Duration::from_millis(500),
        replica_id: 1,
    };
    let engine = Engine::open(&dir.join("meta"), &options).unwrap();
    (0..2u16)
        .map(|shard| {
            let id = ShardIdentity {
                cluster_id: "c".into(),
                shard,
                shard_count: 2,
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
        .collect()
}

fn policy(max_restarts: u32) -> RestartPolicy {
    RestartPolicy {
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        max_restarts,
        window: Duration::from_secs(60),
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shard_is_restarted_and_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let directory = ShardDirectory::new(2);
    let namespace = Namespace::new(directory.clone(), Duration::from_secs(10));
    let metrics = Metrics::new();
    let args = HostArgs {
        shards: start_stores(dir.path(), &metrics),
        directory: directory.clone(),
        policy: policy(5),
        on_started: Arc::new(|_| {}),
        metrics: metrics.clone(),
    };
    let (host, _) = Actor::spawn(None, Supervisor, ShardHost::supervisor(args))
        .await
        .unwrap();
    namespace.mkdir("/d", false, 0o755, 0, 0).await.unwrap();
    namespace.touch("/d/f", 0o644, true, 0, 0).await.unwrap();

    let before = directory.get(0).unwrap();
    before.kill();
    wait_for("shard 0 to come back", || {
        directory
            .get(0)
            .is_ok_and(|now| now.get_id() != before.get_id())
    })
    .await;
    assert_eq!(metrics.shard(0).restarts(), 1);
    // `actors` shows the failure and the restart, and the counters carry
    // over to the new actor.
    let tree = metrics.tree(&host.get_cell());
    assert_eq!(tree.name, "shard-host");
    let names: Vec<&str> = tree.children.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["shard-0", "shard-1"]);
    let shard0 = &tree.children[0];
    assert_eq!((shard0.errors, shard0.restarts), (1, 1), "{shard0:?}");
    assert_eq!(shard0.id, directory.get(0).unwrap().get_id().to_string());
    assert!(shard0.handled >= 2, "{shard0:?}");
    assert_eq!((tree.children[1].errors, tree.children[1].restarts), (0, 0));
    // The restarted shard serves what was committed before.
    assert_eq!(namespace.stat("/d/f", false).await.unwrap().size, 0);
    namespace.touch("/g", 0o644, true, 0, 0).await.unwrap();
    assert!(host.get_status() == ActorStatus::Running);
    host.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_keeps_dying_escalates() {
    let dir = tempfile::tempdir().unwrap();
    let directory = ShardDirectory::new(2);
    let args = HostArgs {
        shards: start_stores(dir.path(), &Metrics::new()),
        directory: directory.clone(),
        policy: policy(2),
        on_started: Arc::new(|_| {}),
        metrics: Metrics::new(),
    };
    let (host, handle) = Actor::spawn(None, Supervisor, ShardHost::supervisor(args))
        .await
        .unwrap();
    for round in 0..3 {
        let Ok(shard) = directory.get(1) else { break };
        shard.kill();
        if round < 2 {
            wait_for("shard 1 to come back", || {
                directory
                    .get(1)
                    .is_ok_and(|now| now.get_id() != shard.get_id())
            })
            .await;
        }
    }
    // The third failure within the window exceeds the limit: the host fails,
    // which its own supervisor sees (here: the host's task ends).
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(host.get_status(), ActorStatus::Stopped));
}

/// A call made again gets the answer of its first attempt, however far
/// the calling node's clock is off: the record of the answer is kept by
/// the shard's generation, not by the time in the call's id (which the
/// members expired at once when the caller's clock was 10 minutes behind
/// theirs, so the second attempt of a create failed "exists").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_again_is_answered_once_whatever_the_callers_clock() {
    use curvine_actors::shard::NamespaceShard;
    use curvine_messages::shard::ShardMsg;
    use curvine_messages::trace::Traced;
    use curvine_messages::{now_ns, Attr, FileKind, FsResult, NewInode, ReqId, ROOT_INO};

    let dir = tempfile::tempdir().unwrap();
    let metrics = Metrics::new();
    let args = start_stores(dir.path(), &metrics).remove(0);
    let (shard, _) = Actor::spawn(None, NamespaceShard, args).await.unwrap();
    let create = |req: ReqId, name: &str| {
        let shard = shard.clone();
        let name = name.to_string();
        async move {
            let r: FsResult<Attr> = shard
                .call(
                    |reply| {
                        Traced::new(
                            ShardMsg::Create {
                                parent: ROOT_INO,
                                name,
                                attrs: NewInode {
                                    kind: FileKind::File,
                                    mode: 0o644,
                                    uid: 0,
                                    gid: 0,
                                    symlink: None,
                                    now_ns: now_ns(),
                                },
                                file: None,
                                reply,
                            },
                            None,
                        )
                        .of_call(Some(req))
                    },
                    Some(Duration::from_secs(10)),
                )
                .await
                .unwrap()
                .unwrap();
            r
        }
    };
    for (name, offset_ns) in [
        ("behind", -1_200_000_000_000i64),
        ("ahead", 86_400_000_000_000),
        ("on-time", 0),
    ] {
        let req = ReqId {
            at_ns: now_ns() + offset_ns,
            nonce: rand::random(),
        };
        let first = create(req, name).await.expect("the first attempt");
        // The members delete expired answers every second: let two passes
        // run between the attempts.
        tokio::time::sleep(
            curvine_actors::store::ANSWER_EXPIRY_EVERY * 2 + Duration::from_millis(200),
        )
        .await;
        let again = create(req, name).await;
        assert_eq!(
            again.as_ref().map(|a| a.ino),
            Ok(first.ino),
            "{name}: the second attempt of the call was applied again: {again:?}"
        );
    }
    shard.stop(None);
}

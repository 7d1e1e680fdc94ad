//! Random sequences of namespace operations against a real node process and
//! against the in-memory model: every result and the final tree must agree,
//! and the namespace must stay consistent (fsck) across shards.

use curvine_integration::model::{self, Model, Op};
use curvine_integration::{settle, NodeProcess};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn path_strategy(root: &'static str) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 1..=3)
        .prop_map(move |parts| format!("{root}/{}", parts.join("/")))
}

fn op_strategy(root: &'static str) -> impl Strategy<Value = Op> {
    let p = || path_strategy(root);
    prop_oneof![
        3 => p().prop_map(Op::Mkdir),
        2 => p().prop_map(Op::Create),
        1 => p().prop_map(Op::Symlink),
        3 => (p(), p()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => p().prop_map(Op::Unlink),
        1 => p().prop_map(Op::Rmdir),
    ]
}

#[test]
fn cluster_matches_model() {
    let dir = tempfile::tempdir().unwrap();
    // One environment per shard here (the other tests use the default, one
    // per node). 4 shards: most directories land on another shard than their parent,
    // so mkdir, rmdir and rename run through intents most of the time.
    let node = NodeProcess::start(
        &dir.path().join("node"),
        &["-c", "cluster.shards=4", "-c", "meta.layout=shard"],
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = runtime.block_on(node.client());
    let cases: u32 = std::env::var("MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let counter = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&prop::collection::vec(op_strategy("/ROOT"), 1..40), |ops| {
            let case = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let root = format!("/case{case}");
            runtime.block_on(async {
                client.mkdir(&root, false).await.unwrap();
                let mut model = Model::new(&root);
                for op in &ops {
                    let op = rebase(op, &root);
                    let expected = model.apply(&op).map_err(String::from);
                    let actual = model::run(&client, &op).await;
                    prop_assert_eq!(&actual, &expected, "operation {:?}", op);
                }
                let tree = model::snapshot(&client, &root).await;
                prop_assert_eq!(&tree, &model.entries);
                let report = settle(&client).await;
                prop_assert!(report.problems.is_empty(), "fsck: {:?}", report.problems);
                prop_assert_eq!(report.pending_intents, 0);
                Ok(())
            })
        })
        .unwrap();
}

fn rebase(op: &Op, root: &str) -> Op {
    let r = |p: &String| p.replacen("/ROOT", root, 1);
    match op {
        Op::Mkdir(p) => Op::Mkdir(r(p)),
        Op::Create(p) => Op::Create(r(p)),
        Op::Symlink(p) => Op::Symlink(r(p)),
        Op::Rename(a, b) => Op::Rename(r(a), r(b)),
        Op::Unlink(p) => Op::Unlink(r(p)),
        Op::Rmdir(p) => Op::Rmdir(r(p)),
    }
}

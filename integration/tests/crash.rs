//! SIGKILL a node during a stream of mkdir/create/rename/unlink/rmdir, restart
//! it, and check that every acknowledged operation is there, that nothing is
//! left dangling or orphaned, and that interrupted cross-shard operations
//! were finished or rolled back.

use std::sync::Arc;
use std::time::Duration;

use curvine_integration::model::{self, Model, Op};
use curvine_integration::{settle, NodeProcess};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random_op(rng: &mut StdRng, root: &str) -> Op {
    let names = ["a", "b", "c", "d"];
    let path = |rng: &mut StdRng| {
        let depth = rng.gen_range(1..=3);
        let parts: Vec<&str> = (0..depth)
            .map(|_| names[rng.gen_range(0..names.len())])
            .collect();
        format!("{root}/{}", parts.join("/"))
    };
    match rng.gen_range(0..10) {
        0..=2 => Op::Mkdir(path(rng)),
        3..=4 => Op::Create(path(rng)),
        5..=7 => Op::Rename(path(rng), path(rng)),
        8 => Op::Unlink(path(rng)),
        _ => Op::Rmdir(path(rng)),
    }
}

#[test]
fn acknowledged_operations_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["-c", "cluster.shards=4"];
    let mut node = NodeProcess::start(&dir.path().join("node"), &extra);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let kills: u64 = std::env::var("CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let root = "/crash";
    runtime.block_on(async { node.client().await.mkdir(root, false).await.unwrap() });
    let mut model = Model::new(root);
    for round in 0..kills {
        let mut rng = StdRng::seed_from_u64(round * 7919 + 13);
        // The model after every acknowledged op, and the op in flight when the node died.
        let state = Arc::new(Mutex::new((model.clone(), None::<Op>)));
        let client = runtime.block_on(node.client());
        let worker_state = state.clone();
        let worker = runtime.spawn(async move {
            loop {
                let op = random_op(&mut rng, root);
                worker_state.lock().1 = Some(op.clone());
                let result = model::run(&client, &op).await;
                let mut guard = worker_state.lock();
                match result {
                    Err(kind) if kind == "unavailable" || kind == "timed_out" => return,
                    result => {
                        let expected = guard.0.apply(&op).map_err(String::from);
                        assert_eq!(result, expected, "operation {op:?} before the kill");
                        guard.1 = None;
                    }
                }
            }
        });
        std::thread::sleep(Duration::from_millis(
            StdRng::seed_from_u64(round).gen_range(50..400),
        ));
        node.kill();
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), worker)
                .await
                .ok()
        });
        node.restart(&extra);
        let client = runtime.block_on(node.client());
        let report = runtime.block_on(settle(&client));
        assert!(
            report.problems.is_empty(),
            "round {round}: fsck after restart: {:?}",
            report.problems
        );
        assert_eq!(
            report.pending_intents, 0,
            "round {round}: intents left after recovery"
        );
        assert_eq!(
            report.locks, 0,
            "round {round}: name locks left after recovery"
        );
        let tree = runtime.block_on(model::snapshot(&client, root));
        let (acked, in_flight) = state.lock().clone();
        // The op in flight may or may not have happened; everything acknowledged must have.
        let mut with_in_flight = acked.clone();
        if let Some(op) = &in_flight {
            let _ = with_in_flight.apply(op);
        }
        if tree == acked.entries {
            model = acked;
        } else if tree == with_in_flight.entries {
            model = with_in_flight;
        } else {
            panic!(
                "round {round}: tree after restart matches neither the acknowledged state nor it plus {in_flight:?}\nacked: {:?}\ntree:  {:?}",
                acked.entries, tree
            );
        }
    }
}

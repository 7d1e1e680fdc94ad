//! The one supervision mechanism: children restarted with backoff and a
//! limit, slots that follow restarts, tasks supervised like actors, a
//! supervisor that escalates when a child keeps failing, and stops that run
//! last-started-first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, ActorStatus};

use curvine_runtime::stats::Metrics;
use curvine_runtime::supervisor::{
    ActorChild, RestartPolicy, Slot, Supervisor, SupervisorArgs, TaskChild,
};

fn policy(max_restarts: u32) -> RestartPolicy {
    RestartPolicy {
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
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

/// An actor that fails when told to, and records when it stops.
struct Worker;

enum WorkerMsg {
    Fail,
}

impl ractor::Message for WorkerMsg {}

#[derive(Clone)]
struct WorkerArgs {
    name: &'static str,
    stopped: Arc<Mutex<Vec<&'static str>>>,
}

impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = WorkerArgs;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<WorkerArgs, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<WorkerMsg>,
        message: WorkerMsg,
        _state: &mut WorkerArgs,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WorkerMsg::Fail => Err("told to fail".into()),
        }
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<WorkerMsg>,
        state: &mut WorkerArgs,
    ) -> Result<(), ActorProcessingErr> {
        state.stopped.lock().push(state.name);
        Ok(())
    }
}

fn worker(name: &'static str, stopped: &Arc<Mutex<Vec<&'static str>>>) -> ActorChild<Worker> {
    let args = WorkerArgs {
        name,
        stopped: stopped.clone(),
    };
    ActorChild::new(name, move || (Worker, args.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_actor_is_restarted_and_its_slot_follows() {
    let metrics = Metrics::new();
    let stopped = Arc::new(Mutex::new(Vec::new()));
    let slot: Slot<WorkerMsg> = Slot::new("worker");
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = failures.clone();
    let args = SupervisorArgs::new("root", policy(5), metrics.clone()).child(
        worker("worker", &stopped)
            .with_slot(slot.clone())
            .on_stop(move |f| seen.lock().push(f.unwrap_or("stopped").to_string()))
            .boxed(),
    );
    let (sup, _) = Actor::spawn(None, Supervisor, args).await.unwrap();
    let first = slot.get().unwrap();
    first.cast(WorkerMsg::Fail).unwrap();
    wait_for("the worker to come back", || {
        slot.current().is_some_and(|a| a.get_id() != first.get_id())
    })
    .await;
    let stats = metrics.actor("worker", false);
    assert_eq!((stats.errors(), stats.restarts()), (1, 1));
    assert_eq!(failures.lock().as_slice(), ["told to fail"]);
    // `actors` shows the restarted child under its supervisor.
    let tree = metrics.tree(&sup.get_cell());
    assert_eq!(tree.name, "root");
    assert_eq!(tree.children.len(), 1);
    assert_eq!(tree.children[0].restarts, 1);
    sup.stop_and_wait(None, None).await.unwrap();
    assert!(
        slot.current().is_none(),
        "a stopped child leaves its slot empty"
    );
    assert!(slot
        .get()
        .unwrap_err()
        .to_string()
        .contains("the worker is restarting"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ends_or_panics_is_started_again() {
    let metrics = Metrics::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let task = TaskChild::new("loop", move || {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            match n {
                0 => {} // ends at once: a failure
                1 => panic!("a bug in the loop"),
                _ => std::future::pending::<()>().await, // runs for good
            }
        }
    });
    let args = SupervisorArgs::new("root", policy(5), metrics.clone()).child(task.boxed());
    let (sup, _) = Actor::spawn(None, Supervisor, args).await.unwrap();
    wait_for("the third run", || runs.load(Ordering::SeqCst) == 3).await;
    let stats = metrics.actor("loop", false);
    assert_eq!((stats.errors(), stats.restarts()), (2, 2));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "a running task is left alone"
    );
    let tree = metrics.tree(&sup.get_cell());
    assert_eq!(tree.children[0].name, "loop");
    assert_eq!(tree.children[0].status, "running");
    sup.stop_and_wait(None, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_keeps_failing_escalates() {
    let metrics = Metrics::new();
    let stopped = Arc::new(Mutex::new(Vec::new()));
    let slot: Slot<WorkerMsg> = Slot::new("worker");
    let why = Arc::new(Mutex::new(None::<String>));
    let told = why.clone();
    let args = SupervisorArgs::new("root", policy(2), metrics.clone())
        .child(worker("worker", &stopped).with_slot(slot.clone()).boxed())
        .on_give_up(move |reason| *told.lock() = Some(reason.to_string()));
    let (sup, handle) = Actor::spawn(None, Supervisor, args).await.unwrap();
    for round in 0..3 {
        let w = slot.get().unwrap();
        w.cast(WorkerMsg::Fail).unwrap();
        if round < 2 {
            wait_for("a restart", || {
                slot.current().is_some_and(|a| a.get_id() != w.get_id())
            })
            .await;
        }
    }
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(sup.get_status(), ActorStatus::Stopped));
    let reason = why.lock().clone().unwrap();
    assert!(
        reason.contains("worker failed 2 times") && reason.contains("told to fail"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_stop_last_started_first_and_a_significant_child_ends_its_supervisor() {
    let metrics = Metrics::new();
    let stopped = Arc::new(Mutex::new(Vec::new()));
    let args = SupervisorArgs::new("root", policy(5), metrics.clone())
        .child(worker("first", &stopped).boxed())
        .child(worker("second", &stopped).boxed())
        .child(worker("third", &stopped).boxed());
    let (sup, _) = Actor::spawn(None, Supervisor, args).await.unwrap();
    sup.stop_and_wait(None, None).await.unwrap();
    assert_eq!(stopped.lock().as_slice(), ["third", "second", "first"]);

    // A session-like child: its stopping on its own ends the supervisor.
    let slot: Slot<WorkerMsg> = Slot::new("session");
    let args = SupervisorArgs::new("root", policy(5), metrics.clone()).child(
        worker("session", &stopped)
            .with_slot(slot.clone())
            .ending_supervisor()
            .boxed(),
    );
    let (sup, handle) = Actor::spawn(None, Supervisor, args).await.unwrap();
    slot.get().unwrap().stop(Some("unmounted".into()));
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(sup.get_status(), ActorStatus::Stopped));
    assert_eq!(metrics.actor("session", false).errors(), 0);
}

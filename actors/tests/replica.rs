//! The shards' Raft groups on real LMDB environments: a lone member leads
//! its group and records every entry it applies; a member that does not
//! lead runs no mutation.

use std::sync::mpsc;
use std::time::Duration;

use curvine_messages::{now_ns, FileKind, NewInode, ROOT_INO};

use curvine_actors::replica::{member_id, read_group_state, write_group_state};
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_actors::writer::Writer;
use curvine_messages::wal::GroupState;
use curvine_messages::{FsError, FsResult};

fn open(dir: &std::path::Path, shard: u16) -> ShardStore {
    let options = StoreOptions {
        map_size: 64 << 20,
        max_readers: 16,
        sync_commit: false,
        wal: true,
        wal_size: 1 << 20,
        checkpoint_interval: Duration::from_secs(3600),
        replica_id: 7,
    };
    let identity = ShardIdentity {
        cluster_id: "replica".into(),
        shard,
        shard_count: 4,
    };
    ShardStore::open(dir, &identity, &options).unwrap()
}

fn create(writer: &Writer, store: &std::sync::Arc<ShardStore>, name: &str) -> FsResult<()> {
    let (tx, rx) = mpsc::channel();
    let store = store.clone();
    let name = name.to_string();
    writer.submit(
        move |w| {
            let attrs = NewInode {
                kind: FileKind::File,
                mode: 0o644,
                uid: 0,
                gid: 0,
                symlink: None,
                now_ns: now_ns(),
            };
            store.create(w, ROOT_INO, &name, &attrs, None).map(drop)
        },
        move |r| tx.send(r).unwrap(),
    );
    rx.recv_timeout(Duration::from_secs(10)).unwrap()
}

fn state(store: &ShardStore) -> GroupState {
    let txn = store.read_txn().unwrap();
    read_group_state(store.tables()[0], &txn, store.shard)
        .unwrap()
        .expect("the group has a state")
}

#[test]
fn a_lone_member_leads_its_group_and_records_each_applied_entry() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(dir.path(), 0));
    let writer = Writer::for_store(&store, 64, Duration::ZERO);
    create(&writer, &store, "a").unwrap();
    let first = state(&store);
    assert_eq!(first.voters, vec![7]);
    assert!(first.hard_state.term >= 1, "{first:?}");
    // The entry a new leader appends, then the create.
    assert!(first.applied_index >= 2, "{first:?}");
    create(&writer, &store, "b").unwrap();
    let second = state(&store);
    assert_eq!(second.applied_index, first.applied_index + 1);
    assert_eq!(second.applied_term, first.hard_state.term);
    // A name taken is refused, and nothing is proposed for it.
    assert!(matches!(
        create(&writer, &store, "b"),
        Err(FsError::AlreadyExists(_))
    ));
    assert_eq!(state(&store).applied_index, second.applied_index);
}

#[test]
fn a_member_that_does_not_lead_runs_no_mutation() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(dir.path(), 0));
    // The group's members are two other nodes: this one never campaigns.
    let mut txn = store.env().write_txn().unwrap();
    let others = GroupState {
        voters: vec![41, 42],
        ..GroupState::default()
    };
    write_group_state(store.tables()[0], &mut txn, 0, &others).unwrap();
    txn.commit().unwrap();
    let writer = Writer::for_store(&store, 64, Duration::ZERO);
    match create(&writer, &store, "refused") {
        Err(FsError::Unavailable(why)) => {
            assert!(
                why.contains("shard 0") && why.contains("not the leader"),
                "{why}"
            )
        }
        other => panic!("expected the mutation to be refused, got {other:?}"),
    }
    let txn = store.read_txn().unwrap();
    assert!(store.lookup(&txn, ROOT_INO, "refused").is_err());
}

#[test]
fn member_ids_are_stable_and_never_zero() {
    assert_eq!(member_id("node-a"), member_id("node-a"));
    assert_ne!(member_id("node-a"), member_id("node-b"));
    assert_ne!(member_id(""), 0);
}

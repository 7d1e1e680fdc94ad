//! The node's block store on real LMDB and real tier directories: opening it
//! brings the index and the files on disk into agreement.

use curvine_actors::blocks::{BlockStore, TierInfo};
use curvine_messages::block::TierKind;

fn tiers(dir: &std::path::Path) -> Vec<TierInfo> {
    vec![
        TierInfo {
            kind: TierKind::Mem,
            root: dir.join("mem"),
            capacity: 64 << 20,
        },
        TierInfo {
            kind: TierKind::Hdd,
            root: dir.join("hdd"),
            capacity: 64 << 20,
        },
    ]
}

#[test]
fn opening_removes_temporary_and_unindexed_files() {
    let dir = tempfile::tempdir().unwrap();
    let (store, report) =
        BlockStore::open(&dir.path().join("index"), tiers(dir.path()), true).unwrap();
    assert_eq!(report.blocks, 0);
    // A write cut off by a crash, and a block file the index never recorded.
    let tmp = store.tmp_path(0, 7);
    std::fs::write(&tmp, b"half").unwrap();
    let stray = store.block_path(1, 9);
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::write(&stray, b"stray").unwrap();
    drop(store);
    let (store, report) =
        BlockStore::open(&dir.path().join("index"), tiers(dir.path()), true).unwrap();
    assert_eq!((report.temporary, report.unindexed), (1, 1), "{report:?}");
    assert!(!tmp.exists() && !stray.exists());
    assert!(store.get(9).unwrap().is_none());
    // A block manager that starts again clears writes it can no longer commit.
    std::fs::write(store.tmp_path(1, 11), b"x").unwrap();
    assert_eq!(store.clear_tmp(), 1);
    assert_eq!(store.clear_tmp(), 0);
    let stats = store.stats();
    assert_eq!(stats.len(), 2);
    assert!(stats.iter().all(|t| t.used == 0 && t.blocks == 0));
}

#[test]
fn a_node_needs_a_tier() {
    let dir = tempfile::tempdir().unwrap();
    let err = BlockStore::open(&dir.path().join("index"), Vec::new(), true)
        .err()
        .unwrap();
    assert!(err.to_string().contains("at least one tier"), "{err}");
}

//! Replays the fuzz corpus kept in the repository (`integration/fuzz/corpus/
//! TARGET/`, inputs the fuzzer found interesting, and crashes it found,
//! which stay as regressions) through the same functions the fuzz targets
//! run, then random inputs besides: none may panic.

use std::path::Path;

use curvine_integration::fuzzing::TARGETS;
use proptest::prelude::*;

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            out.push((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn every_kept_input_runs_clean() {
    let mut total = 0;
    for (name, run) in TARGETS {
        let inputs = corpus(name);
        assert!(!inputs.is_empty(), "no corpus for fuzz target {name}");
        for (file, bytes) in inputs {
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(
                outcome.is_ok(),
                "fuzz target {name} panics on corpus/{name}/{file}"
            );
            total += 1;
        }
    }
    eprintln!("{total} corpus inputs replayed");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs_run_clean(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for (_, run) in TARGETS {
            run(&bytes);
        }
    }
}

/// Writes the seed inputs of every target into the corpus folders (run by
/// hand: `cargo test -p curvine-integration --test fuzz_corpus -- --ignored`):
/// well-formed frames, messages, values, the annotated config and paths, for
/// the fuzzer to mutate.
#[test]
#[ignore = "writes the seed corpus"]
fn write_seed_corpus() {
    use curvine_messages::block::{Access, DataFrameRef, DataRequest, Token};
    use curvine_messages::codec::{encode_versioned, to_bytes, Hello};
    use curvine_messages::remote::encode_peer;
    use curvine_messages::rpc::{Mkdir, Request, RequestFrame, Stat};
    use curvine_messages::trace::TraceCtx;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let put = |target: &str, name: &str, bytes: Vec<u8>| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    };
    let frame = |request: Request, trace| {
        to_bytes(
            "request",
            &RequestFrame {
                id: 7,
                request,
                trace,
            },
        )
        .unwrap()
    };
    put("client_frame", "hello", Hello::current().encode().to_vec());
    put(
        "client_frame",
        "stat",
        frame(
            Request::Stat(Stat {
                path: "/a/b".into(),
            }),
            None,
        ),
    );
    put(
        "client_frame",
        "mkdir-traced",
        frame(
            Request::Mkdir(Mkdir {
                path: "/x/y".into(),
                parents: true,
                mode: 0o755,
                uid: 1,
                gid: 2,
            }),
            Some(TraceCtx { trace: 9, span: 3 }),
        ),
    );
    let token = Token {
        block: 77,
        access: Access::Read,
        expires_s: 1 << 40,
        mac: [5; 16],
    };
    for (name, request) in [
        (
            "read",
            DataRequest::Read {
                token: token.clone(),
                offset: 0,
                len: 1 << 20,
            },
        ),
        (
            "commit-local",
            DataRequest::CommitLocal {
                token: token.clone(),
                len: 70_000,
                crcs: vec![1, 2],
            },
        ),
    ] {
        put(
            "data_frame",
            name,
            to_bytes(
                "data request",
                &DataFrameRef {
                    trace: Some(TraceCtx { trace: 1, span: 2 }),
                    request: &request,
                },
            )
            .unwrap(),
        );
    }
    // Peer messages: the first byte picks the variant (bit 7: a call).
    put("peer_message", "drain", {
        let mut b = vec![0x80 | 3];
        b.extend(encode_peer("drain", &(true, false)));
        b
    });
    put("peer_message", "scrub", {
        let mut b = vec![0x80 | 10];
        b.extend(encode_peer("scrub", &true));
        b
    });
    put("peer_message", "raft", {
        let batch = vec![(3u16, vec![8, 1, 16, 2]), (4, Vec::new())];
        let part = curvine_messages::raft::encode("node-a", 7, &batch).unwrap();
        let mut b = vec![11];
        b.extend(encode_peer("raft messages", &part[0]));
        b
    });
    put("peer_message", "remove", {
        let mut b = vec![0x80 | 7];
        b.extend(encode_peer("remove blocks", &vec![1u64, 2, 3]));
        b
    });
    let attr = curvine_messages::Attr {
        ino: 5,
        kind: curvine_messages::FileKind::File,
        mode: 0o644,
        uid: 1,
        gid: 1,
        size: 10,
        atime_ns: 1,
        mtime_ns: 2,
        ctime_ns: 3,
        nlink: 1,
        symlink: None,
        block_size: 1 << 20,
        replicas: 1,
        parent: 1,
        storage: None,
        writing: None,
        ufs: None,
    };
    put("stored_value", "attr", encode_versioned(&attr));
    put(
        "stored_value",
        "log-record",
        postcard::to_allocvec(&vec![
            curvine_messages::wal::Change::Put {
                table: 1,
                key: vec![0, 0, 0, 0, 0, 0, 0, 5],
                value: encode_versioned(&attr),
            },
            curvine_messages::wal::Change::Delete {
                table: 2,
                key: b"\0\0\0\0\0\0\0\x01name".to_vec(),
            },
        ])
        .unwrap(),
    );
    put(
        "config",
        "curvine.toml",
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/curvine.toml")).unwrap(),
    );
    put(
        "config",
        "settings",
        b"meta.wal=false\ndata.tiers=[MEM:1GiB]/dev/shm/x,[SSD:2GiB]/data\ncluster.heartbeat=200ms\n"
            .to_vec(),
    );
    put("path", "relative", b"a/../b/./c\0/x/y".to_vec());
    put("path", "absolute", b"/data/train//img-001.jpg".to_vec());
}

//! What the fuzz targets (`integration/fuzz`) run, one function per target,
//! so the same code replays the kept corpus and every crash found in the
//! normal test run (`tests/fuzz_corpus.rs`). Each takes arbitrary bytes and
//! must neither panic nor hang; where the input decodes, what it decodes to
//! must hold up (encoding it again gives the same value, a normalised path
//! normalises to itself).

use curvine_messages::block::{DataFrame, DataReply};
use curvine_messages::cluster::PeerMsg;
use curvine_messages::codec::{decode_versioned, from_bytes, to_bytes, Hello};
use curvine_messages::rpc::{RequestFrame, ResponseFrame};
use ractor::message::SerializedMessage;
use ractor::Message;

/// One fuzz target: it takes any bytes and must neither panic nor hang.
pub type Target = fn(&[u8]);

/// The targets, by name (as `cargo fuzz run NAME` and the corpus folders
/// know them).
pub const TARGETS: &[(&str, Target)] = &[
    ("client_frame", client_frame),
    ("peer_message", peer_message),
    ("data_frame", data_frame),
    ("stored_value", stored_value),
    ("config", config),
    ("path", path),
];

/// A client connection's opening and request frames as a node reads them,
/// and the response frames as a client reads them.
pub fn client_frame(data: &[u8]) {
    if let Ok(opening) = <&[u8; Hello::LEN]>::try_from(data.get(..Hello::LEN).unwrap_or(&[])) {
        let _ = Hello::decode(opening);
    }
    if let Ok(frame) = from_bytes::<RequestFrame>("request", data) {
        let again = to_bytes("request", &frame).expect("a decoded request encodes");
        let back: RequestFrame = from_bytes("request", &again).expect("and decodes again");
        assert_eq!(back, frame);
        let _ = frame.request.kind_name();
    }
    let _ = from_bytes::<ResponseFrame>("response", data);
}

/// A message from another node as ractor_cluster hands it over: the first
/// byte picks a variant name, the rest are its arguments.
pub fn peer_message(data: &[u8]) {
    const VARIANTS: &[&str] = &[
        "heartbeat",
        "shard",
        "trace",
        "drain",
        "report",
        "actors",
        "join",
        "remove_blocks",
        "pull",
        "load",
        "scrub",
        "raft",
        "nonsense",
    ];
    let Some((&pick, args)) = data.split_first() else {
        return;
    };
    // Decoding a call hands its reply port to a task (as ractor_cluster
    // does, inside the node's runtime), so it needs one.
    let _runtime = runtime().enter();
    let variant = VARIANTS[pick as usize % VARIANTS.len()].to_string();
    let message = if pick & 0x80 == 0 {
        SerializedMessage::Cast {
            variant,
            args: args.to_vec(),
            metadata: None,
        }
    } else {
        let (tx, _rx) = ractor::concurrency::oneshot::<Vec<u8>>();
        SerializedMessage::Call {
            variant,
            args: args.to_vec(),
            reply: tx.into(),
            metadata: None,
        }
    };
    // Decoding is total: bad bytes become `Invalid`, never a panic inside
    // ractor_cluster (which would drop the session).
    match PeerMsg::deserialize(message) {
        Ok(PeerMsg::Invalid { reason, reply }) => PeerMsg::refuse(&reason, reply),
        // Raft messages are put together from their parts: a batch that
        // decodes encodes again to the same parts.
        Ok(PeerMsg::Raft(part)) => {
            let (from, seq) = (part.from.clone(), part.seq);
            if let Ok(Some(batch)) = curvine_messages::raft::Reassembly::default().take(part) {
                let again = curvine_messages::raft::encode(&from, seq, &batch)
                    .expect("a decoded batch encodes");
                let mut r = curvine_messages::raft::Reassembly::default();
                let back = again.into_iter().filter_map(|p| r.take(p).unwrap()).next();
                assert_eq!(back, Some(batch));
            }
        }
        _ => {}
    }
}

/// The runtime decoded calls spawn their reply tasks on: one worker, driven
/// in the background, so the tasks end as their ports are dropped.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("a one-worker tokio runtime")
    })
}

/// A data-port request frame as the data server reads it, and a reply as a
/// client reads it.
pub fn data_frame(data: &[u8]) {
    if let Ok(frame) = from_bytes::<DataFrame>("data request", data) {
        let _ = frame.request.kind_name();
    }
    let _ = from_bytes::<DataReply>("data reply", data);
}

/// Values read back from LMDB and the metadata log.
pub fn stored_value(data: &[u8]) {
    use curvine_messages::shard::{DentryValue, Intent, ShardMeta};
    let _ = decode_versioned::<curvine_messages::Attr>(data);
    let _ = decode_versioned::<DentryValue>(data);
    let _ = decode_versioned::<ShardMeta>(data);
    let _ = decode_versioned::<Intent>(data);
    let _ = decode_versioned::<curvine_messages::block::BlockInfo>(data);
    let _ = decode_versioned::<curvine_messages::block::BlockRecord>(data);
    let _ = decode_versioned::<curvine_messages::mount::MountTable>(data);
    let _ = decode_versioned::<curvine_messages::mount::JournalEntry>(data);
    let _ = decode_versioned::<curvine_messages::mount::LoadJob>(data);
    let _ = decode_versioned::<curvine_messages::cluster::ClusterMap>(data);
    let _ = postcard::from_bytes::<Vec<curvine_messages::wal::Change>>(data);
}

/// A config file, and `-c key=value` settings, as a node or the CLI loads
/// them: a bad one is an error naming the key, never a panic.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut loader = curvine_conf::Loader::new();
    if loader.toml_text(text, "fuzz").is_ok() {
        if let Ok(config) = loader.build() {
            let _ = config.tiers();
            let _ = config.data_dir();
            let _ = config.http_listen();
        }
    }
    let mut loader = curvine_conf::Loader::new();
    for line in text.lines().take(64) {
        if loader.key_value(line).is_err() {
            return;
        }
    }
    let _ = loader.build();
}

/// Paths and names as clients give them.
pub fn path(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (path, cwd) = text.split_once('\0').unwrap_or((text, "/"));
    let _ = curvine_messages::path::check_name(path);
    if let Ok(normal) = curvine_messages::path::normalize(path, cwd) {
        assert!(
            normal.starts_with('/'),
            "{normal:?} from {path:?} in {cwd:?}"
        );
        let again = curvine_messages::path::normalize(&normal, "/")
            .unwrap_or_else(|e| panic!("{normal:?} (from {path:?}) does not normalise: {e}"));
        assert_eq!(again, normal, "normalising {path:?} is not stable");
    }
}

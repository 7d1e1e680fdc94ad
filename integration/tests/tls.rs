//! TLS on real node processes, with certificates made by
//! `conf/make-certs.sh`: a cluster whose nodes join, replicate and serve
//! the client library, the CLI and a FUSE mount over TLS only; what crosses the client port is unreadable on the
//! wire (and readable without TLS, the control); plain clients, plain data
//! connections, clients that do not trust the nodes' CA, plain peers on the
//! cluster port and nodes with a certificate of another CA are refused,
//! with errors that say why, and logged; a peer that opens the cluster port
//! and never finishes its handshake holds up no other node.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use curvine_client::Client;
use curvine_conf::ClientConf;
use curvine_integration::{
    bin, make_certs, random_bytes, read_file, runtime, tls_args, wait_for, write_file, FuseMount,
    NodeProcess, ProcessCluster, WithLog, FAST_CLUSTER,
};

const HOSTS: &[&str] = &[
    "127.0.0.1",
    "127.0.0.2",
    "127.0.0.3",
    "127.0.0.4",
    "localhost",
];

/// Waits until `log` of a node contains `text`.
fn wait_log(node: &NodeProcess, text: &str) {
    let what = format!("node {} to log {text:?}", node.node_id);
    wait_for(WithLog(what, &node.log), Duration::from_secs(20), || {
        node.log_text().contains(text).then_some(())
    });
}

/// A TCP relay in front of `target` that keeps every byte it passes on,
/// both ways.
struct Relay {
    addr: String,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Relay {
    fn start(target: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen: Arc<Mutex<Vec<u8>>> = Default::default();
        let (target, kept) = (target.to_string(), seen.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let Ok(upstream) = TcpStream::connect(&target) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (conn.try_clone().unwrap(), upstream.try_clone().unwrap()),
                    (upstream, conn),
                ] {
                    let kept = kept.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 << 10];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                            kept.lock().unwrap().extend_from_slice(&buf[..n]);
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { addr, seen }
    }

    fn saw(&self, text: &str) -> bool {
        let seen = self.seen.lock().unwrap();
        seen.windows(text.len()).any(|w| w == text.as_bytes())
    }

    fn bytes(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// `curvine-cli fs cat PATH` through the data port of `node` (no short-circuit).
fn cat(node: &NodeProcess, path: &str) -> Vec<u8> {
    let out = node
        .command("curvine-cli")
        .env("CURVINE_CLIENT_SHORT_CIRCUIT", "false")
        .args(["--cluster", &node.addr, "fs", "cat", path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fs cat {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn args(certs: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = tls_args(certs, "node");
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

fn expect_error(result: curvine_messages::FsResult<Client>, wanted: &str) -> String {
    match result {
        Ok(_) => panic!("connected, expected an error with {wanted:?}"),
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains(wanted), "error {text:?} lacks {wanted:?}");
            text
        }
    }
}

#[test]
fn a_tls_cluster_serves_over_tls_only() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certs(&certs, "node", HOSTS);
    // A generous handshake timeout: a peer that never finishes its
    // handshake must not hold up a joining node for that long.
    let cluster_args = args(&certs, &["-c", "tls.handshake_timeout=60s"]);
    std::fs::create_dir_all(dir.path().join("c")).unwrap();
    let cluster = ProcessCluster::start(&dir.path().join("c"), 2, &strs(&cluster_args));
    let (n0, n1) = (&cluster.nodes[0], &cluster.nodes[1]);

    let rt = runtime();
    rt.block_on(async {
        // Client and data ports over TLS; no short-circuit, so bytes cross
        // the data port. Two replicas: node 1 pulls its copy from node 0's
        // data port.
        let conf = |n: &NodeProcess| ClientConf {
            short_circuit: false,
            ..n.client_conf()
        };
        let c0 = Client::connect(&conf(n0)).await.unwrap();
        let c1 = Client::connect(&conf(n1)).await.unwrap();
        let bytes = random_bytes(3 << 20, 7);
        write_file(&c0, "/tls.bin", &bytes, 2).await;
        assert_eq!(read_file(&c1, "/tls.bin").await.unwrap(), bytes);
        let blocks: serde_json::Value =
            serde_json::from_str(&n1.cli_ok(&["--json", "fs", "blocks", "/tls.bin"])).unwrap();
        for block in blocks["blocks"].as_array().unwrap() {
            let holders: Vec<&str> = block["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|r| r["node_id"].as_str())
                .collect();
            assert_eq!(holders.len(), 2, "block without its two copies: {blocks}");
        }
        // Blocks larger than the sockets buffer: a block's last records
        // wait in the TLS session until the node flushes them.
        let big = random_bytes(40 << 20, 8);
        let options = curvine_client::io::WriteOptions {
            spec: curvine_messages::block::FileSpec {
                block_size: 32 << 20,
                replicas: 1,
                storage: None,
            },
            ..curvine_client::io::WriteOptions::create()
        };
        let mut w = curvine_client::io::FileWriter::open(&c0, "/big.bin", &options)
            .await
            .unwrap();
        w.write(&big).await.unwrap();
        w.close().await.unwrap();
        assert!(read_file(&c1, "/big.bin").await.unwrap() == big);

        // A plain client is told the port wants TLS.
        let plain = ClientConf {
            tls: Default::default(),
            ..n0.client_conf()
        };
        expect_error(
            Client::connect(&plain).await,
            "requires TLS on its client port",
        );

        // A client with TLS on the client port but not the data port
        // connects, and its reads are refused by the data port.
        let mut no_data = conf(n0);
        no_data.tls.data = false;
        let c = Client::connect(&no_data).await.unwrap();
        let e = read_file(&c, "/tls.bin").await.unwrap_err().to_string();
        assert!(e.contains("requires TLS on its data port"), "{e}");
        wait_log(n0, "refused a plain data connection");

        // A client that trusts another CA does not accept the node.
        let other = dir.path().join("other-ca");
        make_certs(&other, "node", HOSTS);
        let mut stranger = conf(n0);
        stranger.tls.ca = other.join("ca.pem").display().to_string();
        expect_error(Client::connect(&stranger).await, "invalid peer certificate");
        wait_log(n0, "refused a client connection");
    });

    // The CLI over TLS, with the settings in its environment.
    let file = dir.path().join("put.bin");
    let bytes = random_bytes(1 << 20, 9);
    std::fs::write(&file, &bytes).unwrap();
    n1.cli_ok(&["fs", "put", file.to_str().unwrap(), "/cli.bin"]);
    assert!(
        cat(n0, "/cli.bin") == bytes,
        "fs cat over TLS returned other bytes"
    );

    // A FUSE mount over TLS (its data through the data port).
    let mnt = FuseMount::start(
        n0,
        &dir.path().join("mnt"),
        &["-c", "client.short_circuit=false"],
    );
    assert!(std::fs::read(mnt.path("cli.bin")).unwrap() == bytes);
    let through_mount = random_bytes(2 << 20, 11);
    std::fs::write(mnt.path("fuse.bin"), &through_mount).unwrap();
    drop(mnt);
    assert!(
        cat(n1, "/fuse.bin") == through_mount,
        "a file written through the mount reads back other bytes"
    );

    // A plain peer on the cluster port is refused and logged.
    let mut raw = TcpStream::connect(&n0.cluster_addr).unwrap();
    raw.write_all(b"\0\0\0\0\0\0\0\x10not a handshake!")
        .unwrap();
    wait_log(n0, "refused a plain connection on the cluster port");

    // A peer that opens the cluster port and says nothing holds up no one:
    // a third node joins while it waits (its handshake timeout is 60s).
    let _idle = TcpStream::connect(&n0.cluster_addr).unwrap();
    let mut third_args = cluster_args.clone();
    third_args.extend(FAST_CLUSTER.iter().map(|s| s.to_string()));
    third_args.extend(["--seeds".to_string(), n0.cluster_addr.clone()]);
    let started = Instant::now();
    let n2 = NodeProcess::start_on(&dir.path().join("c/n2"), "127.0.0.3", &strs(&third_args));
    wait_for(
        WithLog(
            "a third node to join beside an idle connection".into(),
            &n2.log,
        ),
        Duration::from_secs(30),
        || (n2.members_up() == 3).then_some(()),
    );
    println!("third node joined in {:?}", started.elapsed());

    // A node with a certificate of another CA cannot join: both sides
    // refuse the handshake, and it says why.
    let other = dir.path().join("other-ca");
    let mut rogue_args = tls_args(&other, "node");
    rogue_args.extend(
        [
            "-c",
            "cluster.cookie=test-cookie",
            "-c",
            "cluster.join_timeout=5s",
            "-c",
            "http.listen=off",
            "--listen",
            "127.0.0.4:0",
            "-c",
            "node.cluster_listen=127.0.0.4:0",
            "-c",
            "data.listen=127.0.0.4:0",
            "--seeds",
            &n0.cluster_addr,
        ]
        .map(String::from),
    );
    let rogue_dir = dir.path().join("rogue");
    let out = Command::new(bin("curvine-node"))
        .args(["start", "--data-dir"])
        .arg(&rogue_dir)
        .args(["-c"])
        .arg(format!(
            "data.tiers=[MEM:64MiB]{}",
            dir.path().join("rogue.mem").display()
        ))
        .args(&rogue_args)
        .env_remove("CURVINE_CONF")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a node of another CA joined:\n{stderr}"
    );
    assert!(
        stderr.contains("cannot join the cluster") && stderr.contains("invalid peer certificate"),
        "the joining node does not say why it was refused:\n{stderr}"
    );
    wait_log(n0, "refused a cluster connection");
    assert_eq!(n0.members_up(), 3, "the refused node counts as a member");
}

#[test]
fn unusable_tls_files_stop_a_node_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certs(&certs, "node", HOSTS);
    make_certs(&certs, "other", HOSTS);
    let start = |args: &[String]| {
        Command::new(bin("curvine-node"))
            .args(["start", "--data-dir"])
            .arg(dir.path().join("n"))
            .args(["--listen", "127.0.0.1:0", "-c", "http.listen=off"])
            .args(args)
            .env_remove("CURVINE_CONF")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let mut missing_ca = tls_args(&certs, "node");
    missing_ca[3] = "tls.ca=/nonexistent/ca.pem".into();
    let mut wrong_key = tls_args(&certs, "node");
    wrong_key[7] = format!("tls.key={}", certs.join("other.key").display());
    for (args, wanted) in [
        (missing_ca, "tls.ca (/nonexistent/ca.pem): cannot read it"),
        (wrong_key, "does not fit tls.cert"),
        (vec!["-c".into(), "tls.enabled=true".into()], "'tls.ca'"),
    ] {
        let out = start(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(wanted), "{args:?}: {err} lacks {wanted:?}");
    }
}

#[test]
fn what_crosses_the_client_port_is_unreadable_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certs(&certs, "node", HOSTS);
    let tls_node = NodeProcess::start(&dir.path().join("tls"), &strs(&args(&certs, &[])));
    let plain_node = NodeProcess::start(&dir.path().join("plain"), &[]);
    let rt = runtime();
    for (node, encrypted) in [(&plain_node, false), (&tls_node, true)] {
        let relay = Relay::start(&node.addr);
        let conf = ClientConf {
            cluster: vec![relay.addr.clone()],
            connections: 1,
            ..node.client_conf()
        };
        rt.block_on(async {
            let c = Client::connect(&conf).await.unwrap();
            c.mkdir("/wire-secret-name", true).await.unwrap();
            c.stat("/wire-secret-name").await.unwrap();
        });
        assert!(relay.bytes() > 0, "nothing went through the relay");
        assert_eq!(
            relay.saw("wire-secret-name"),
            !encrypted,
            "a name sent to the {} node was {} on the wire",
            if encrypted { "TLS" } else { "plain" },
            if encrypted { "readable" } else { "not found" },
        );
    }
}

//! The CLI against a real node process: output like the Unix tools, errors
//! as one line with a non-zero exit, JSON for scripts, restarts keep data.

use std::io::{Read, Write};

use curvine_integration::{bin, NodeProcess};

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(node: &NodeProcess, args: &[&str]) -> String {
    let out = node.cli(args);
    assert!(
        out.status.success(),
        "curvine-cli {args:?} failed: {}",
        stderr(&out)
    );
    stdout(&out)
}

#[test]
fn namespace_commands_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = NodeProcess::start(&dir.path().join("node"), &[]);

    ok(&node, &["fs", "mkdir", "-p", "/data/train/images"]);
    ok(
        &node,
        &["fs", "touch", "/data/train/a.jpg", "/data/train/b.jpg"],
    );
    ok(&node, &["fs", "ln", "-s", "/data/train", "/data/latest"]);
    assert_eq!(
        ok(&node, &["fs", "ls", "/data/train"]),
        "a.jpg\nb.jpg\nimages\n"
    );
    let long = ok(&node, &["fs", "ls", "-l", "/data"]);
    assert!(
        long.contains("lrwxrwxrwx") && long.contains("latest -> /data/train"),
        "{long}"
    );
    assert!(
        long.lines()
            .any(|l| l.starts_with("drwxr-xr-x") && l.ends_with(" train")),
        "{long}"
    );
    assert_eq!(
        ok(&node, &["fs", "readlink", "/data/latest"]),
        "/data/train\n"
    );
    // Relative paths, '.' and '..' as a shell user expects (from the root).
    assert_eq!(
        ok(&node, &["fs", "ls", "data/./train/images/../.."]),
        "latest\ntrain\n"
    );
    // Through the symlink.
    assert_eq!(ok(&node, &["fs", "ls", "/data/latest/images"]), "");

    let recursive = ok(&node, &["fs", "ls", "-R", "/data"]);
    assert!(recursive.contains("/data/train/images:"), "{recursive}");

    // A hard link: another name of the same file, counted in both.
    ok(
        &node,
        &["fs", "ln", "/data/train/b.jpg", "/data/b-link.jpg"],
    );
    let long = ok(&node, &["fs", "ls", "-l", "/data/train"]);
    assert!(
        long.lines()
            .any(|l| l.starts_with("-rw-r--r--   2 ") && l.ends_with(" b.jpg")),
        "{long}"
    );
    let out = node.cli(&["fs", "ln", "/data/train", "/data/train-link"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot have another name"),
        "{out:?}"
    );
    ok(&node, &["fs", "rm", "/data/b-link.jpg"]);

    // mv into a directory keeps the name, like mv.
    ok(&node, &["fs", "mkdir", "/archive"]);
    ok(&node, &["fs", "mv", "/data/train/a.jpg", "/archive"]);
    assert_eq!(ok(&node, &["fs", "ls", "/archive"]), "a.jpg\n");

    // Errors: one line naming the command and path, non-zero exit.
    let out = node.cli(&["fs", "mkdir", "/missing/child"]);
    assert!(!out.status.success());
    assert_eq!(
        stderr(&out),
        "curvine-cli: mkdir /missing/child: no such file or directory\n"
    );
    let out = node.cli(&["fs", "mv", "/data", "/data/train/inside"]);
    assert_eq!(
        stderr(&out),
        "curvine-cli: mv /data: invalid argument: cannot move a directory into itself\n"
    );
    let out = node.cli(&["fs", "rmdir", "/data"]);
    assert_eq!(
        stderr(&out),
        "curvine-cli: rmdir /data: directory not empty\n"
    );
    let out = node.cli(&["fs", "rm", "/data"]);
    assert_eq!(stderr(&out), "curvine-cli: rm /data: is a directory\n");
    let long_name = format!("/{}", "n".repeat(256));
    let out = node.cli(&["fs", "touch", &long_name]);
    assert!(
        stderr(&out).contains("file name too long"),
        "{}",
        stderr(&out)
    );
    let out = node.cli(&["fs", "mkdir", "/archive"]);
    assert_eq!(stderr(&out), "curvine-cli: mkdir /archive: file exists\n");

    // JSON for scripts.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&node, &["--json", "fs", "stat", "/archive/a.jpg"])).unwrap();
    assert_eq!(json["type"], "file");
    assert_eq!(json["path"], "/archive/a.jpg");
    let report: serde_json::Value =
        serde_json::from_str(&ok(&node, &["--json", "report"])).unwrap();
    assert_eq!(report["shard_count"], 16);
    let inodes: u64 = report["nodes"][0]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["inodes"].as_u64().unwrap())
        .sum();
    // root, data, train, images, b.jpg, latest, archive, a.jpg
    assert_eq!(inodes, 8);
    // Each shard that took a change reports its Raft group: this node is
    // its one member and leader, and has applied all it committed.
    let groups: Vec<&serde_json::Value> = report["nodes"][0]["shards"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.get("group").filter(|g| !g.is_null()))
        .collect();
    assert!(!groups.is_empty(), "{report}");
    for g in &groups {
        assert_eq!(g["voters"].as_array().unwrap().len(), 1, "{g}");
        assert_eq!(g["leader"], g["voters"][0], "{g}");
        assert!(g["term"].as_u64().unwrap() >= 1, "{g}");
        assert_eq!(g["commit"], g["applied"], "{g}");
    }
    let text = ok(&node, &["admin", "shards"]);
    assert!(
        text.contains("leader") && text.contains("applied"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.matches(node.node_id.as_str()).count() == 3),
        "no shard names its node as node, replica and leader:\n{text}"
    );

    // Extended attributes.
    ok(
        &node,
        &["fs", "xattr", "set", "/archive/a.jpg", "user.label", "cat"],
    );
    ok(
        &node,
        &[
            "fs",
            "xattr",
            "set",
            "/archive/a.jpg",
            "user.raw",
            "00ff",
            "--hex",
        ],
    );
    assert_eq!(
        ok(
            &node,
            &["fs", "xattr", "get", "/archive/a.jpg", "user.label"]
        ),
        "cat\n"
    );
    assert_eq!(
        ok(&node, &["fs", "xattr", "get", "/archive/a.jpg", "user.raw"]),
        "0x00ff\n"
    );
    assert_eq!(
        ok(&node, &["fs", "xattr", "list", "/archive/a.jpg"]),
        "user.label\nuser.raw\n"
    );
    let out = node.cli(&[
        "fs",
        "xattr",
        "set",
        "/archive/a.jpg",
        "user.label",
        "dog",
        "--create",
    ]);
    assert_eq!(
        stderr(&out),
        "curvine-cli: xattr set /archive/a.jpg: file exists: attribute user.label\n"
    );
    ok(
        &node,
        &["fs", "xattr", "rm", "/archive/a.jpg", "user.label"],
    );
    let out = node.cli(&["fs", "xattr", "get", "/archive/a.jpg", "user.label"]);
    assert_eq!(
        stderr(&out),
        "curvine-cli: xattr get /archive/a.jpg: no data available: attribute user.label\n"
    );
    let big = "v".repeat(64 * 1024 + 1);
    let out = node.cli(&["fs", "xattr", "set", "/archive/a.jpg", "user.big", &big]);
    assert!(
        stderr(&out).contains("argument list too long"),
        "{}",
        stderr(&out)
    );

    // rm -r and a consistent namespace afterwards.
    ok(&node, &["fs", "rm", "-r", "/data"]);
    assert_eq!(ok(&node, &["fs", "ls", "/"]), "archive\n");
    assert!(ok(&node, &["admin", "fsck"]).contains("namespace is consistent"));

    // A clean stop and a restart keep everything.
    assert_eq!(node.terminate(), Some(0));
    node.restart(&[]);
    assert!(
        node.log_text().contains("reopened cluster"),
        "{}",
        node.log_text()
    );
    assert_eq!(ok(&node, &["fs", "ls", "/archive"]), "a.jpg\n");
}

#[test]
fn conf_show_prints_values_and_sources() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("c.toml");
    std::fs::write(&conf, "[client]\nconnections = 3\n").unwrap();
    let out = std::process::Command::new(bin("curvine-cli"))
        .args(["conf", "show", "--conf"])
        .arg(&conf)
        .args(["-c", "log.level=debug"])
        .env("CURVINE_META_GROUP_COMMIT_MAX", "64")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(
        text.lines()
            .any(|l| l.starts_with("client.connections = 3") && l.contains("# file")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("log.level = \"debug\"") && l.contains("# flag -c log.level")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("meta.group_commit_max = 64")
                && l.contains("# env CURVINE_META_GROUP_COMMIT_MAX")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("cluster.shards = 16") && l.contains("# default")),
        "{text}"
    );

    let out = std::process::Command::new(bin("curvine-cli"))
        .args(["conf", "show", "-c", "meta.map_size=huge"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("meta.map_size") && stderr(&out).contains("huge"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_config_stops_the_node_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin("curvine-node"))
        .args(["start", "--data-dir"])
        .arg(dir.path())
        .args(["-c", "cluster.shards=0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("cluster.shards") && err.contains("1 to 256"),
        "{err}"
    );
}

#[test]
fn clients_must_prove_the_cluster_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let cli = |env: &[(&str, &str)], args: &[&str]| {
        let mut c = std::process::Command::new(bin("curvine-cli"));
        c.args(["--cluster", &node.addr])
            .args(args)
            .env_remove("CURVINE_CONF")
            .env("HOME", &home);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    // A wrong cookie, and none at all, are refused with the reason.
    for env in [&[("CURVINE_CLIENT_COOKIE", "not-the-cookie")][..], &[]] {
        let out = cli(env, &["fs", "ls", "/"]);
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("wrong cluster cookie"),
            "{env:?}: {}",
            stderr(&out)
        );
    }
    assert!(node.log_text().contains("refused client"));
    // The right one, given or found in the node's identity file (readable
    // by its owner only).
    let cookie = node.cookie();
    assert!(
        cli(&[("CURVINE_CLIENT_COOKIE", &cookie)], &["fs", "ls", "/"])
            .status
            .success()
    );
    assert!(
        cli(&[("CURVINE_CLUSTER_COOKIE", &cookie)], &["fs", "ls", "/"])
            .status
            .success()
    );
    let data_dir = node.data_dir.display().to_string();
    let out = cli(&[("CURVINE_NODE_DATA_DIR", &data_dir)], &["fs", "ls", "/"]);
    assert!(out.status.success(), "{}", stderr(&out));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(node.data_dir.join("identity.toml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o077,
        0,
        "identity.toml is readable by others: {mode:o}"
    );
    // The cookie never crosses the wire: a proof for another cluster's
    // challenge does not open this one.
    let mut stream = std::net::TcpStream::connect(&node.addr).unwrap();
    stream
        .write_all(&curvine_messages::codec::Hello::current().encode())
        .unwrap();
    let mut hello = [0u8; 6];
    stream.read_exact(&mut hello).unwrap();
    let read_frame = |stream: &mut std::net::TcpStream| {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).unwrap();
        let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
        stream.read_exact(&mut frame).unwrap();
        frame
    };
    let reply: curvine_messages::rpc::HelloReply =
        curvine_messages::codec::from_bytes("hello", &read_frame(&mut stream)).unwrap();
    assert!(reply.accepted && reply.challenge.len() >= 16);
    let proof =
        curvine_wire::cookie::ClientKey::new(&cookie).proof(&reply.challenge, "another-cluster");
    let auth =
        curvine_messages::codec::to_bytes("auth", &curvine_messages::rpc::ClientAuth { proof })
            .unwrap();
    stream
        .write_all(&(auth.len() as u32).to_be_bytes())
        .unwrap();
    stream.write_all(&auth).unwrap();
    let answer: curvine_messages::rpc::AuthReply =
        curvine_messages::codec::from_bytes("auth reply", &read_frame(&mut stream)).unwrap();
    assert!(!answer.accepted && answer.message.contains("wrong cluster cookie"));
}

#[test]
fn other_protocol_versions_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    let mut stream = std::net::TcpStream::connect(&node.addr).unwrap();
    stream.write_all(b"CRVN\x00\x63").unwrap();
    let mut hello = [0u8; 6];
    stream.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..4], b"CRVN");
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).unwrap();
    let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut frame).unwrap();
    let reply: curvine_messages::rpc::HelloReply =
        curvine_messages::codec::from_bytes("hello", &frame).unwrap();
    assert!(!reply.accepted);
    assert!(
        reply.message.contains("protocol version 99"),
        "{}",
        reply.message
    );
    // Garbage instead of a hello does not hurt the node.
    let mut junk = std::net::TcpStream::connect(&node.addr).unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    drop(junk);
    assert!(node.cli(&["fs", "ls", "/"]).status.success());
}

#[test]
fn data_commands() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    let src = dir.path().join("src.bin");
    let bytes: Vec<u8> = (0..3_500_000u32).map(|i| (i * 31 % 253) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let src_s = src.to_str().unwrap();

    ok(&node, &["fs", "mkdir", "/d"]);
    // Into a directory: keeps the name.
    ok(&node, &["fs", "put", "--block-size", "1MiB", src_s, "/d"]);
    let blocks = ok(&node, &["fs", "blocks", "/d/src.bin"]);
    assert!(
        blocks.contains("3500000 bytes in 4 blocks of 1.0MiB"),
        "{blocks}"
    );
    assert_eq!(blocks.matches(":MEM").count(), 4, "{blocks}");
    // An existing file is kept unless -f.
    let out = node.cli(&["fs", "put", src_s, "/d/src.bin"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("put /d/src.bin: file exists"),
        "{}",
        stderr(&out)
    );
    // get to a file and to stdout; cat, head, tail.
    let back = dir.path().join("back.bin");
    ok(&node, &["fs", "get", "/d/src.bin", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == bytes);
    let out = node.cli(&["fs", "get", "/d/src.bin", "-"]);
    assert!(out.status.success() && out.stdout == bytes);
    let out = node.cli(&["fs", "cat", "/d/src.bin"]);
    assert!(out.stdout == bytes);
    let out = node.cli(&["fs", "head", "-b", "10", "/d/src.bin"]);
    assert_eq!(out.stdout, &bytes[..10]);
    let out = node.cli(&["fs", "tail", "-b", "10", "/d/src.bin"]);
    assert_eq!(out.stdout, &bytes[bytes.len() - 10..]);
    // put from stdin.
    let mut child = node
        .command("curvine-cli")
        .args(["--cluster", &node.addr, "fs", "put", "-", "/d/stdin.txt"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(ok(&node, &["fs", "cat", "/d/stdin.txt"]), "from stdin\n");
    // cp within the cluster, du, df.
    ok(&node, &["fs", "cp", "/d/src.bin", "/d/copy.bin"]);
    assert!(node.cli(&["fs", "cat", "/d/copy.bin"]).stdout == bytes);
    let du = ok(&node, &["fs", "du", "/d"]);
    assert!(du.starts_with(&format!("{} ", 2 * 3_500_000 + 11)), "{du}");
    let df = ok(&node, &["fs", "df", "-H"]);
    assert!(df.contains("MEM") && df.contains("capacity"), "{df}");
    let df: serde_json::Value = serde_json::from_str(&ok(&node, &["--json", "fs", "df"])).unwrap();
    assert!(df[0]["used"].as_u64().unwrap() >= 2 * 3_500_000);
    // stat shows the layout.
    let stat = ok(&node, &["fs", "stat", "/d/src.bin"]);
    assert!(stat.contains("Block size: 1.0MiB"), "{stat}");
    // Clear errors.
    let out = node.cli(&["fs", "put", "/no/such/file", "/x"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("put /no/such/file"),
        "{}",
        stderr(&out)
    );
    let out = node.cli(&["fs", "cat", "/d"]);
    assert!(
        stderr(&out).contains("cat /d: is a directory"),
        "{}",
        stderr(&out)
    );
    let out = node.cli(&["fs", "put", "--block-size", "100KB", src_s, "/y"]);
    assert!(
        stderr(&out).contains("multiple of 64KiB"),
        "{}",
        stderr(&out)
    );
    let out = node.cli(&["fs", "put", "--storage", "TAPE", src_s, "/y"]);
    assert!(
        stderr(&out).contains("unknown storage tier"),
        "{}",
        stderr(&out)
    );
    let out = node.cli(&["fs", "put", "--storage", "SSD", src_s, "/y"]);
    assert!(stderr(&out).contains("no SSD tier"), "{}", stderr(&out));
    // A failed replacement keeps the old content; a good one replaces it.
    let out = node.cli(&["fs", "put", "-f", "--storage", "SSD", src_s, "/d/stdin.txt"]);
    assert!(!out.status.success());
    assert_eq!(ok(&node, &["fs", "cat", "/d/stdin.txt"]), "from stdin\n");
    ok(&node, &["fs", "put", "-f", src_s, "/d/stdin.txt"]);
    assert!(node.cli(&["fs", "cat", "/d/stdin.txt"]).stdout == bytes);
    // A failed put leaves no file behind.
    assert!(!stderr(&node.cli(&["fs", "stat", "/y"])).is_empty());
}

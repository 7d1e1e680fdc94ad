//! `curvine-bench` stays usable: a tiny run of every metadata phase against a
//! real node and against a local directory. Checks the output, never timings.

use std::process::Command;

use curvine_integration::{bin, NodeProcess};

fn phases(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per phase"))
        .collect()
}

fn check(rows: &[serde_json::Value], prefix: &str, files: u64) {
    let names: Vec<&str> = rows.iter().map(|r| r["action"].as_str().unwrap()).collect();
    let expected: Vec<String> = ["create", "stat", "ls", "rename", "unlink"]
        .iter()
        .map(|p| format!("{prefix}.{p}"))
        .collect();
    assert_eq!(names, expected);
    for row in rows {
        assert!(row["ops_per_sec"].as_f64().unwrap() > 0.0, "{row}");
        // Every phase touches every entry once; ls lists each directory once.
        assert_eq!(row["entries"].as_u64().unwrap(), files, "{row}");
    }
}

#[test]
fn metadata_actions_run_against_a_node_and_locally() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    let args = [
        "--client-threads",
        "4",
        "--file-num",
        "200",
        "--dir-num",
        "7",
        "--json",
    ];
    let out = node
        .command("curvine-bench")
        .args([
            "--cluster",
            &node.addr,
            "--action",
            "meta.all",
            "--dir",
            "/bench",
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check(&phases(&String::from_utf8_lossy(&out.stdout)), "meta", 200);
    // Everything the run made is gone again: unlink removed the files.
    assert_eq!(
        node.cli(&["fs", "ls", "/bench"])
            .stdout
            .iter()
            .filter(|b| **b == b'\n')
            .count(),
        7
    );

    let local = dir.path().join("local");
    let out = Command::new(bin("curvine-bench"))
        .args(["--action", "local.meta.all", "--dir"])
        .arg(&local)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check(
        &phases(&String::from_utf8_lossy(&out.stdout)),
        "local.meta",
        200,
    );

    let out = Command::new(bin("curvine-bench"))
        .args(["--action", "meta.fly"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown action 'meta.fly'"));
}

fn bench(node: &NodeProcess, args: &[&str]) -> serde_json::Value {
    let out = node
        .command("curvine-bench")
        .args(args)
        .args([
            "--file-num",
            "3",
            "--file-size",
            "300KB",
            "--buf-size",
            "64KB",
            "--client-threads",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON object")
}

#[test]
fn data_actions_write_read_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    let local = dir.path().join("local");
    let local = local.to_str().unwrap();
    for (action, target) in [
        (
            "fs.write",
            vec!["--cluster", node.addr.as_str(), "--dir", "/big"],
        ),
        (
            "fs.read",
            vec!["--cluster", node.addr.as_str(), "--dir", "/big"],
        ),
        ("local.write", vec!["--dir", local]),
        ("local.read", vec!["--dir", local]),
    ] {
        let mut args = vec!["--action", action];
        args.extend(target);
        let row = bench(&node, &args);
        assert_eq!(row["action"], action);
        assert_eq!(row["bytes"].as_u64().unwrap(), 3 * 300 * 1024, "{row}");
        assert!(row["gib_per_sec"].as_f64().unwrap() > 0.0);
    }
    // A read that finds other content than the tool wrote fails.
    std::fs::write(format!("{local}/file-00001"), vec![1u8; 300 * 1024]).unwrap();
    let out = Command::new(bin("curvine-bench"))
        .args(["--action", "local.read", "--dir", local, "--file-num", "3"])
        .args(["--file-size", "300KB", "--buf-size", "64KB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not hold what was written"));
}

#[test]
fn small_file_actions_run_against_s3_a_mount_and_a_fuse_mount() {
    let Some(s3) = curvine_integration::TestS3::get() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    let loc = s3.location("bench");
    let run = |extra: &[&str]| {
        let out = node
            .command("curvine-bench")
            .args(["--cluster", &node.addr, "--ufs", &loc, "--file-num", "40"])
            .args(["--reads", "60", "--client-threads", "3", "--json"])
            .args(s3.props())
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        phases(&String::from_utf8_lossy(&out.stdout))
    };
    let put = run(&["--action", "ufs.put"]);
    assert_eq!(put[0]["files"], 40);
    let direct = run(&["--action", "ufs.read"]);
    assert_eq!(direct[0]["phase"], "direct");
    let bytes = direct[0]["bytes"].as_u64().unwrap();
    assert!(
        (40 * 60_000..=40 * 140_000).contains(&bytes),
        "{}",
        direct[0]
    );
    let mut args: Vec<String> = vec!["mount".into(), loc.clone(), "/b2".into()];
    args.extend(s3.props());
    node.cli_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let cached = run(&["--action", "fs.small-read", "--dir", "/b2"]);
    let phases: Vec<&str> = cached
        .iter()
        .map(|r| r["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["cold", "warm"]);
    assert_eq!(
        cached[0]["bytes"].as_u64(),
        Some(bytes),
        "every file read whole"
    );
    assert_eq!(cached[1]["files"], 60);
    // The same files through a FUSE mount with plain file reads.
    let m = curvine_integration::FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    let mnt_b2 = m.path("b2");
    let local = run(&[
        "--action",
        "local.small-read",
        "--dir",
        mnt_b2.to_str().unwrap(),
    ]);
    assert_eq!(local[0]["phase"], "cold");
    assert_eq!(
        local[0]["bytes"].as_u64(),
        Some(bytes),
        "every file read whole"
    );
    assert_eq!(local[1]["files"], 60);
}

//! Output formatting: JSON printing, attributes and times as `ls -l` and
//! `stat` show them, and the text and JSON of reports, scrubs, actor trees,
//! mounts and load jobs.

use serde_json::json;

use curvine_messages::names;
use curvine_messages::rpc::ListEntry;
use curvine_messages::{Attr, FileKind};

/// Prints `value` as indented JSON. A name's bytes that are not UTF-8 are
/// `\udcNN` (see `curvine_messages::names`).
pub fn print_json<T: serde::Serialize>(value: &T) {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    println!("{}", names::json_text(&text));
}

/// Prints `value` as JSON on one line, names as [`print_json`] does.
pub fn print_json_line<T: serde::Serialize>(value: &T) {
    let text = serde_json::to_string(value).unwrap_or_default();
    println!("{}", names::json_text(&text));
}

/// Prints a list: a JSON array with `--json`, else a line per item.
pub fn print_list<T>(
    items: &[T],
    json_out: bool,
    json: impl Fn(&T) -> serde_json::Value,
    line: impl Fn(&T) -> String,
) {
    if json_out {
        print_json(&items.iter().map(json).collect::<Vec<_>>());
    } else {
        for item in items {
            out!("{}", line(item));
        }
    }
}

pub fn format_time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

pub fn mode_string(attr: &Attr) -> String {
    let mut s = String::with_capacity(10);
    s.push(attr.kind.letter());
    for shift in [6, 3, 0] {
        let bits = (attr.mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

pub fn attr_json(attr: &Attr) -> serde_json::Value {
    json!({
        "ino": attr.ino, "type": attr.kind.name(), "mode": format!("{:04o}", attr.mode),
        "uid": attr.uid, "gid": attr.gid, "size": attr.size, "nlink": attr.nlink,
        "atime_ns": attr.atime_ns, "mtime_ns": attr.mtime_ns, "ctime_ns": attr.ctime_ns,
        "symlink": attr.symlink, "block_size": attr.block_size, "replicas": attr.replicas,
        "storage": attr.storage.map(|t| t.name()),
        "writing": attr.writing.as_ref().map(|l| l.client.clone()),
        "ufs": attr.ufs.as_ref().map(ufs_json),
        "device": device_numbers(attr),
    })
}

/// Whether a file under a mount is in its UFS: `persisted`, `pending` or `failed`.
fn ufs_state_word(u: &curvine_messages::mount::UfsState) -> &'static str {
    match u.persist {
        curvine_messages::mount::Persist::Synced => "persisted",
        curvine_messages::mount::Persist::Pending { .. } => "pending",
        curvine_messages::mount::Persist::Failed { .. } => "failed",
    }
}

fn ufs_json(u: &curvine_messages::mount::UfsState) -> serde_json::Value {
    let (attempts, error) = match &u.persist {
        curvine_messages::mount::Persist::Failed {
            attempts, error, ..
        } => (Some(*attempts), Some(error.clone())),
        _ => (None, None),
    };
    json!({
        "mount": u.mount, "state": ufs_state_word(u), "len": u.len, "mtime_ns": u.mtime_ns,
        "etag": u.etag, "checked_ns": u.checked_ns, "attempts": attempts, "error": error,
    })
}

/// A device node's major and minor numbers, `MAJOR,MINOR` as `ls -l`
/// shows them (the kernel's encoding of a 32-bit `dev_t`); `None` for
/// other kinds.
pub fn device_numbers(attr: &Attr) -> Option<String> {
    if !matches!(
        attr.kind,
        FileKind::CharDevice(_) | FileKind::BlockDevice(_)
    ) {
        return None;
    }
    let dev = attr.kind.rdev();
    let major = (dev >> 8) & 0xfff;
    let minor = (dev & 0xff) | ((dev >> 12) & 0xfff00);
    Some(format!("{major},{minor}"))
}

fn long_line(name: &str, attr: &Attr) -> String {
    let mut line = format!(
        "{} {:>3} {:>5} {:>5} {:>12} {} {}",
        mode_string(attr),
        attr.nlink,
        attr.uid,
        attr.gid,
        device_numbers(attr).unwrap_or_else(|| attr.size.to_string()),
        format_time(attr.mtime_ns),
        name
    );
    if let Some(target) = &attr.symlink {
        line.push_str(" -> ");
        line.push_str(target);
    }
    line
}

pub fn print_entries(entries: &[ListEntry], long: bool) {
    for e in entries {
        if long {
            out!("{}", long_line(&e.name, &e.attr));
        } else {
            out!("{}", e.name);
        }
    }
}

pub fn show_value(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) => text.to_string(),
        Err(_) => format!(
            "0x{}",
            value.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

/// " for 12s" after a state.
pub fn since(ns: i64) -> String {
    if ns <= 0 {
        return String::new();
    }
    let secs = (curvine_messages::now_ns() - ns).max(0) / 1_000_000_000;
    match secs {
        s if s < 120 => format!(" for {s}s"),
        s if s < 7200 => format!(" for {}m", s / 60),
        s => format!(" for {}h", s / 3600),
    }
}

/// `admin scrub` as text: a line per node, a line per problem.
pub fn format_scrub(nodes: &[curvine_messages::rpc::NodeScrub]) -> String {
    let mut out = String::new();
    for n in nodes {
        match &n.error {
            Some(e) => out.push_str(&format!("node {}: could not scrub: {e}\n", n.node)),
            None => out.push_str(&format!(
                "node {}: {} blocks, {} verified in {:.1}s, {} problem(s)\n",
                n.node,
                n.blocks,
                curvine_messages::human_bytes(n.bytes),
                n.seconds,
                n.problems.len()
            )),
        }
        for p in &n.problems {
            out.push_str(&format!(
                "  block {:#x} ({} tier, {}): {}; {}\n",
                p.block, p.tier, p.path, p.problem, p.action
            ));
        }
    }
    out
}

/// The supervision trees as `actors` prints them: one table per node.
pub fn format_actor_trees(trees: &[curvine_messages::stats::NodeActors]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for t in trees {
        let _ = writeln!(out, "node {}", t.node);
        let Some(root) = &t.root else {
            let _ = writeln!(
                out,
                "  (no answer: {})",
                t.error.as_deref().unwrap_or("unknown")
            );
            continue;
        };
        let rows: Vec<(String, &curvine_messages::stats::ActorInfo)> = root
            .walk()
            .into_iter()
            .map(|(depth, a)| (format!("{}{}", "  ".repeat(depth + 1), a.name), a))
            .collect();
        let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(5).max(5);
        let _ = writeln!(
            out,
            "{:width$}  {:>8}  {:>8}  {:>7}  {:>11}  {:>6}  {:>8}  {:>10}",
            "ACTOR", "ID", "STATUS", "MAILBOX", "HANDLED", "ERRORS", "RESTARTS", "UPTIME"
        );
        for (name, a) in rows {
            let _ = writeln!(
                out,
                "{name:width$}  {:>8}  {:>8}  {:>7}  {:>11}  {:>6}  {:>8}  {:>10}",
                a.id,
                a.status,
                a.mailbox.map_or("-".to_string(), |m| m.to_string()),
                a.handled,
                a.errors,
                a.restarts,
                uptime(a.uptime_ms),
            );
        }
    }
    out
}

fn uptime(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

pub fn mount_json(m: &curvine_messages::mount::MountInfo) -> serde_json::Value {
    json!({
        "id": m.id, "path": m.path, "ufs": m.ufs, "write_type": m.write_type.to_string(),
        "properties": m.redacted().props, "ttl_ms": m.ttl_ms,
        "check_interval_ms": m.check_interval_ms, "read_verify_ufs": m.read_verify_ufs,
        "auto_cache": m.auto_cache, "replicas": m.replicas, "block_size": m.block_size,
        "storage_type": m.storage.map(|t| t.name()), "created_ns": m.created_ns,
    })
}

pub fn mount_line(m: &curvine_messages::mount::MountInfo) -> String {
    let shown = m.redacted();
    let mut line = format!("{} on {} ({}", shown.ufs, shown.path, shown.write_type);
    for (k, v) in &shown.props {
        line.push_str(&format!(", {k}={v}"));
    }
    if m.ttl_ms > 0 {
        line.push_str(&format!(", ttl={}ms", m.ttl_ms));
    }
    if let Some(ms) = m.check_interval_ms {
        line.push_str(&format!(", check_interval={ms}ms"));
    }
    if m.read_verify_ufs {
        line.push_str(", read_verify_ufs");
    }
    if !m.auto_cache {
        line.push_str(", no_auto_cache");
    }
    if let Some(r) = m.replicas {
        line.push_str(&format!(", replicas={r}"));
    }
    if let Some(bs) = m.block_size {
        line.push_str(&format!(
            ", block_size={}",
            curvine_messages::human_bytes(bs)
        ));
    }
    if let Some(t) = m.storage {
        line.push_str(&format!(", storage_type={}", t.name()));
    }
    line.push(')');
    line
}

pub fn job_json(j: &curvine_messages::mount::LoadJob) -> serde_json::Value {
    json!({
        "id": j.id, "path": j.path, "state": j.state.to_string(),
        "files_total": j.files_total, "files_done": j.files_done,
        "files_skipped": j.files_skipped, "files_failed": j.files_failed,
        "bytes_total": j.bytes_total, "bytes_done": j.bytes_done,
        "created_ns": j.created_ns, "updated_ns": j.updated_ns, "finished_ns": j.finished_ns,
        "failures": j.failures.iter().map(|(p, e)| json!({"path": p, "error": e})).collect::<Vec<_>>(),
        "error": j.error, "no_overwrite": j.no_overwrite,
    })
}

pub fn job_line(j: &curvine_messages::mount::LoadJob) -> String {
    let end = if j.finished_ns > 0 {
        j.finished_ns
    } else {
        j.updated_ns
    };
    let secs = ((end - j.created_ns) as f64 / 1e9).max(0.001);
    let mut line = format!(
        "job {} {} {}: {}/{} files ({} skipped, {} failed), {} of {} in {:.1}s ({}/s)",
        j.id,
        j.path,
        j.state,
        j.files_done + j.files_skipped,
        j.files_total,
        j.files_skipped,
        j.files_failed,
        curvine_messages::human_bytes(j.bytes_done),
        curvine_messages::human_bytes(j.bytes_total),
        secs,
        curvine_messages::human_bytes((j.bytes_done as f64 / secs) as u64),
    );
    if !j.error.is_empty() {
        line.push_str(&format!("; {}", j.error));
    }
    line
}

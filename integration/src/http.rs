//! HTTP probes of a node's (or a mount's) metrics and dashboard ports.

use std::io::Read;
use std::time::Duration;

use crate::NodeProcess;

/// The node's counter `name` summed over its series that carry `label`
/// (from its Prometheus `/metrics`).
pub fn node_counter(node: &NodeProcess, name: &str, label: &str) -> u64 {
    let (_, body) = http_get(&node.http_addr, "/metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Runs `reads`, which reads `files` files whose blocks are on `node`, and
/// checks they took the short-circuit path: at least that many block files
/// opened on the node, no block streamed through its data port.
pub fn assert_short_circuit(node: &NodeProcess, files: u64, reads: impl FnOnce()) {
    let count = |kind: &str| {
        node_counter(
            node,
            "curvine_data_requests_total",
            &format!("kind=\"{kind}\""),
        )
    };
    let (local_before, streamed_before) = (count("open_local"), count("read"));
    reads();
    let opened = count("open_local") - local_before;
    assert!(
        opened >= files,
        "{opened} block files opened for {files} reads"
    );
    assert_eq!(
        count("read") - streamed_before,
        0,
        "blocks streamed through the data port"
    );
}

/// `GET path` on an HTTP port: the status code and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let (status, _, body) = http_get_with(addr, path, &[]);
    (status, body)
}

/// `GET path` with extra request headers: the status code, the response
/// head (status line and headers) and the body.
pub fn http_get_with(addr: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr)
        .unwrap_or_else(|e| panic!("cannot connect to http://{addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("http response");
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {text}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in: {head}"));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, head.to_string(), body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

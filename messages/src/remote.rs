//! Carrying typed requests and replies between nodes.
//!
//! ractor_cluster moves a message as a variant name, argument bytes and, for
//! a call, a reply port of bytes. These helpers bridge a typed reply port
//! (`RpcReplyPort<FsResult<T>>`) to a port of bytes and back, with the codec
//! of this crate. Decoding is total: bad, truncated or newer bytes become an
//! `FsError`, never a panic (a panic inside ractor_cluster's decoding would
//! drop the message silently).

use ractor::concurrency::{oneshot, spawn, timeout};
use ractor::RpcReplyPort;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{from_bytes, to_bytes, PROTOCOL_VERSION};
use crate::error::{FsError, FsResult};

/// Largest encoded reply or request sent between nodes. ractor_cluster tears
/// the whole session down for a frame over 16 MiB; larger replies become an
/// error instead, and bulk data travels over the data port.
pub const MAX_PEER_PAYLOAD: usize = 8 << 20;

/// Encodes a payload sent to another node: one byte of protocol version,
/// then postcard.
pub fn encode_peer<T: Serialize>(what: &'static str, value: &T) -> Vec<u8> {
    let mut out = vec![PROTOCOL_VERSION as u8];
    match to_bytes(what, value) {
        Ok(bytes) => out.extend_from_slice(&bytes),
        // Serialising our own plain data does not fail; should it, the
        // receiver sees an empty payload and answers a protocol error.
        Err(_) => out.clear(),
    }
    out
}

/// Decodes a payload from another node, checking its protocol version.
pub fn decode_peer<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> FsResult<T> {
    match bytes.split_first() {
        Some((&version, rest)) if version == PROTOCOL_VERSION as u8 => {
            from_bytes(what, rest).map_err(FsError::from)
        }
        Some((&version, _)) => Err(FsError::Protocol(format!(
            "a peer sent {what} in protocol version {version}, this node speaks {PROTOCOL_VERSION}; \
             run one release across the cluster"
        ))),
        None => Err(FsError::Protocol(format!("a peer sent an empty {what}"))),
    }
}

/// Encodes a reply, replacing one too large for the cluster link with an error.
pub fn encode_reply<T: Serialize>(result: &FsResult<T>) -> Vec<u8> {
    let bytes = encode_peer("reply", result);
    if bytes.len() <= MAX_PEER_PAYLOAD && !bytes.is_empty() {
        return bytes;
    }
    let error: FsResult<()> = Err(FsError::TooBig(format!(
        "a reply of {} bytes exceeds the {} byte limit between nodes",
        bytes.len(),
        MAX_PEER_PAYLOAD
    )));
    // `Err` encodes the same whatever the `Ok` type is.
    encode_peer("reply", &error)
}

/// A reply port of bytes that decodes what it receives into `port`. Used on
/// the sending node: the bytes come back from the remote actor.
pub fn bridge_out<T>(port: RpcReplyPort<FsResult<T>>) -> RpcReplyPort<Vec<u8>>
where
    T: DeserializeOwned + Send + 'static,
{
    let (tx, rx) = oneshot::<Vec<u8>>();
    let wait = port.get_timeout();
    spawn(async move {
        let bytes = match wait {
            Some(d) => match timeout(d, rx).await {
                Ok(Ok(b)) => b,
                _ => return,
            },
            None => match rx.await {
                Ok(b) => b,
                Err(_) => return,
            },
        };
        let result = decode_peer::<FsResult<T>>("reply", &bytes).unwrap_or_else(Err);
        let _ = port.send(result);
    });
    match wait {
        Some(d) => RpcReplyPort::from((tx, d)),
        None => RpcReplyPort::from(tx),
    }
}

/// A typed reply port whose value is encoded into `port`. Used on the
/// receiving node: the local actor answers the typed port. A port dropped
/// without an answer (the actor stopped) answers `Unavailable`.
pub fn bridge_in<T>(port: RpcReplyPort<Vec<u8>>) -> RpcReplyPort<FsResult<T>>
where
    T: Serialize + Send + 'static,
{
    let (tx, rx) = oneshot::<FsResult<T>>();
    let wait = port.get_timeout();
    spawn(async move {
        let result = match wait {
            Some(d) => match timeout(d, rx).await {
                Ok(Ok(r)) => r,
                // The caller has given up by now; answer nothing.
                Err(_) => return,
                Ok(Err(_)) => Err(FsError::Unavailable(
                    "the actor stopped while handling the request".into(),
                )),
            },
            None => rx.await.unwrap_or_else(|_| {
                Err(FsError::Unavailable(
                    "the actor stopped while handling the request".into(),
                ))
            }),
        };
        let _ = port.send(encode_reply(&result));
    });
    match wait {
        Some(d) => RpcReplyPort::from((tx, d)),
        None => RpcReplyPort::from(tx),
    }
}

/// Answers a port of bytes with an error (for a request that could not be
/// decoded or delivered).
pub fn fail_bytes(port: RpcReplyPort<Vec<u8>>, error: FsError) {
    let result: FsResult<()> = Err(error);
    let _ = port.send(encode_reply(&result));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn err_encodes_the_same_for_any_ok_type() {
        let a: FsResult<()> = Err(FsError::Io("x".into()));
        let b: FsResult<Vec<String>> = Err(FsError::Io("x".into()));
        assert_eq!(encode_peer("r", &a), encode_peer("r", &b));
        let back: FsResult<Vec<String>> = decode_peer("r", &encode_reply(&a)).unwrap();
        assert_eq!(back, Err(FsError::Io("x".into())));
    }

    #[test]
    fn foreign_version_and_garbage_are_errors() {
        let mut bytes = encode_peer("r", &7u32);
        bytes[0] = bytes[0].wrapping_add(1);
        assert!(matches!(
            decode_peer::<u32>("r", &bytes),
            Err(FsError::Protocol(_))
        ));
        assert!(decode_peer::<u32>("r", &[]).is_err());
        assert!(decode_peer::<String>("r", &[PROTOCOL_VERSION as u8, 200, 1]).is_err());
    }

    #[tokio::test]
    async fn a_call_crosses_both_bridges() {
        let (tx, rx) = oneshot::<FsResult<Vec<String>>>();
        let typed: RpcReplyPort<FsResult<Vec<String>>> = tx.into();
        let bytes_port = bridge_out(typed);
        let remote_typed: RpcReplyPort<FsResult<Vec<String>>> = bridge_in(bytes_port);
        remote_typed.send(Ok(vec!["a".into()])).unwrap();
        assert_eq!(rx.await.unwrap(), Ok(vec!["a".to_string()]));

        let (tx, rx) = oneshot::<FsResult<u64>>();
        let remote_typed: RpcReplyPort<FsResult<u64>> = bridge_in(bridge_out(tx.into()));
        drop(remote_typed);
        assert!(matches!(rx.await.unwrap(), Err(FsError::Unavailable(_))));
    }
}

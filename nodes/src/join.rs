//! A new node joining the cluster of its seeds: dial them, wait for a
//! member's gateway to appear, and ask it what cluster this is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ractor::rpc::CallResult;
use ractor::ActorRef;
use ractor_cluster::node::{NodeEventSubscription, NodeServerSessionInformation};
use ractor_cluster::NodeServerMessage;

use curvine_actors::cluster::gateway_of;
use curvine_actors::membership::{connected_nodes, Dialer};
use curvine_messages::cluster::{JoinInfo, PeerMsg};

/// Remembers sessions that closed before they authenticated.
#[derive(Default)]
struct Watch {
    authenticated: Mutex<Vec<ractor::ActorId>>,
    /// Sessions closed before they authenticated: the last peer, how many.
    refused: Mutex<(Option<String>, u32)>,
}

/// Refusals, with no session authenticated, that mean a wrong cookie. One
/// alone may be ractor_cluster closing a duplicate of a connection (two
/// nodes joining at once dial each other).
const REFUSALS: u32 = 3;

struct Sub(Arc<Watch>);

impl NodeEventSubscription for Sub {
    fn node_session_opened(&self, _ses: NodeServerSessionInformation) {}
    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.0.authenticated.lock().push(ses.actor.get_id());
    }
    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        if !self.0.authenticated.lock().contains(&ses.actor.get_id()) {
            let mut refused = self.0.refused.lock();
            refused.0 = Some(ses.peer_addr.clone());
            refused.1 += 1;
        }
    }
}

pub async fn join(
    server: &ActorRef<NodeServerMessage>,
    seeds: &[String],
    timeout: Duration,
    dial: &Dialer,
) -> Result<JoinInfo, String> {
    let watch = Arc::new(Watch::default());
    server
        .cast(NodeServerMessage::SubscribeToEvents {
            id: "curvine-join".into(),
            subscription: Box::new(Sub(watch.clone())),
        })
        .map_err(|e| e.to_string())?;
    let result = attempt(server, seeds, timeout, &watch, dial).await;
    let _ = server.cast(NodeServerMessage::UnsubscribeToEvents(
        "curvine-join".into(),
    ));
    result
}

async fn attempt(
    server: &ActorRef<NodeServerMessage>,
    seeds: &[String],
    timeout: Duration,
    watch: &Watch,
    dial: &Dialer,
) -> Result<JoinInfo, String> {
    let deadline = Instant::now() + timeout;
    let mut last_error = String::from("no seed answered");
    let mut next_dial = Instant::now();
    loop {
        let (refused_by, refusals) = watch.refused.lock().clone();
        if refusals >= REFUSALS && watch.authenticated.lock().is_empty() {
            return Err(format!(
                "the cluster at {} refused this node during authentication: \
                 cluster.cookie is not the cluster's cookie (or the two sides disagree on tls.enabled)",
                refused_by.unwrap_or_default()
            ));
        }
        for node in connected_nodes() {
            let Some(gateway) = gateway_of(&node) else {
                continue;
            };
            match gateway
                .call(PeerMsg::Join, Some(Duration::from_secs(5)))
                .await
            {
                Ok(CallResult::Success(Ok(info))) => return Ok(info),
                Ok(CallResult::Success(Err(e))) => last_error = format!("node {node}: {e}"),
                Ok(CallResult::Timeout) => last_error = format!("node {node} did not answer"),
                _ => last_error = format!("lost node {node} while joining"),
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no member answered within {timeout:?} (seeds {seeds:?}; last: {last_error})"
            ));
        }
        if Instant::now() >= next_dial {
            next_dial = Instant::now() + Duration::from_secs(1);
            for seed in seeds {
                if let Err(e) = dial(server.clone(), seed.clone()).await {
                    last_error = format!("cannot reach seed {seed}: {e}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! The S3 gateway of a node (`s3.listen`): the S3 API, built on `s3s`,
//! over the client library.
//!
//! - **Buckets** are the directories directly under `s3.root` (`/` by
//!   default); an object key is the path below its bucket (`a/b/c` is the
//!   file `ROOT/BUCKET/a/b/c`). Directories in between are made by a PUT
//!   and shown as common prefixes by a listing with `/` as delimiter.
//! - **Objects** are regular files: GET with ranges reads through the
//!   client library (short-circuit when the block is on this host), PUT
//!   writes a new version that replaces the old one whole at its close
//!   (readers see the old content or the new, never a mix), multipart
//!   uploads keep their parts under `ROOT/.s3-uploads` until completed.
//! - **Authentication** is AWS Signature V4 with the one key pair of
//!   `s3.access_key` / `s3.secret_key`; anonymous requests are refused.
//! - **Errors** are S3's own codes (`NoSuchKey`, `NoSuchBucket`,
//!   `BucketNotEmpty`, `InvalidRange`, ...), with a message naming the
//!   object and the file-system error behind it.
//!
//! Invariants: nothing is acknowledged before the client library's close
//! returned (the file is committed and visible to every client); a key
//! never maps outside its bucket (`.`, `..` and empty path segments are
//! refused); the ETag of an object changes whenever its content does.

mod error;
mod keys;
mod list;
mod multipart;
mod objects;

use std::sync::Arc;

use s3s::auth::{S3Auth, SecretKey};
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{s3_error, S3Result};
use tokio::net::TcpListener;

use curvine_client::Client;
use curvine_conf::ClientConf;

/// What the gateway is configured with.
#[derive(Clone)]
pub struct GatewayConf {
    /// The directory whose subdirectories are the buckets.
    pub root: String,
    pub access_key: String,
    pub secret_key: String,
    /// How the gateway's client reaches the cluster (the node's own
    /// client port, with the cluster's cookie).
    pub client: ClientConf,
}

impl GatewayConf {
    /// The gateway of the node configured with `config`, whose client port
    /// is `client_addr`, in the cluster of `cookie`: its client talks to
    /// that node only (short-circuit reads of the node's blocks).
    pub fn for_node(config: &curvine_conf::Config, client_addr: &str, cookie: &str) -> GatewayConf {
        let mut client = curvine_client::client_conf(config);
        client.cluster = vec![client_addr.to_string()];
        client.cookie = cookie.to_string();
        GatewayConf {
            root: config.s3.root.clone(),
            access_key: config.s3.access_key.clone(),
            secret_key: config.s3.secret_key.clone(),
            client,
        }
    }
}

impl std::fmt::Debug for GatewayConf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConf")
            .field("root", &self.root)
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .finish()
    }
}

/// The S3 implementation: cheap to clone, clones share the client.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    conf: GatewayConf,
    client: tokio::sync::OnceCell<Client>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.conf.fmt(f)
    }
}

impl Gateway {
    pub fn new(conf: GatewayConf) -> Gateway {
        let mut conf = conf;
        conf.root = keys::normalize_root(&conf.root);
        Gateway {
            inner: Arc::new(Inner {
                conf,
                client: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// The client, connected at the first request that needs it (the
    /// node's client port may start after the gateway's).
    async fn client(&self) -> S3Result<&Client> {
        self.inner
            .client
            .get_or_try_init(|| Client::connect(&self.inner.conf.client))
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "the S3 gateway cannot reach the cluster");
                s3_error!(
                    ServiceUnavailable,
                    "the gateway cannot reach the cluster: {e}"
                )
            })
    }

    fn root(&self) -> &str {
        &self.inner.conf.root
    }

    /// The HTTP service: S3 with Signature V4 checked against the
    /// configured key pair.
    pub fn service(&self) -> S3Service {
        let mut builder = S3ServiceBuilder::new(self.clone());
        builder.set_auth(KeyPair {
            access: self.inner.conf.access_key.clone(),
            secret: SecretKey::from(self.inner.conf.secret_key.as_str()),
        });
        builder.build()
    }
}

/// The one key pair requests are signed with.
struct KeyPair {
    access: String,
    secret: SecretKey,
}

#[async_trait::async_trait]
impl S3Auth for KeyPair {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        if access_key == self.access {
            return Ok(self.secret.clone());
        }
        Err(s3_error!(
            InvalidAccessKeyId,
            "the access key {access_key:?} is not this gateway's"
        ))
    }
}

/// Serves the S3 API on `listener` until the task is dropped; each
/// connection runs in its own task (HTTP/1.1, or HTTP/2 without TLS).
pub async fn serve(listener: TcpListener, gateway: Gateway) {
    let service = gateway.service();
    tracing::info!(
        addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        root = gateway.root(),
        "S3 gateway listening"
    );
    let http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(port = "s3", error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let conn = http
            .serve_connection(hyper_util::rt::TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "S3 connection ended");
            }
        });
    }
}

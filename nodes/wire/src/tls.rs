//! TLS for the cluster, client and data ports (`[tls]` in the config).
//!
//! One certificate authority (`tls.ca`) signs the nodes' certificates. The
//! cluster port is mutual: a node accepts another node only with a
//! certificate the CA signed, and presents its own when it dials. The client
//! and data ports ask for no client certificate (clients prove the cluster
//! cookie and carry block tokens) but verify one a client presents. Every
//! dialer checks the node's certificate against the CA and the name the
//! node was reached by (or `tls.server_name`).
//!
//! A port with TLS on still answers a plain client of its own protocol with
//! a refusal that says so (the first byte of a TLS handshake is 0x16, which
//! no plain opening starts with), so a client without TLS settings is told
//! what is wrong instead of seeing a dropped connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use curvine_conf::TlsConf;

/// The first byte of a TLS record that carries a handshake.
pub const HANDSHAKE_RECORD: u8 = 0x16;

/// What cannot be loaded from the `[tls]` settings, naming the key and file.
#[derive(Debug)]
pub struct TlsError {
    pub key: &'static str,
    pub path: String,
    pub reason: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.key, self.reason)
        } else {
            write!(f, "{} ({}): {}", self.key, self.path, self.reason)
        }
    }
}

impl std::error::Error for TlsError {}

/// The loaded `[tls]` settings: acceptors for a node's ports and the
/// connector every dialer uses.
pub struct Tls {
    /// Client and data ports: client certificates optional (verified when given).
    ports: Option<TlsAcceptor>,
    /// Cluster port: a certificate the CA signed is required.
    cluster: Option<TlsAcceptor>,
    connector: TlsConnector,
    server_name: Option<ServerName<'static>>,
    /// TLS on the data port too.
    pub data: bool,
    pub handshake_timeout: Duration,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("node", &self.ports.is_some())
            .field("server_name", &self.server_name)
            .field("data", &self.data)
            .finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read_pem(key: &'static str, path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError {
        key,
        path: path.to_string(),
        reason: format!("cannot read it: {e}"),
    })
}

fn certs(key: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(key, path)?;
    let bad = |reason: String| TlsError {
        key,
        path: path.to_string(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            "holds no certificate (expected PEM, BEGIN CERTIFICATE)".into(),
        ));
    }
    Ok(certs)
}

fn private_key(path: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_pem("tls.key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError {
        key: "tls.key",
        path: path.to_string(),
        reason: format!("no private key in it (expected PEM, PKCS#8, PKCS#1 or SEC1): {e}"),
    })
}

fn config_error(key: &'static str, path: &str, e: impl std::fmt::Display) -> TlsError {
    TlsError {
        key,
        path: path.to_string(),
        reason: e.to_string(),
    }
}

impl Tls {
    /// Loads the settings of `conf` (TLS must be enabled). A node needs a
    /// certificate and key (`node`); a client uses them when given.
    pub fn load(conf: &TlsConf, node: bool) -> Result<Arc<Tls>, TlsError> {
        let provider = provider();
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs("tls.ca", &conf.ca)? {
            roots.add(cert).map_err(|e| {
                config_error(
                    "tls.ca",
                    &conf.ca,
                    format!("not a usable CA certificate: {e}"),
                )
            })?;
        }
        let roots = Arc::new(roots);
        if node && conf.cert.is_empty() {
            return Err(TlsError {
                key: "tls.cert",
                path: String::new(),
                reason: "a node needs its certificate and key when tls.enabled is true".into(),
            });
        }
        let identity = if conf.cert.is_empty() {
            None
        } else {
            Some((certs("tls.cert", &conf.cert)?, private_key(&conf.key)?))
        };
        let versions = |e: rustls::Error| config_error("tls", "", e);

        let client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(versions)?
            .with_root_certificates(roots.clone());
        let client = match &identity {
            Some((chain, key)) => client
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| {
                    config_error("tls.key", &conf.key, format!("does not fit tls.cert: {e}"))
                })?,
            None => client.with_no_client_auth(),
        };

        let (ports, cluster) = match &identity {
            None => (None, None),
            Some((chain, key)) => {
                let server = |required: bool| -> Result<TlsAcceptor, TlsError> {
                    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                        roots.clone(),
                        provider.clone(),
                    );
                    let verifier = if required {
                        verifier
                    } else {
                        verifier.allow_unauthenticated()
                    };
                    let verifier = verifier
                        .build()
                        .map_err(|e| config_error("tls.ca", &conf.ca, e))?;
                    let config = rustls::ServerConfig::builder_with_provider(provider.clone())
                        .with_safe_default_protocol_versions()
                        .map_err(versions)?
                        .with_client_cert_verifier(verifier)
                        .with_single_cert(chain.clone(), key.clone_key())
                        .map_err(|e| {
                            config_error(
                                "tls.key",
                                &conf.key,
                                format!("does not fit tls.cert: {e}"),
                            )
                        })?;
                    Ok(TlsAcceptor::from(Arc::new(config)))
                };
                (Some(server(false)?), Some(server(true)?))
            }
        };
        let server_name = if conf.server_name.is_empty() {
            None
        } else {
            Some(ServerName::try_from(conf.server_name.clone()).map_err(|e| {
                config_error(
                    "tls.server_name",
                    &conf.server_name,
                    format!("not a host name: {e}"),
                )
            })?)
        };
        Ok(Arc::new(Tls {
            ports,
            cluster,
            connector: TlsConnector::from(Arc::new(client)),
            server_name,
            data: conf.data,
            handshake_timeout: conf.handshake_timeout.0,
        }))
    }

    /// The `[tls]` settings of a client or node config, when TLS is on.
    pub fn from_conf(conf: &TlsConf, node: bool) -> Result<Option<Arc<Tls>>, TlsError> {
        if conf.enabled {
            Tls::load(conf, node).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The acceptor of the client and data ports (nodes only).
    pub fn ports_acceptor(&self) -> Option<&TlsAcceptor> {
        self.ports.as_ref()
    }

    /// The acceptor of the cluster port (nodes only): mutual TLS.
    pub fn cluster_acceptor(&self) -> Option<&TlsAcceptor> {
        self.cluster.as_ref()
    }

    /// The name a node reached at `addr` must prove.
    pub fn server_name(&self, addr: &str) -> io::Result<ServerName<'static>> {
        match &self.server_name {
            Some(name) => Ok(name.clone()),
            None => host_name(addr),
        }
    }

    /// Opens TLS over `stream`, a connection to `addr`.
    pub async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = self.server_name(addr)?;
        match tokio::time::timeout(self.handshake_timeout, self.connector.connect(name, stream))
            .await
        {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(handshake_error(e)),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS handshake within {:?}", self.handshake_timeout),
            )),
        }
    }

    /// Accepts TLS over `stream` with `acceptor`, within the handshake timeout.
    pub async fn accept(
        &self,
        acceptor: &TlsAcceptor,
        stream: TcpStream,
    ) -> io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        match tokio::time::timeout(self.handshake_timeout, acceptor.accept(stream)).await {
            Ok(r) => r.map_err(handshake_error),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS handshake within {:?}", self.handshake_timeout),
            )),
        }
    }
}

/// The host of `addr` (`host:port`, `[v6]:port`) as the name its
/// certificate must carry.
fn host_name(addr: &str) -> io::Result<ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((host, _)) => host,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host} is no name to check a certificate against: {e} (set tls.server_name)"),
        )
    })
}

/// A handshake error with a hint when the peer did not speak TLS at all.
fn handshake_error(e: io::Error) -> io::Error {
    let text = e.to_string();
    if text.contains("InvalidContentType") || text.contains("corrupt message") {
        io::Error::new(
            e.kind(),
            format!("TLS handshake failed: the peer does not speak TLS on this port ({text}); do nodes and clients agree on tls.enabled and tls.data?"),
        )
    } else {
        io::Error::new(e.kind(), format!("TLS handshake failed: {text}"))
    }
}

/// How a connection of a TLS port opened.
pub enum Opening {
    /// With a TLS handshake, now done.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Without one: a plain peer, for the caller to refuse.
    Plain(TcpStream),
}

impl Tls {
    /// Waits for a new connection's first byte (within the handshake
    /// timeout) and runs the TLS handshake with `acceptor` when it opens one.
    pub async fn open(&self, acceptor: &TlsAcceptor, stream: TcpStream) -> io::Result<Opening> {
        if opens_tls(&stream, self.handshake_timeout).await? {
            Ok(Opening::Tls(Box::new(self.accept(acceptor, stream).await?)))
        } else {
            Ok(Opening::Plain(stream))
        }
    }
}

/// Whether a new connection opens with a TLS handshake (waits for its
/// first byte, at most the handshake timeout).
async fn opens_tls(stream: &TcpStream, timeout: Duration) -> io::Result<bool> {
    let mut first = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
        Ok(Ok(0)) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before it sent anything",
        )),
        Ok(Ok(_)) => Ok(first[0] == HANDSHAKE_RECORD),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("sent nothing within {timeout:?}"),
        )),
    }
}

/// A connection accepted on the client or data port.
pub enum Accepted {
    /// Ready for the port's protocol: plain on a plain port, TLS after its
    /// handshake on a TLS port.
    Ready(Transport),
    /// A plain opening on a port that requires TLS: the caller reads it
    /// (within `timeout`), answers with a refusal in its protocol and
    /// closes it.
    PlainOnTls {
        stream: TcpStream,
        timeout: Duration,
    },
}

impl Accepted {
    /// Sorts out a new connection of a port whose TLS settings are `tls`.
    pub async fn from(stream: TcpStream, tls: Option<&Tls>) -> io::Result<Accepted> {
        stream.set_nodelay(true)?;
        let Some((tls, acceptor)) = tls.and_then(|t| Some((t, t.ports_acceptor()?))) else {
            return Ok(Accepted::Ready(Transport::Plain(stream)));
        };
        Ok(match tls.open(acceptor, stream).await? {
            Opening::Tls(stream) => Accepted::Ready(Transport::Server(stream)),
            Opening::Plain(stream) => Accepted::PlainOnTls {
                stream,
                timeout: tls.handshake_timeout,
            },
        })
    }
}

/// A connection of the client or data port: plain TCP or TLS over it.
pub enum Transport {
    Plain(TcpStream),
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

impl Transport {
    /// Dials `addr` within `timeout`, with TLS when `tls` is given.
    pub async fn dial(addr: &str, timeout: Duration, tls: Option<&Tls>) -> io::Result<Transport> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        stream.set_nodelay(true)?;
        match tls {
            None => Ok(Transport::Plain(stream)),
            Some(tls) => Ok(Transport::Client(Box::new(
                tls.connect(addr, stream).await?,
            ))),
        }
    }

    /// The TCP stream when no TLS is layered over it (for sendfile).
    pub fn plain(&self) -> Option<&TcpStream> {
        match self {
            Transport::Plain(s) => Some(s),
            _ => None,
        }
    }

    /// Read and write halves that can be used from two tasks.
    pub fn into_split(self) -> (BoxRead, BoxWrite) {
        match self {
            Transport::Plain(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Transport::Server(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(r), Box::new(w))
            }
            Transport::Client(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(r), Box::new(w))
            }
        }
    }
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Transport::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Transport::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Transport::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Transport::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Transport::Server(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Transport::Client(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(s) => s.is_write_vectored(),
            Transport::Server(s) => s.is_write_vectored(),
            Transport::Client(s) => s.is_write_vectored(),
        }
    }
}

/// The settings for the data port: `tls` when they cover it (`tls.data`).
pub fn for_data_port(tls: &Option<Arc<Tls>>) -> Option<Arc<Tls>> {
    tls.clone().filter(|t| t.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str, text: &str) -> String {
        let path = std::env::temp_dir().join(format!("curvine-tls-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn enabled(ca: &str) -> TlsConf {
        TlsConf {
            enabled: true,
            ca: ca.to_string(),
            ..TlsConf::default()
        }
    }

    #[test]
    fn unreadable_or_wrong_files_name_the_key_and_the_file() {
        let e = Tls::load(&enabled("/nonexistent/ca.pem"), false).unwrap_err();
        assert_eq!(e.key, "tls.ca");
        assert!(
            e.to_string().contains("/nonexistent/ca.pem") && e.reason.contains("cannot read"),
            "{e}"
        );

        let garbage = scratch("garbage.pem", "not a certificate\n");
        let e = Tls::load(&enabled(&garbage), false).unwrap_err();
        assert!(
            e.key == "tls.ca" && e.reason.contains("holds no certificate"),
            "{e}"
        );

        let broken = scratch(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let e = Tls::load(&enabled(&broken), false).unwrap_err();
        assert_eq!(e.key, "tls.ca", "{e}");
        let _ = std::fs::remove_file(garbage);
        let _ = std::fs::remove_file(broken);
    }

    #[test]
    fn the_name_checked_is_the_host_dialed() {
        assert_eq!(
            host_name("10.0.0.7:8995").unwrap(),
            ServerName::IpAddress(std::net::Ipv4Addr::new(10, 0, 0, 7).into())
        );
        assert_eq!(
            host_name("[::1]:8996").unwrap(),
            ServerName::IpAddress(std::net::Ipv6Addr::LOCALHOST.into())
        );
        assert_eq!(
            host_name("node-3.cache.internal:8997").unwrap(),
            ServerName::try_from("node-3.cache.internal").unwrap()
        );
        assert!(host_name("bad host!:1").is_err());
    }

    #[test]
    fn a_plain_opening_is_not_a_handshake() {
        // Every plain opening of the three ports starts with a byte that no
        // TLS handshake record starts with.
        assert_ne!(curvine_messages::block::DATA_MAGIC[0], HANDSHAKE_RECORD);
        assert_ne!(
            curvine_messages::codec::Hello::current().encode()[0],
            HANDSHAKE_RECORD
        );
    }
}

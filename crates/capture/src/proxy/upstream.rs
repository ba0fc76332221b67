//! The upstream server: its URL (`http://` or `https://`, with an optional path prefix) and one
//! connection to it per client connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use prefixscope_core::record::ExchangeError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash, prepended to every request path ("" for none).
    pub prefix: String,
}

impl Upstream {
    /// `http://host[:port][/prefix]` or `https://…`; a bare `host:port` means `http://`.
    pub fn parse(url: &str) -> Result<Upstream, String> {
        let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else if url.contains("://") {
            return Err(format!(
                "upstream {url:?}: only http:// and https:// are supported"
            ));
        } else {
            (false, url)
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if let Some((_, host)) = authority.rsplit_once('@') {
            // Never echoed: the part before `@` may be a password.
            let scheme = if https { "https://" } else { "http://" };
            return Err(format!(
                "upstream {scheme}…@{host}{prefix}: a user name or password in the URL is not supported (it would be recorded and shown); give the credentials to the client, whose headers are forwarded unchanged"
            ));
        }
        if authority.is_empty() {
            return Err(format!("upstream {url:?}: no host"));
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            // IPv6: [::1]:8080
            let end = bracketed
                .find(']')
                .ok_or_else(|| format!("upstream {url:?}: bad IPv6 address"))?;
            let port = match &bracketed[end + 1..] {
                "" => default_port,
                p => p
                    .strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("upstream {url:?}: bad port"))?,
            };
            (bracketed[..end].to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse()
                        .map_err(|_| format!("upstream {url:?}: bad port {p:?}"))?,
                ),
                None => (authority.to_string(), default_port),
            }
        };
        Ok(Upstream {
            https,
            host,
            port,
            prefix: prefix.to_string(),
        })
    }

    /// The `Host` header value for requests to this upstream.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = if self.https { 443 } else { 80 };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    pub fn url(&self) -> String {
        format!(
            "{}://{}{}",
            if self.https { "https" } else { "http" },
            self.authority(),
            self.prefix
        )
    }
}

/// Trust roots for `https://` upstreams: the Mozilla set plus any extra CA certificates.
pub fn tls_connector(extra_ca_pem: Option<&[u8]>) -> Result<tokio_rustls::TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_ca_pem {
        let mut found = 0;
        for cert in pem_certificates(pem)? {
            roots
                .add(cert)
                .map_err(|e| format!("CA certificate: {e}"))?;
            found += 1;
        }
        if found == 0 {
            return Err("CA file holds no certificate".into());
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

fn pem_certificates(pem: &[u8]) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("CA file: {e}"))
}

/// A request body to the upstream: whole (`Full`, kept for the record and a retry) or streamed
/// (`StreamedBody`, past `--max-body`).
pub(crate) type UpstreamBody = http_body_util::combinators::BoxBody<bytes::Bytes, hyper::Error>;

pub(crate) type UpstreamSender = hyper::client::conn::http1::SendRequest<UpstreamBody>;

/// An upstream connection's own work (writing requests, reading responses off its socket). It
/// runs on no task of its own: the client connection's task polls it wherever it waits on the
/// upstream (`forward::Connection::drive`), so an exchange never hops between tasks.
pub(crate) type UpstreamDriver = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// HTTP/1.1 over `stream`: the sender, and the connection's work for its user to drive.
async fn handshake<S>(stream: S) -> hyper::Result<(UpstreamSender, UpstreamDriver)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .preserve_header_case(true)
        .handshake(hyper_util::rt::TokioIo::new(stream))
        .await?;
    let driver: UpstreamDriver = Box::pin(async move {
        let _ = connection.await;
    });
    Ok((sender, driver))
}

/// Why the upstream could not be reached: the record's kind, and the reason for the status
/// line and the proxy's 502 (the TLS error, the OS error, the handshake that timed out).
#[derive(Debug, Clone)]
pub(crate) struct ConnectFailure {
    pub kind: ExchangeError,
    pub reason: String,
}

/// Opens a TCP connection to the upstream within `timeout` (no delay on small writes).
pub(crate) async fn connect_tcp(
    upstream: &Upstream,
    timeout: Duration,
) -> Result<TcpStream, ConnectFailure> {
    let fail = |kind, reason: String| ConnectFailure { kind, reason };
    let authority = upstream.authority();
    let address = (upstream.host.as_str(), upstream.port);
    match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err(fail(
            ExchangeError::UpstreamUnreachable,
            format!("cannot connect to {authority}: {e}"),
        )),
        Err(_) => Err(fail(
            ExchangeError::Timeout,
            format!(
                "connecting to {authority} took longer than {} s",
                timeout.as_secs()
            ),
        )),
    }
}

/// Connects (within `timeout`) and performs the HTTP/1.1 handshake.
pub(crate) async fn connect(
    upstream: &Upstream,
    tls: Option<&tokio_rustls::TlsConnector>,
    timeout: Duration,
) -> Result<(UpstreamSender, UpstreamDriver), ConnectFailure> {
    let fail = |kind, reason: String| ConnectFailure { kind, reason };
    let authority = upstream.authority();
    let stream = connect_tcp(upstream, timeout).await?;
    match (upstream.https, tls) {
        (true, Some(tls)) => {
            let name =
                rustls::pki_types::ServerName::try_from(upstream.host.clone()).map_err(|e| {
                    fail(
                        ExchangeError::UpstreamUnreachable,
                        format!("TLS: {:?} is not a server name: {e}", upstream.host),
                    )
                })?;
            let tls_stream = match tokio::time::timeout(timeout, tls.connect(name, stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return Err(fail(
                        ExchangeError::UpstreamUnreachable,
                        format!("TLS handshake with {authority} failed: {e}"),
                    ));
                }
                Err(_) => {
                    return Err(fail(
                        ExchangeError::Timeout,
                        format!(
                            "TLS handshake with {authority}: no answer in {} s (is it an https:// server? a plain HTTP port waits for a request that never comes)",
                            timeout.as_secs()
                        ),
                    ));
                }
            };
            handshake(tls_stream).await.map_err(|e| {
                fail(
                    ExchangeError::UpstreamUnreachable,
                    format!("HTTP/1.1 handshake with {authority} failed: {e}"),
                )
            })
        }
        (true, None) => Err(fail(
            ExchangeError::UpstreamUnreachable,
            "no TLS configuration for an https:// upstream".to_string(),
        )),
        (false, _) => handshake(stream).await.map_err(|e| {
            fail(
                ExchangeError::UpstreamUnreachable,
                format!("HTTP/1.1 handshake with {authority} failed: {e}"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = Upstream::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.port, u.prefix.as_str()),
            (false, "127.0.0.1", 8080, "")
        );
        let u = Upstream::parse("https://api.example.com/openai/v1/").unwrap();
        assert_eq!(
            (u.https, u.port, u.prefix.as_str()),
            (true, 443, "/openai/v1")
        );
        assert_eq!(u.authority(), "api.example.com");
        let u = Upstream::parse("localhost:11434").unwrap();
        assert_eq!(u.url(), "http://localhost:11434");
        let u = Upstream::parse("http://[::1]:9000/x").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.authority()),
            ("::1", 9000, "[::1]:9000".to_string())
        );
        assert!(Upstream::parse("ftp://x").is_err());
        // Userinfo is refused, and the error never repeats it.
        for url in [
            "http://user:s3cret@host:8080/v1",
            "s3cret@localhost:8080",
            "https://:s3cret@h",
        ] {
            let e = Upstream::parse(url).unwrap_err();
            assert!(
                !e.contains("s3cret") && e.contains("user name or password"),
                "{e}"
            );
        }
        assert!(Upstream::parse("http://h:notaport").is_err());
    }
}

//! The HTTP/1.1 client connection the edges open: the tokenizer client, the demo's agents and
//! the tests (the proxy drives its upstream connections itself: `proxy::upstream`). Feature `net`.

use std::fmt;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, ToSocketAddrs};

/// Sends requests with whole bodies on one connection.
pub type Sender = SendRequest<Full<Bytes>>;

#[derive(Debug)]
pub enum ConnectError {
    /// The TCP connection failed.
    Connect(std::io::Error),
    Handshake(hyper::Error),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Connect(e) => e.fmt(f),
            ConnectError::Handshake(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ConnectError {}

/// HTTP/1.1 over `stream` (TCP or TLS). The connection runs on a task of its own until either
/// side closes it; its errors reach the requests sent on it, so the task drops them.
pub async fn handshake<S>(stream: S) -> hyper::Result<Sender>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Connects over TCP and performs the handshake. Nagle's delay is off: a request is written
/// whole, and waiting for more would only add latency.
pub async fn connect(address: impl ToSocketAddrs) -> Result<Sender, ConnectError> {
    let stream = TcpStream::connect(address)
        .await
        .map_err(ConnectError::Connect)?;
    let _ = stream.set_nodelay(true);
    handshake(stream).await.map_err(ConnectError::Handshake)
}

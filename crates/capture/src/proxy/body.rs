//! The response body as it streams to the client: every frame passes through as it arrives,
//! and a copy is kept (up to the recording limit) for the record.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use super::forward::InFlight;
use prefixscope_core::record::ExchangeError;

pub(crate) struct RecordingBody {
    inner: Incoming,
    flight: InFlight,
    max_body: usize,
}

impl RecordingBody {
    pub(crate) fn new(inner: Incoming, flight: InFlight, max_body: usize) -> RecordingBody {
        RecordingBody {
            inner,
            flight,
            max_body,
        }
    }

    fn on_data(&mut self, data: &Bytes) {
        self.flight.record_data(data, self.max_body);
    }
}

impl Body for RecordingBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        this.flight.drive_upstream(cx);
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.on_data(data);
                } else if frame.is_trailers() {
                    // Trailers end a body: the exchange is whole even if the body is not
                    // polled again.
                    this.flight.finish(None);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.flight.finish(Some(ExchangeError::UpstreamReset));
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.flight.finish(None);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RecordingBody {
    fn drop(&mut self) {
        // hyper may stop polling once `is_end_stream` says so: that is a complete exchange.
        let error = (!self.inner.is_end_stream()).then_some(ExchangeError::ClientDisconnected);
        self.flight.finish(error);
    }
}

/// How much of a streamed request body went by, and whether the client's side failed.
#[derive(Debug, Default)]
pub(crate) struct StreamedCount {
    pub bytes: std::sync::atomic::AtomicU64,
    pub client_failed: std::sync::atomic::AtomicBool,
}

/// A request body past `--max-body`, streamed to the upstream frame by frame as the client
/// sends it: what was read before the limit was passed, then the rest. Nothing is kept.
pub(crate) struct StreamedBody {
    head: Option<Bytes>,
    rest: Incoming,
    count: std::sync::Arc<StreamedCount>,
}

impl StreamedBody {
    pub(crate) fn new(
        head: Bytes,
        rest: Incoming,
        count: std::sync::Arc<StreamedCount>,
    ) -> StreamedBody {
        count
            .bytes
            .fetch_add(head.len() as u64, std::sync::atomic::Ordering::Relaxed);
        StreamedBody {
            head: (!head.is_empty()).then_some(head),
            rest,
            count,
        }
    }
}

impl Body for StreamedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        use std::sync::atomic::Ordering;
        let this = self.get_mut();
        if let Some(head) = this.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        let polled = Pin::new(&mut this.rest).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.count
                        .bytes
                        .fetch_add(data.len() as u64, Ordering::Relaxed);
                }
            }
            Poll::Ready(Some(Err(_))) => this.count.client_failed.store(true, Ordering::Relaxed),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.rest.size_hint();
        if let Some(head) = &self.head {
            let extra = head.len() as u64;
            hint.set_lower(hint.lower() + extra);
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + extra);
            }
        }
        hint
    }
}

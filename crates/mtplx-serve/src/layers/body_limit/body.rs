//! A request body that fails once it has yielded more than its limit.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

use crate::body::{Body, BoxError};

/// The error a [`Limited`] body ends with; handlers turn it into a 413.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTooLarge {
    pub limit: usize,
}

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the body is larger than {} bytes", self.limit)
    }
}

impl std::error::Error for BodyTooLarge {}

pub struct Limited {
    inner: Body,
    limit: usize,
    seen: usize,
}

impl Limited {
    pub fn new(inner: Body, limit: usize) -> Self {
        Limited {
            inner,
            limit,
            seen: 0,
        }
    }
}

impl hyper::body::Body for Limited {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &poll {
            if let Some(data) = frame.data_ref() {
                self.seen += data.len();
                if self.seen > self.limit {
                    let limit = self.limit;
                    return Poll::Ready(Some(Err(Box::new(BodyTooLarge { limit }))));
                }
            }
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

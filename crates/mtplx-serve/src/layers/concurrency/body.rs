//! A response body that holds a concurrency permit until it is finished or dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;

use crate::body::{Body, BoxError};

pub struct PermitBody {
    inner: Body,
    permit: Option<OwnedSemaphorePermit>,
}

impl PermitBody {
    pub fn new(inner: Body, permit: OwnedSemaphorePermit) -> Self {
        PermitBody {
            inner,
            permit: Some(permit),
        }
    }
}

impl hyper::body::Body for PermitBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &poll {
            // The stream is over: free the slot now rather than when the body is dropped.
            self.permit = None;
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

//! Deadlines on what a client sends: the whole body within `PLEXSPHERE_HTTP_BODY_TIMEOUT_MS`,
//! the whole request within `PLEXSPHERE_HTTP_REQUEST_TIMEOUT_MS`.
//!
//! The body deadline counts from the moment the headers are in, for the whole body, not
//! between chunks (tower-http's `TimeoutBody` resets on every frame, so a client trickling a
//! byte a second would never trip it).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

use super::error::error_response;

/// The error a body gives when its deadline passed; `read_body` finds it in a rejection's
/// sources and answers 408.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub(super) struct BodyDeadlineExceeded(pub(super) Duration);

/// A body that fails once `deadline` has passed, however steadily it was trickling.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        // Every field is Unpin (the timer is boxed), so the body can be reached directly.
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(BodyDeadlineExceeded(this.timeout).into()))),
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

/// Gives the request's body its deadline of `timeout`.
pub(super) fn limit_body(timeout: Duration, request: Request) -> Request {
    // A request without a body (most of them) needs no timer.
    if http_body::Body::is_end_stream(request.body()) {
        return request;
    }
    request.map(|inner| {
        Body::new(DeadlineBody { inner, deadline: Box::pin(tokio::time::sleep(timeout)), timeout })
    })
}

/// Answers 503 when `answer` has not answered within `timeout`, the whole request's deadline.
/// The database calls within it have a shorter deadline of their own, so this catches what
/// they do not: a body that is slow but under its own limit, plus a slow database call, say.
pub(super) async fn answer_within(timeout: Duration, answer: impl Future<Output = Response>) -> Response {
    match tokio::time::timeout(timeout, answer).await {
        Ok(response) => response,
        Err(_) => {
            tracing::error!(
                timeout_ms = timeout.as_millis() as u64,
                "request failed: not answered within its deadline"
            );
            error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "deadline_exceeded",
                "the request was not answered within its deadline; try again",
            )
            .into_response()
        }
    }
}

/// The passed body deadline among `error` and its sources, if there is one.
pub(super) fn body_deadline_in(error: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(BodyDeadlineExceeded(timeout)) = error.downcast_ref::<BodyDeadlineExceeded>() {
            return Some(*timeout);
        }
        current = error.source();
    }
    None
}

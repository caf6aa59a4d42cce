//! Client-side rate limiting of apiserver requests (`--kube-api-qps`, `--kube-api-burst`), as
//! client-go's token bucket: up to `burst` requests at once, refilled at `qps` per second;
//! a request waits for a token before it is sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tower::{Layer, Service};

#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Takes a token, or says how long until one is available.
    fn try_take(&mut self) -> Result<(), Duration> {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// A token-bucket limiter layer (one bucket shared by every service it wraps).
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl RateLimitLayer {
    /// `qps` requests per second with bursts of `burst` (both > 0).
    pub fn new(qps: f32, burst: u32) -> Self {
        let qps = f64::from(qps).max(f64::MIN_POSITIVE);
        let burst = f64::from(burst.max(1));
        RateLimitLayer {
            bucket: Arc::new(Mutex::new(Bucket {
                qps,
                burst,
                tokens: burst,
                last: Instant::now(),
            })),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit { inner, bucket: self.bucket.clone(), wait: None, has_token: false }
    }
}

/// The rate-limited service.
pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    has_token: bool,
}

impl<S, Req> Service<Req> for RateLimit<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(wait) = self.wait.as_mut() {
                ready!(wait.as_mut().poll(cx));
                self.wait = None;
            }
            match self.bucket.lock().unwrap_or_else(|p| p.into_inner()).try_take() {
                Ok(()) => self.has_token = true,
                Err(delay) => self.wait = Some(Box::pin(tokio::time::sleep(delay))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_paces() {
        let layer = RateLimitLayer::new(10.0, 3);
        let mut b = layer.bucket.lock().unwrap();
        for _ in 0..3 {
            assert!(b.try_take().is_ok());
        }
        let wait = b.try_take().unwrap_err();
        assert!(wait <= Duration::from_millis(100) && wait > Duration::from_millis(50), "{wait:?}");
    }
}

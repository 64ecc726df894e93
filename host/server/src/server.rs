//! Running the HTTP server until shutdown, then draining.
//!
//! Start here: [`crate::state::State::build`] then [`run`], which mirrors mini-redis's
//! `server::run(listener, shutdown)`: tests bind `127.0.0.1:0` and pass their own
//! shutdown future.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::state::State;

/// Serves HTTP on `listener` until `shutdown` resolves, then drains gracefully.
pub async fn run(listener: TcpListener, state: Arc<State>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let mut connections = JoinSet::new();
    let (close_tx, close_rx) = tokio::sync::watch::channel(false);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: keep serving the others.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let mut close = close_rx.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, std::convert::Infallible>(crate::http::handle(state, req).await) }
                    });
                    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    tokio::select! {
                        r = conn.as_mut() => { if let Err(e) = r { tracing::debug!("connection: {e}"); } }
                        _ = close.changed() => {
                            // Finish the in-flight request, then close the connection.
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
        }
    }
    drop(listener);
    tracing::info!("shutting down: not accepting new requests, draining queues");
    state.drain(Duration::from_millis(state.config.shutdown_grace_ms)).await;
    let _ = close_tx.send(true);
    let _ =
        tokio::time::timeout(Duration::from_secs(5), async { while connections.join_next().await.is_some() {} }).await;
    Ok(())
}

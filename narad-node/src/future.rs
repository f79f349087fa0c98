//! The boxed future every seam of the node returns: a trait behind `Arc<dyn _>` cannot have
//! `async fn`s, so its methods return this instead. It lives apart from the seams themselves so a
//! host (the metastore's, the cluster transport's) can name it without importing the HTTP surface.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

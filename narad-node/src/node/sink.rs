//! [`WalSink`]: the HTTP layer's [`ProduceSink`] over the ingress WAL host.
//!
//! The WAL opens after the HTTP listener (so `/readyz` answers 503 during recovery), so the sink is made
//! empty and attached once: until then every append is [`WalError::Unavailable`] (503). Records are
//! encoded here (format 2 when the topic has an incarnation id, which every topic of this release has).
//! The WAL host's outcome passes through as it is: the HTTP layer maps it to its answer, once.

use std::sync::{Arc, OnceLock};

use narad_core::codec::wal::ProduceRecord;

use crate::http::{BoxFuture, ProduceSink};
use crate::ingress::{IngressHost, WalError};

/// The ingress WAL as the HTTP layer's produce sink; see the module documentation.
#[derive(Debug, Default)]
pub struct WalSink {
    wal: OnceLock<IngressHost>,
}

impl WalSink {
    /// A sink with no WAL yet.
    pub fn new() -> Arc<WalSink> {
        Arc::new(WalSink::default())
    }

    /// Attaches the opened WAL; later calls are ignored (the first WAL stays).
    pub fn attach(&self, wal: IngressHost) {
        let _ = self.wal.set(wal);
    }

    fn wal(&self) -> Result<&IngressHost, WalError> {
        self.wal.get().ok_or(WalError::Unavailable)
    }
}

impl ProduceSink for WalSink {
    fn append(&self, record: ProduceRecord) -> BoxFuture<'_, Result<(), WalError>> {
        Box::pin(async move {
            let wal = self.wal()?;
            wal.append(record.to_bytes()).await.map(|_seq| ())
        })
    }

    fn append_many(&self, records: Vec<ProduceRecord>) -> BoxFuture<'_, Result<(), WalError>> {
        Box::pin(async move {
            let wal = self.wal()?;
            let encoded = records.iter().map(ProduceRecord::to_bytes).collect();
            drop(records);
            wal.append_many(encoded).await.map(|_range| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use narad_core::ids::{PartitionId, TopicId};

    use super::*;

    fn record() -> ProduceRecord {
        ProduceRecord {
            topic: "t".to_string(),
            topic_id: Some(TopicId(1)),
            key: None,
            partition: PartitionId(0),
            timestamp_ms: 1,
            payload: b"x".to_vec(),
        }
    }

    #[tokio::test]
    async fn before_the_wal_opens_every_append_is_unavailable() {
        let sink = WalSink::new();
        assert_eq!(sink.append(record()).await, Err(WalError::Unavailable));
        assert_eq!(
            sink.append_many(vec![record()]).await,
            Err(WalError::Unavailable)
        );
    }
}

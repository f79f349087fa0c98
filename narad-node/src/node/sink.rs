//! [`WalSink`]: the HTTP layer's [`ProduceSink`] over the ingress WAL host.
//!
//! The WAL opens after the HTTP listener (so `/readyz` answers 503 during recovery), so the sink is made
//! empty and attached once: until then every append is [`AppendError::Unavailable`] (503). Records are
//! encoded here (format 2 when the topic has an incarnation id, which every topic of this release has).
//!
//! Error mapping: a disk failure or the latch it leaves → [`AppendError::WalFailed`] (500
//! `produce failed`); an overloaded WAL or a stopped host → [`AppendError::Unavailable`] (503); a record
//! the WAL refuses for its size or shape (which the HTTP checks make impossible) → `WalFailed`.

use std::sync::{Arc, OnceLock};

use narad_core::codec::wal::ProduceRecord;
use narad_core::wal::AppendError as WalAppendError;

use crate::http::{AppendError, BoxFuture, ProduceSink};
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

    fn wal(&self) -> Result<&IngressHost, AppendError> {
        self.wal.get().ok_or(AppendError::Unavailable)
    }
}

fn seam_error(error: WalError) -> AppendError {
    match error {
        WalError::Append(WalAppendError::Overloaded { .. }) | WalError::Stopped => {
            AppendError::Unavailable
        }
        WalError::Append(
            error @ (WalAppendError::Disk(_)
            | WalAppendError::Fill { .. }
            | WalAppendError::RecordTooLarge { .. }
            | WalAppendError::EmptyRecord { .. }),
        ) => AppendError::WalFailed(error.to_string()),
    }
}

impl ProduceSink for WalSink {
    fn append(&self, record: ProduceRecord) -> BoxFuture<'_, Result<(), AppendError>> {
        Box::pin(async move {
            let wal = self.wal()?;
            wal.append(record.to_bytes())
                .await
                .map(|_seq| ())
                .map_err(seam_error)
        })
    }

    fn append_many(&self, records: Vec<ProduceRecord>) -> BoxFuture<'_, Result<(), AppendError>> {
        Box::pin(async move {
            let wal = self.wal()?;
            let encoded = records.iter().map(ProduceRecord::to_bytes).collect();
            drop(records);
            wal.append_many(encoded)
                .await
                .map(|_range| ())
                .map_err(seam_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use narad_core::ids::{PartitionId, TopicId};
    use narad_core::IoFault;

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
        assert_eq!(sink.append(record()).await, Err(AppendError::Unavailable));
        assert_eq!(
            sink.append_many(vec![record()]).await,
            Err(AppendError::Unavailable)
        );
    }

    #[test]
    fn disk_failures_are_500s_and_overload_or_stop_are_503s() {
        let disk = seam_error(WalError::Append(WalAppendError::Disk(IoFault::NoSpace)));
        assert_eq!(
            disk,
            AppendError::WalFailed("ingress WAL disk failure: no space left on device".to_string())
        );
        let overloaded = WalError::Append(WalAppendError::Overloaded {
            unflushed_bytes: 2,
            bytes_max: 1,
        });
        assert_eq!(seam_error(overloaded), AppendError::Unavailable);
        assert_eq!(seam_error(WalError::Stopped), AppendError::Unavailable);
    }
}

//! The log's invariants, asserted after every input when the checks are on ([`crate::DEEP_CHECKS`]).

use super::{PartitionLog, Phase};

impl PartitionLog {
    /// Asserts the invariants in the module documentation.
    pub fn check_invariants(&self) {
        assert!(self.oldest_offset() <= self.high_watermark);
        assert!(self.high_watermark <= self.next_offset);
        let committing = matches!(self.phase, Phase::Committing(..) | Phase::Journaling(..));
        assert!(committing || self.next_offset == self.high_watermark);
        // Contiguity and sorted indexes are asserted where segments and index entries are added
        // (`insert_segment`, `SparseIndex::note_frame`), and only the last segment ever changes
        // afterwards, so checking it here keeps the whole chain checked at O(log n) per event.
        if let Some((&base, last)) = self.segments.iter().next_back() {
            assert!(last.end_offset >= base);
            assert_eq!(
                last.end_offset, self.high_watermark,
                "last segment ends at the high watermark"
            );
            assert!(
                last.file_bytes >= last.bytes,
                "the zero fill lies past the frames"
            );
        }
        assert!(self.reads.len() <= self.config.reads_in_flight_max);
    }
}

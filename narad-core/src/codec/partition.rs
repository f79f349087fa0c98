//! The partition log's frame and keyed record envelope.

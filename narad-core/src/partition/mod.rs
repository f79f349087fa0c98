//! The owner's partition log and its commit combiner.

//! Crash recovery property test.

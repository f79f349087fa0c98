//! Reads for the dispatcher.

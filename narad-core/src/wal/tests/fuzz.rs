//! Decoders fed random bytes.

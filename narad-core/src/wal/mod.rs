//! The ingress WAL actor: segmented append-only log with group commit (see `IngressWal`).

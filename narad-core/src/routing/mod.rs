//! Partition pickers: the key hash, the keyless round-robin and the dead-owner-skipping picker.

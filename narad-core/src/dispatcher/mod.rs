//! The dispatcher actor: moves durable WAL records to their partition owners.

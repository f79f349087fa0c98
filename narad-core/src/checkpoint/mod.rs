//! The checkpointer actor: the dispatcher's durable checkpoint, stored in place and synced lazily.

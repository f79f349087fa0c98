//! The replicated metadata state machine: topics and incarnations, assignments, members.

//! Newtypes for every id, so a sequence number can never be passed where an offset is expected.

use core::fmt;

macro_rules! id_newtype {
    ($(#[$meta:meta])* $name:ident($inner:ty)) => {
        $(#[$meta])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash,
            serde::Serialize, serde::Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

id_newtype!(
    /// A record's position in a node's ingress WAL; dense across segments, starting at 0.
    Seq(u64)
);
id_newtype!(
    /// A record's position in a partition log; dense, starting at 0.
    Offset(u64)
);
id_newtype!(
    /// A partition's index within its topic.
    PartitionId(u32)
);
id_newtype!(
    /// A topic incarnation id: the id of the topic record a payload was validated against.
    /// A topic deleted and recreated under the same name gets a new id.
    TopicId(u64)
);
id_newtype!(
    /// A cluster member.
    NodeId(u32)
);

impl Seq {
    /// The sequence number after this one.
    pub const fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl Offset {
    /// The offset after this one.
    pub const fn next(self) -> Offset {
        Offset(self.0 + 1)
    }
}

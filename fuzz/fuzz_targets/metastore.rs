//! The metastore's command and snapshot decoders, and the consumer cursor table: any bytes decode or
//! fail, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_core::consume::table::CursorTable;
use narad_core::metastore::{Command, MetaState};

fuzz_target!(|data: &[u8]| {
    let _ = Command::decode(data);
    let _ = MetaState::decode_snapshot(data);
    let _ = CursorTable::decode(data);
});

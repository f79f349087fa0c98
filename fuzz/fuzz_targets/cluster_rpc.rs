//! The cluster RPC decoders (requests both ways of reading the incarnation section, every answer,
//! the handshake, the frame length): any bytes decode or fail, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_core::codec::cluster::{
    frame_body_len, CommitAnswer, ControlAnswer, Hello, IdSection, Request, FRAME_HEADER_BYTES,
};

fuzz_target!(|data: &[u8]| {
    for ids in [IdSection::Accept, IdSection::Refuse] {
        let _ = Request::decode(data, ids);
    }
    let _ = CommitAnswer::decode(data);
    let _ = ControlAnswer::decode(data);
    let _ = Hello::decode(data);
    if let Ok(header) =
        <[u8; FRAME_HEADER_BYTES]>::try_from(data.get(..FRAME_HEADER_BYTES).unwrap_or(&[]))
    {
        let _ = frame_body_len(header);
    }
});

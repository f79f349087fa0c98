//! The ingress WAL's frame and record decoders: any bytes decode or fail, never panic. The input is
//! also framed as a valid frame (its CRC right) and decoded back, so the record decoder sees payloads
//! behind a checksum a random frame would rarely pass.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_core::codec::wal::{
    decode_frame, decode_frame_header, decode_prep_trailer, encode_frame, ProduceRecord,
    FRAME_PAYLOAD_BYTES_MAX,
};
use narad_core::Seq;

fuzz_target!(|data: &[u8]| {
    let _ = decode_frame_header(data);
    let _ = decode_prep_trailer(data);
    let _ = ProduceRecord::decode(data);
    if let Ok(frame) = decode_frame(data) {
        let _ = ProduceRecord::decode(frame.payload);
    }
    if !data.is_empty() && data.len() <= FRAME_PAYLOAD_BYTES_MAX {
        let mut framed = Vec::new();
        encode_frame(&mut framed, Seq(data.len() as u64), data);
        let frame = decode_frame(&framed).expect("a frame just encoded decodes");
        assert_eq!(frame.payload, data);
        let _ = ProduceRecord::decode(frame.payload);
    }
});

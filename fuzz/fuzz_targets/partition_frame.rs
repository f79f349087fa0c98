//! The partition log's frame and record decoders, with and without the checksum check: any bytes
//! decode or fail, never panic. The input is also cut into records, framed validly and decoded back,
//! which must give the same records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_core::codec::partition::{
    decode_frame_checked, decode_header, decode_record, encode_frame, verify_frame_checked,
    RecordView,
};
use narad_core::Offset;

fuzz_target!(|data: &[u8]| {
    let _ = decode_header(data);
    let _ = decode_record(data);
    for verify_crc in [true, false] {
        let _ = verify_frame_checked(data, verify_crc);
        let _ = decode_frame_checked(data, verify_crc);
    }
    // Records of the input's chunks: the first byte of each chunk picks key and payload lengths.
    let mut records = Vec::new();
    let mut rest = data;
    while let Some((&shape, tail)) = rest.split_first() {
        let key_len = usize::from(shape & 0x0f).min(tail.len());
        let (key, tail) = tail.split_at(key_len);
        let payload_len = (usize::from(shape >> 4) * 3 + 1).min(tail.len());
        let (payload, tail) = tail.split_at(payload_len);
        if payload.is_empty() {
            break;
        }
        records.push(RecordView {
            key: (!key.is_empty()).then_some(key),
            committed_at_ms: u64::from(shape),
            payload,
        });
        rest = tail;
    }
    if records.is_empty() {
        return;
    }
    let mut framed = Vec::new();
    encode_frame(&mut framed, Offset(7), &records);
    let frame = decode_frame_checked(&framed, true).expect("a frame just encoded decodes");
    assert_eq!(frame.records, records);
});

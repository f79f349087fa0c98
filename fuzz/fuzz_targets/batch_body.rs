//! The batch produce body path: the first byte picks the Content-Encoding (identity, gzip, zstd, or
//! an unknown one), the rest is the body. The bounded decode and the strict JSON parse answer or
//! refuse, never panic, and never hold more than 16 MiB + 1 decoded bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use narad_node::http::produce::decode_batch_payloads;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let encoding = match selector % 4 {
        0 => None,
        1 => Some("gzip"),
        2 => Some("zstd"),
        _ => Some("br"),
    };
    let _ = decode_batch_payloads(encoding, body.to_vec());
});

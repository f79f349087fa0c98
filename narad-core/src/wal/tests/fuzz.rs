//! Every decoder of the WAL's bytes fed random bytes and mutated valid input: errors, never panics.
//! Cases: `NARAD_WAL_FUZZ_CASES` (default 20,000); a failing case prints the command that reruns it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::codec::wal::{
    decode_frame, decode_frame_header, decode_prep_trailer, encode_prep_trailer, ProduceRecord,
};
use crate::ids::{PartitionId, TopicId};

const CASES_ENV: &str = "NARAD_WAL_FUZZ_CASES";
const CASE_ENV: &str = "NARAD_WAL_FUZZ_CASE";
const CASES_DEFAULT: u64 = 20_000;

fn cases() -> Vec<u64> {
    if let Ok(case) = std::env::var(CASE_ENV) {
        return vec![case.parse().expect("NARAD_WAL_FUZZ_CASE is a number")];
    }
    let count = std::env::var(CASES_ENV)
        .ok()
        .map(|count| count.parse().expect("NARAD_WAL_FUZZ_CASES is a number"))
        .unwrap_or(CASES_DEFAULT);
    (0..count).collect()
}

fn for_each_case(test: &str, body: impl Fn(&mut ChaCha8Rng) + std::panic::RefUnwindSafe) {
    for case in cases() {
        let outcome = std::panic::catch_unwind(|| body(&mut ChaCha8Rng::seed_from_u64(case)));
        if let Err(panic) = outcome {
            eprintln!(
                "decoder fuzz failed at case {case}. Rerun: {CASE_ENV}={case} cargo test -p narad-core --lib \
                 wal::tests::fuzz::{test} -- --exact --nocapture"
            );
            std::panic::resume_unwind(panic);
        }
    }
}

fn random_record(rng: &mut ChaCha8Rng) -> ProduceRecord {
    let mut bytes = |max: usize| -> Vec<u8> {
        (0..rng.random_range(0..max))
            .map(|_| rng.random())
            .collect()
    };
    let key = bytes(8);
    let payload = bytes(64);
    ProduceRecord {
        topic: "t".repeat(rng.random_range(0..6)),
        topic_id: rng.random_bool(0.5).then(|| TopicId(rng.random())),
        key: (!key.is_empty()).then_some(key),
        partition: PartitionId(rng.random()),
        timestamp_ms: rng.random(),
        payload,
    }
}

/// Valid WAL bytes: frames of encoded records, sometimes in a prepared segment.
fn valid_segment(rng: &mut ChaCha8Rng, first: u64) -> Vec<u8> {
    let count = rng.random_range(0..6);
    let records: Vec<Vec<u8>> = (0..count).map(|_| random_record(rng).to_bytes()).collect();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let mut bytes = frames(first, &refs);
    if rng.random_bool(0.3) {
        let limit = bytes.len() + rng.random_range(0..64);
        bytes.resize(limit, 0);
        bytes.extend_from_slice(&encode_prep_trailer(limit as u64));
    }
    bytes
}

/// Flips, zeroes, truncates, extends or splices the bytes.
fn mutate(rng: &mut ChaCha8Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..5) {
            0 if !bytes.is_empty() => {
                let index = rng.random_range(0..bytes.len());
                bytes[index] ^= 1 << rng.random_range(0..8);
            }
            1 if !bytes.is_empty() => {
                let start = rng.random_range(0..bytes.len());
                let end = rng.random_range(start..=bytes.len().min(start + 40));
                bytes[start..end].fill(0);
            }
            2 => bytes.truncate(rng.random_range(0..=bytes.len())),
            3 => bytes.extend((0..rng.random_range(1..30)).map(|_| rng.random::<u8>())),
            _ if bytes.len() >= 8 => {
                // A length field set to something large.
                let index = rng.random_range(0..bytes.len() - 4);
                bytes[index..index + 4].copy_from_slice(&rng.random::<u32>().to_be_bytes());
            }
            _ => bytes.push(rng.random()),
        }
    }
}

fn random_or_mutated(rng: &mut ChaCha8Rng) -> Vec<u8> {
    if rng.random_bool(0.3) {
        (0..rng.random_range(0..200))
            .map(|_| rng.random())
            .collect()
    } else {
        let mut bytes = valid_segment(rng, 0);
        mutate(rng, &mut bytes);
        bytes
    }
}

#[test]
fn frame_and_record_decoders_never_panic() {
    for_each_case("frame_and_record_decoders_never_panic", |rng| {
        let bytes = random_or_mutated(rng);
        for start in 0..bytes.len().min(64) {
            let _ = decode_frame_header(&bytes[start..]);
            if let Ok(frame) = decode_frame(&bytes[start..]) {
                let _ = ProduceRecord::decode(frame.payload);
            }
        }
        let mut record = random_record(rng).to_bytes();
        mutate(rng, &mut record);
        let _ = ProduceRecord::decode(&record);
        let _ = ProduceRecord::decode(&bytes);
        let mut trailer = encode_prep_trailer(rng.random()).to_vec();
        mutate(rng, &mut trailer);
        let _ = decode_prep_trailer(&trailer);
    });
}

#[test]
fn recovery_never_panics_on_damaged_segments() {
    for_each_case("recovery_never_panics_on_damaged_segments", |rng| {
        let count = rng.random_range(1..4);
        let mut files = Vec::new();
        let mut first = 0u64;
        for _ in 0..count {
            let mut bytes = valid_segment(rng, first);
            let frames_in = recovered_count(&bytes);
            if rng.random_bool(0.7) {
                mutate(rng, &mut bytes);
            }
            if rng.random_bool(0.1) {
                bytes = (0..rng.random_range(0..300))
                    .map(|_| rng.random())
                    .collect();
            }
            files.push((format!("{first:020}.wal"), bytes));
            first += frames_in + u64::from(rng.random_bool(0.1));
        }
        let checkpoint = Seq(rng.random_range(0..=first + 1));
        let mut recovery = WalRecovery::new(small_config(), checkpoint).expect("valid config");
        let names: Vec<String> = files.iter().map(|(name, _)| name.clone()).collect();
        let planned = recovery.plan(&names);
        for (name, (_, bytes)) in planned.iter().zip(&files) {
            if recovery.feed_segment(name, bytes.clone()).is_err() {
                return;
            }
        }
        if let Ok(mut opened) = recovery.finish() {
            while opened.wal.poll_output().is_some() {}
        }
    });
}

fn recovered_count(bytes: &[u8]) -> u64 {
    let mut pos = 0;
    let mut count = 0;
    while let Ok(frame) = decode_frame(&bytes[pos..]) {
        pos += frame.encoded_len();
        count += 1;
    }
    count
}

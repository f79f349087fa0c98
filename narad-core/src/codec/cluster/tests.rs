use super::*;

fn record(key: Option<&str>, payload: &str, topic_id: Option<u64>) -> WireRecord {
    WireRecord {
        topic_id: topic_id.map(TopicId),
        key: key.map(|key| key.as_bytes().to_vec()),
        payload: payload.as_bytes().to_vec(),
    }
}

fn batch(records: Vec<WireRecord>) -> CommitProduceBatch {
    CommitProduceBatch {
        budget_ms: 30_000,
        topic: "orders".to_string(),
        partition: PartitionId(3),
        records,
    }
}

#[test]
fn a_batch_with_ids_round_trips_through_its_trailing_section() {
    let sent = batch(vec![
        record(Some("k1"), "a", Some(7)),
        record(None, "b", Some(7)),
        record(Some(""), "", Some(9)),
        record(Some("k2"), "d", None),
    ]);
    let body = sent.encode();
    assert_eq!(
        CommitProduceBatch::decode(&body, IdSection::Accept).unwrap(),
        sent
    );
    // Three runs: two records of 7, one of 9, one without an id.
    let without = batch(
        sent.records
            .iter()
            .map(|record| WireRecord {
                topic_id: None,
                ..record.clone()
            })
            .collect(),
    )
    .encode();
    assert_eq!(body.len(), without.len() + 4 + 3 * 12);
    assert_eq!(&body[..without.len()], &without[..]);
}

#[test]
fn a_batch_without_ids_is_the_id_less_frame_byte_for_byte() {
    let sent = batch(vec![record(Some("k"), "x", None), record(None, "y", None)]);
    let body = sent.encode();
    // The id-less layout, written out by hand.
    let mut expected = vec![OP_COMMIT_PRODUCE_BATCH];
    expected.extend_from_slice(&30_000u32.to_be_bytes());
    expected.extend_from_slice(&6u16.to_be_bytes());
    expected.extend_from_slice(b"orders");
    expected.extend_from_slice(&3u32.to_be_bytes());
    expected.extend_from_slice(&2u32.to_be_bytes());
    expected.extend_from_slice(&[1, 0, 0, 0, 1, b'k', 0, 0, 0, 1, b'x']);
    expected.extend_from_slice(&[0, 0, 0, 0, 1, b'y']);
    assert_eq!(body, expected);
    for ids in [IdSection::Accept, IdSection::Refuse] {
        assert_eq!(CommitProduceBatch::decode(&body, ids).unwrap(), sent);
    }
}

#[test]
fn an_owner_without_the_section_refuses_it_as_trailing_bytes() {
    let body = batch(vec![record(None, "x", Some(4))]).encode();
    assert_eq!(
        CommitProduceBatch::decode(&body, IdSection::Refuse),
        Err(DecodeError::TrailingBytes)
    );
    let single = CommitProduce {
        budget_ms: 5_000,
        topic: "t".to_string(),
        partition: PartitionId(0),
        record: record(Some("k"), "v", Some(4)),
    };
    let body = single.encode();
    assert_eq!(
        CommitProduce::decode(&body, IdSection::Accept).unwrap(),
        single
    );
    assert_eq!(
        CommitProduce::decode(&body, IdSection::Refuse),
        Err(DecodeError::TrailingBytes)
    );
}

#[test]
fn a_section_that_does_not_cover_the_records_exactly_is_refused() {
    let mut body = batch(vec![record(None, "x", None), record(None, "y", None)]).encode();
    let good_len = body.len();
    // One run of 1 record for a batch of 2.
    body.extend_from_slice(&1u32.to_be_bytes());
    body.extend_from_slice(&1u32.to_be_bytes());
    body.extend_from_slice(&5u64.to_be_bytes());
    assert!(CommitProduceBatch::decode(&body, IdSection::Accept).is_err());
    // A run of 0 records.
    body.truncate(good_len);
    body.extend_from_slice(&2u32.to_be_bytes());
    body.extend_from_slice(&0u32.to_be_bytes());
    body.extend_from_slice(&5u64.to_be_bytes());
    body.extend_from_slice(&2u32.to_be_bytes());
    body.extend_from_slice(&5u64.to_be_bytes());
    assert_eq!(
        CommitProduceBatch::decode(&body, IdSection::Accept),
        Err(DecodeError::BadLength(0))
    );
    // A section cut short.
    body.truncate(good_len + 6);
    assert_eq!(
        CommitProduceBatch::decode(&body, IdSection::Accept),
        Err(DecodeError::Truncated)
    );
}

#[test]
fn every_truncation_of_a_frame_is_an_error_never_a_panic() {
    let body = batch(vec![
        record(Some("key"), "payload", Some(3)),
        record(None, "more", None),
    ])
    .encode();
    // Cut at the end of the records, the frame is a valid batch without ids: the section is optional.
    // Frames are length-prefixed on a reliable stream, so no cut reaches a decoder unannounced.
    let records_end = body.len() - 4 - 2 * 12;
    for len in (0..body.len()).filter(|len| *len != records_end) {
        assert!(CommitProduceBatch::decode(&body[..len], IdSection::Accept).is_err());
        assert!(Request::decode(&body[..len], IdSection::Accept).is_err());
    }
    // A record count far beyond the bytes is refused before anything is allocated for it.
    let mut lying = body[..1 + 4 + 2 + 6 + 4].to_vec();
    lying.extend_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        CommitProduceBatch::decode(&lying, IdSection::Accept),
        Err(DecodeError::BadLength(u64::from(u32::MAX)))
    );
}

#[test]
fn a_frame_over_16_mib_is_refused_before_sending_and_before_reading() {
    let body = vec![0u8; 17 * 1024 * 1024];
    assert_eq!(
        frame(&body),
        Err(FrameError::TooLarge { bytes: body.len() })
    );
    let at_limit = vec![7u8; FRAME_BYTES_MAX];
    let framed = frame(&at_limit).unwrap();
    assert_eq!(framed.len(), FRAME_BYTES_MAX + FRAME_HEADER_BYTES);
    let header = [framed[0], framed[1], framed[2], framed[3]];
    assert_eq!(frame_body_len(header), Ok(FRAME_BYTES_MAX));
    let over = u32::try_from(FRAME_BYTES_MAX + 1).unwrap().to_be_bytes();
    assert_eq!(
        frame_body_len(over),
        Err(FrameError::TooLarge {
            bytes: FRAME_BYTES_MAX + 1
        })
    );
}

#[test]
fn answers_hellos_and_control_requests_round_trip() {
    let answers = [
        CommitAnswer::Committed {
            base: Offset(10),
            count: 3,
            committed_at_ms: 1_700_000_000_000,
        },
        CommitAnswer::NotOwner,
        CommitAnswer::IncarnationMismatch {
            record_topic_id: TopicId(4),
            live_topic_id: Some(TopicId(5)),
        },
        CommitAnswer::IncarnationMismatch {
            record_topic_id: TopicId(4),
            live_topic_id: None,
        },
        CommitAnswer::BadRequest("trailing bytes".to_string()),
        CommitAnswer::Unavailable("stopping".to_string()),
        CommitAnswer::Failed("EIO".to_string()),
    ];
    for answer in answers {
        let body = answer.encode();
        assert_eq!(CommitAnswer::decode(&body).unwrap(), answer);
        let mut longer = body.clone();
        longer.push(0);
        assert_eq!(
            CommitAnswer::decode(&longer),
            Err(DecodeError::TrailingBytes)
        );
    }
    let hello = Hello {
        node: NodeId(3),
        boot: 0x0102_0304_0506_0708,
        proof: [9; PROOF_BYTES],
    };
    assert_eq!(Hello::decode(&hello.encode()).unwrap(), hello);
    let control = Control::Replay {
        topic: "t".to_string(),
        topic_id: TopicId(2),
        partition: PartitionId(1),
        offset: Offset(5),
    };
    let body = control.encode();
    assert_eq!(
        Request::decode(&body, IdSection::Accept).unwrap(),
        Request::Control(control)
    );
    let mut longer = body;
    longer.push(1);
    assert!(Request::decode(&longer, IdSection::Accept).is_err());
    assert_eq!(
        Request::decode(&[0x7f], IdSection::Accept),
        Err(DecodeError::UnknownFormat(0x7f))
    );
    let produce = Control::Produce {
        topic: "t".to_string(),
        key: Some(b"k".to_vec()),
        partition: None,
        payload: b"p".to_vec(),
        budget_ms: 30_000,
    };
    assert_eq!(
        Request::decode(&produce.encode(), IdSection::Accept).unwrap(),
        Request::Control(produce)
    );
    let produced = ControlAnswer::Produced {
        partition: PartitionId(2),
        offset: Offset(9),
    };
    assert_eq!(ControlAnswer::decode(&produced.encode()).unwrap(), produced);
    for replay in [
        ReplayAnswer::PastEnd,
        ReplayAnswer::Gone,
        ReplayAnswer::Failed("disk".to_string()),
        ReplayAnswer::OtherIncarnation,
    ] {
        let answer = ControlAnswer::Replay(replay);
        assert_eq!(ControlAnswer::decode(&answer.encode()).unwrap(), answer);
    }
}

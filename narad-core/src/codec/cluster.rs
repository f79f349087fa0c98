//! The cluster transport's frames: what one node asks another over a QUIC stream, and the answer.
//!
//! # Framing
//! Every message on a stream is one frame: a 4-byte big-endian body length, then the body. A body is
//! at most [`FRAME_BYTES_MAX`] (16 MiB); [`frame`] refuses a larger one *before* anything is sent,
//! so an oversized batch fails at its sender, not halfway across the network, and
//! [`frame_body_len`] refuses a larger header before the receiver reads (or allocates) the body. A
//! stream carries one request frame and one answer frame (a stream per RPC); a connection's first
//! stream carries the [`Hello`] each way.
//!
//! # Requests
//! A request body starts with its op byte:
//! - [`OP_COMMIT_PRODUCE_BATCH`]: [`CommitProduceBatch`], the records of one topic-partition, then
//!   an optional trailing incarnation section (a count of runs, then per run a record count and the
//!   incarnation id the run shares). The section is written only when some record has an id, so a
//!   batch without ids is byte for byte the id-less frame. An owner of an older release, which reads
//!   the id-less frame only ([`IdSection::Refuse`]), refuses the section as trailing bytes: the
//!   400 the sender then resends without ids.
//! - [`OP_COMMIT_PRODUCE`]: [`CommitProduce`], one record, with an optional trailing id.
//! - [`OP_CONTROL`]: a [`Control`] request (raft messages, heartbeats, forwarded proposals, leader
//!   confirmation, replay reads, the synchronous produce) in postcard. These are only ever exchanged
//!   between nodes of this release, so they carry no compatibility promise beyond their op byte.
//!
//! Decoding is strict and total: a truncated field, trailing bytes, an unknown op byte, a count that
//! does not match, a zero-length run are [`DecodeError`]s, never panics.

use serde::{Deserialize, Serialize};

use super::{DecodeError, Reader};
use crate::consume::{HandleError, QueueLimits, ReceiptHandle, Settle};
use crate::ids::{NodeId, Offset, PartitionId, TopicId};

/// Largest frame body, in bytes (16 MiB).
pub const FRAME_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Bytes of a frame's length header.
pub const FRAME_HEADER_BYTES: usize = 4;
/// Longest topic name a frame carries (the metastore's limit is lower).
pub const TOPIC_BYTES_MAX: usize = u16::MAX as usize;
/// Bytes of a connection proof: an HMAC-SHA256.
pub const PROOF_BYTES: usize = 32;

/// Op byte of [`Hello`].
pub const OP_HELLO: u8 = 0;
/// Op byte of [`CommitProduceBatch`].
pub const OP_COMMIT_PRODUCE_BATCH: u8 = 1;
/// Op byte of [`CommitProduce`].
pub const OP_COMMIT_PRODUCE: u8 = 2;
/// Op byte of a [`Control`] request.
pub const OP_CONTROL: u8 = 16;

/// A frame that cannot be sent or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The body is larger than [`FRAME_BYTES_MAX`].
    #[error("frame of {bytes} bytes is over the {FRAME_BYTES_MAX}-byte limit")]
    TooLarge {
        /// The body's size.
        bytes: usize,
    },
}

/// The frame of `body`: its length header, then the body. Refuses a body over [`FRAME_BYTES_MAX`].
pub fn frame(body: &[u8]) -> Result<Vec<u8>, FrameError> {
    let header = frame_header(body.len())?;
    let mut framed = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    framed.extend_from_slice(&header);
    framed.extend_from_slice(body);
    Ok(framed)
}

/// The length header of a body of `len` bytes.
pub fn frame_header(len: usize) -> Result<[u8; FRAME_HEADER_BYTES], FrameError> {
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge { bytes: len });
    }
    Ok(u32::try_from(len)
        .expect("FRAME_BYTES_MAX fits in u32")
        .to_be_bytes())
}

/// The body length a received header announces; refuses one over [`FRAME_BYTES_MAX`].
pub fn frame_body_len(header: [u8; FRAME_HEADER_BYTES]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge { bytes: len });
    }
    Ok(len)
}

/// The first frame each way on a connection: who speaks, and its proof of the cluster secret bound to
/// this connection (see the node's cluster transport).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The speaker's member id.
    pub node: NodeId,
    /// The speaker's boot number, larger at every start: a hello with a larger one than known says
    /// the peer restarted, so its connections from before are stale.
    pub boot: u64,
    /// HMAC-SHA256 of the secret over the connection's exporter value for the speaker's side.
    pub proof: [u8; PROOF_BYTES],
}

impl Hello {
    /// The frame body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + 4 + 8 + PROOF_BYTES);
        out.push(OP_HELLO);
        out.extend_from_slice(&self.node.0.to_be_bytes());
        out.extend_from_slice(&self.boot.to_be_bytes());
        out.extend_from_slice(&self.proof);
        out
    }

    /// Decodes [`Hello::encode`]'s body.
    pub fn decode(body: &[u8]) -> Result<Hello, DecodeError> {
        let mut reader = Reader::new(body);
        let op = reader.u8()?;
        if op != OP_HELLO {
            return Err(DecodeError::UnknownFormat(op));
        }
        let node = NodeId(reader.u32()?);
        let boot = reader.u64()?;
        let mut proof = [0u8; PROOF_BYTES];
        proof.copy_from_slice(reader.take(PROOF_BYTES)?);
        reader.finish()?;
        Ok(Hello { node, boot, proof })
    }
}

/// One record of a commit frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireRecord {
    /// The incarnation it was accepted under (sent only in the trailing section).
    pub topic_id: Option<TopicId>,
    /// Its key, if any.
    pub key: Option<Vec<u8>>,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// Whether a decoder reads the trailing incarnation section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdSection {
    /// Read it (this release).
    Accept,
    /// Refuse it as trailing bytes, as an owner from before the section does.
    Refuse,
}

/// The records of one topic-partition for its owner to commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitProduceBatch {
    /// How long the sender still waits for the answer, ms: the owner leaves the batch out of a commit
    /// cycle that starts later.
    pub budget_ms: u32,
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: PartitionId,
    /// The records, in order.
    pub records: Vec<WireRecord>,
}

impl CommitProduceBatch {
    /// The frame body; the trailing section only when some record has an id. Refuses a topic name
    /// over [`TOPIC_BYTES_MAX`] (a programmer error: the metastore's limit is far lower).
    pub fn encode(&self) -> Vec<u8> {
        let payload_bytes: usize = self
            .records
            .iter()
            .map(|record| 9 + record.key.as_ref().map_or(0, Vec::len) + record.payload.len())
            .sum();
        let mut out = Vec::with_capacity(16 + self.topic.len() + payload_bytes);
        out.push(OP_COMMIT_PRODUCE_BATCH);
        out.extend_from_slice(&self.budget_ms.to_be_bytes());
        put_topic(&mut out, &self.topic);
        out.extend_from_slice(&self.partition.0.to_be_bytes());
        out.extend_from_slice(&len_u32(self.records.len()).to_be_bytes());
        for record in &self.records {
            put_record(&mut out, record.key.as_deref(), &record.payload);
        }
        if self.records.iter().any(|record| record.topic_id.is_some()) {
            let runs = id_runs(&self.records);
            out.extend_from_slice(&len_u32(runs.len()).to_be_bytes());
            for (count, topic_id) in runs {
                out.extend_from_slice(&count.to_be_bytes());
                out.extend_from_slice(&topic_id.map_or(0, |id| id.0).to_be_bytes());
            }
        }
        out
    }

    /// Decodes [`CommitProduceBatch::encode`]'s body; `ids` says whether the trailing section is read.
    pub fn decode(body: &[u8], ids: IdSection) -> Result<CommitProduceBatch, DecodeError> {
        let mut reader = Reader::new(body);
        expect_op(&mut reader, OP_COMMIT_PRODUCE_BATCH)?;
        let budget_ms = reader.u32()?;
        let topic = take_topic(&mut reader)?;
        let partition = PartitionId(reader.u32()?);
        let count = reader.u32()? as usize;
        // Each record takes at least 5 bytes: a count beyond that is a lie, not an allocation.
        if count > reader.remaining() / RECORD_BYTES_MIN {
            return Err(DecodeError::BadLength(count as u64));
        }
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            let (key, payload) = take_record(&mut reader)?;
            records.push(WireRecord {
                topic_id: None,
                key,
                payload,
            });
        }
        if ids == IdSection::Accept && reader.remaining() > 0 {
            read_id_section(&mut reader, &mut records)?;
        }
        reader.finish()?;
        Ok(CommitProduceBatch {
            budget_ms,
            topic,
            partition,
            records,
        })
    }
}

/// One record for its owner to commit, with an optional trailing incarnation id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitProduce {
    /// How long the sender still waits, ms.
    pub budget_ms: u32,
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: PartitionId,
    /// The record.
    pub record: WireRecord,
}

impl CommitProduce {
    /// The frame body; the id trails only when the record has one.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.topic.len() + self.record.payload.len());
        out.push(OP_COMMIT_PRODUCE);
        out.extend_from_slice(&self.budget_ms.to_be_bytes());
        put_topic(&mut out, &self.topic);
        out.extend_from_slice(&self.partition.0.to_be_bytes());
        put_record(&mut out, self.record.key.as_deref(), &self.record.payload);
        if let Some(topic_id) = self.record.topic_id {
            out.extend_from_slice(&topic_id.0.to_be_bytes());
        }
        out
    }

    /// Decodes [`CommitProduce::encode`]'s body.
    pub fn decode(body: &[u8], ids: IdSection) -> Result<CommitProduce, DecodeError> {
        let mut reader = Reader::new(body);
        expect_op(&mut reader, OP_COMMIT_PRODUCE)?;
        let budget_ms = reader.u32()?;
        let topic = take_topic(&mut reader)?;
        let partition = PartitionId(reader.u32()?);
        let (key, payload) = take_record(&mut reader)?;
        let topic_id = match ids {
            IdSection::Accept if reader.remaining() > 0 => Some(nonzero_id(reader.u64()?)?),
            IdSection::Accept | IdSection::Refuse => None,
        };
        reader.finish()?;
        Ok(CommitProduce {
            budget_ms,
            topic,
            partition,
            record: WireRecord {
                topic_id,
                key,
                payload,
            },
        })
    }
}

/// An owner's answer to a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitAnswer {
    /// The records are durable and visible from `base`, `count` of them, committed at that time.
    Committed {
        /// Offset of the first record.
        base: Offset,
        /// Records committed.
        count: u64,
        /// Commit time, Unix ms.
        committed_at_ms: u64,
    },
    /// This node does not own the partition (or it is frozen): retriable.
    NotOwner,
    /// 412: the owner holds another incarnation under the name.
    IncarnationMismatch {
        /// The incarnation the batch carried.
        record_topic_id: TopicId,
        /// The owner's live incarnation (`None`: none).
        live_topic_id: Option<TopicId>,
    },
    /// 400: the frame did not decode (trailing bytes from a newer sender among them).
    BadRequest(String),
    /// 503: the owner cannot take the batch now.
    Unavailable(String),
    /// 500: the owner tried and failed; nothing of the batch is visible.
    Failed(String),
}

const ANSWER_COMMITTED: u8 = 0;
const ANSWER_NOT_OWNER: u8 = 1;
const ANSWER_MISMATCH: u8 = 2;
const ANSWER_BAD_REQUEST: u8 = 3;
const ANSWER_UNAVAILABLE: u8 = 4;
const ANSWER_FAILED: u8 = 5;

impl CommitAnswer {
    /// The frame body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        match self {
            CommitAnswer::Committed {
                base,
                count,
                committed_at_ms,
            } => {
                out.push(ANSWER_COMMITTED);
                out.extend_from_slice(&base.0.to_be_bytes());
                out.extend_from_slice(&count.to_be_bytes());
                out.extend_from_slice(&committed_at_ms.to_be_bytes());
            }
            CommitAnswer::NotOwner => out.push(ANSWER_NOT_OWNER),
            CommitAnswer::IncarnationMismatch {
                record_topic_id,
                live_topic_id,
            } => {
                out.push(ANSWER_MISMATCH);
                out.extend_from_slice(&record_topic_id.0.to_be_bytes());
                out.extend_from_slice(&live_topic_id.map_or(0, |id| id.0).to_be_bytes());
            }
            CommitAnswer::BadRequest(text) => put_text(&mut out, ANSWER_BAD_REQUEST, text),
            CommitAnswer::Unavailable(text) => put_text(&mut out, ANSWER_UNAVAILABLE, text),
            CommitAnswer::Failed(text) => put_text(&mut out, ANSWER_FAILED, text),
        }
        out
    }

    /// Decodes [`CommitAnswer::encode`]'s body.
    pub fn decode(body: &[u8]) -> Result<CommitAnswer, DecodeError> {
        let mut reader = Reader::new(body);
        let answer = match reader.u8()? {
            ANSWER_COMMITTED => CommitAnswer::Committed {
                base: Offset(reader.u64()?),
                count: reader.u64()?,
                committed_at_ms: reader.u64()?,
            },
            ANSWER_NOT_OWNER => CommitAnswer::NotOwner,
            ANSWER_MISMATCH => CommitAnswer::IncarnationMismatch {
                record_topic_id: nonzero_id(reader.u64()?)?,
                live_topic_id: match reader.u64()? {
                    0 => None,
                    id => Some(TopicId(id)),
                },
            },
            ANSWER_BAD_REQUEST => CommitAnswer::BadRequest(take_text(&mut reader)?),
            ANSWER_UNAVAILABLE => CommitAnswer::Unavailable(take_text(&mut reader)?),
            ANSWER_FAILED => CommitAnswer::Failed(take_text(&mut reader)?),
            other => return Err(DecodeError::UnknownFormat(other)),
        };
        reader.finish()?;
        Ok(answer)
    }

    /// The HTTP-like status of the answer, for logs and metrics.
    pub fn status(&self) -> u16 {
        match self {
            CommitAnswer::Committed { .. } => 200,
            CommitAnswer::NotOwner => 409,
            CommitAnswer::IncarnationMismatch { .. } => 412,
            CommitAnswer::BadRequest(_) => 400,
            CommitAnswer::Unavailable(_) => 503,
            CommitAnswer::Failed(_) => 500,
        }
    }
}

/// The requests nodes of this release exchange besides commits (postcard behind [`OP_CONTROL`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// raft messages for the metastore replica, in order (each raft-rs's protobuf encoding).
    Raft {
        /// The encoded messages.
        messages: Vec<Vec<u8>>,
    },
    /// "I am alive": sent to every peer at the heartbeat interval.
    Heartbeat {
        /// The sender.
        from: NodeId,
    },
    /// A metastore command for the leader to propose (forwarded from a follower).
    Propose {
        /// The encoded `metastore::Command`.
        command: Vec<u8>,
    },
    /// A leader confirmation: the leader passes a ReadIndex barrier and answers with its applied index.
    ReadIndex,
    /// A replay read of a partition this node owns (consume forwarding).
    Replay {
        /// Topic name.
        topic: String,
        /// The incarnation the asker resolved.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
        /// The offset wanted.
        offset: Offset,
    },
    /// The storage figures of a partition this node owns (`GET /v1/topics/{t}` on another node).
    Stat {
        /// Topic name.
        topic: String,
        /// The incarnation the asker resolved.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
    },
    /// The synchronous produce (the node RPC `Produce` op): validated as an HTTP produce, placed by
    /// the picker that walks past partitions whose owner is dead, committed on the owner (here or
    /// over `CommitProduce`), and answered once visible. No ingress WAL: the caller holds the record
    /// until it gets [`ControlAnswer::Produced`].
    Produce {
        /// Topic name.
        topic: String,
        /// The key, hashed to the partition when none is pinned.
        key: Option<Vec<u8>>,
        /// A pinned partition (kept as asked, even if its owner is dead).
        partition: Option<PartitionId>,
        /// The payload.
        payload: Vec<u8>,
        /// How long the caller waits, ms.
        budget_ms: u32,
    },
    /// A queue-mode consume of partitions this node owns (forwarded by the node a consumer asked):
    /// a lease on the first record one of `partitions` has, waiting up to `wait_ms`.
    QueueConsume {
        /// Topic name.
        topic: String,
        /// The incarnation the asker resolved.
        topic_id: TopicId,
        /// The topic's lease length and caps, as the asker read them.
        limits: QueueLimits,
        /// The partitions to lease from (the asker's view of what this node owns).
        partitions: Vec<PartitionId>,
        /// How long to wait for a record, ms.
        wait_ms: u32,
    },
    /// An ack, extend or nack of a lease on a partition this node owns.
    QueueSettle {
        /// Topic name.
        topic: String,
        /// The incarnation the asker resolved.
        topic_id: TopicId,
        /// The lease.
        handle: ReceiptHandle,
        /// What to do with it.
        action: Settle,
    },
    // New variants go last (see `ControlAnswer`).
    /// A partition move's copy: visible records of a partition this node owns, from `offset`, for
    /// the move's destination.
    MoveRead {
        /// Topic name.
        topic: String,
        /// The incarnation the move is of.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
        /// The first offset wanted (below the oldest retained: from the oldest).
        offset: Offset,
    },
    /// A partition move's handoff freeze: the source arms it, records it in the metastore with the
    /// final high watermark, and answers that watermark.
    MoveFreeze {
        /// Topic name.
        topic: String,
        /// The incarnation the move is of.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
        /// The move's `planned_at` (names the move).
        move_id: u64,
    },
    /// A partition move's queue-mode state, asked by the destination once the switch applied: the
    /// source lets its queue of the partition go and answers what it held.
    MoveQueue {
        /// Topic name.
        topic: String,
        /// The incarnation the move is of.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
    },
}

/// The answer to a [`Control`] request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlAnswer {
    /// Done (raft messages taken, heartbeat noted).
    Done,
    /// A forwarded proposal's outcome: the applied answer or refusal, encoded by the metastore.
    Proposed(Vec<u8>),
    /// The leader's barrier passed at this applied index.
    ReadIndex {
        /// The confirmed index.
        index: u64,
    },
    /// Replay records.
    Replay(ReplayAnswer),
    /// The request could not be served now (not the leader, no quorum, stopping).
    Unavailable(String),
    /// The request is not valid here.
    BadRequest(String),
    /// A partition's storage figures.
    Stat(PartitionStat),
    /// A synchronous produce is committed and visible: where its record is.
    Produced {
        /// The partition the picker chose.
        partition: PartitionId,
        /// The record's offset.
        offset: Offset,
    },
    // New variants go last: postcard numbers them by position, and older nodes must still
    // decode every answer they knew.
    /// A queue-mode consume's answer: the leased record, or `None` when nothing came within the wait.
    Queue(Option<LeasedRecord>),
    /// An ack, extend or nack's answer.
    Settled(Result<(), HandleError>),
    /// A [`Control::MoveRead`]'s records.
    MoveChunk(MoveChunk),
    /// A [`Control::MoveFreeze`]'s answer: the freeze is armed and recorded; the final high
    /// watermark.
    MoveFrozen {
        /// Every record below it is visible at the source, and none will be added while frozen.
        final_hw: Offset,
    },
    /// A [`Control::MoveQueue`]'s answer: the source's queue of the partition, now let go
    /// (`None`: it held none).
    MoveQueue(Option<QueueHandoff>),
}

/// Records of a partition being moved, read at its source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveChunk {
    /// The offset of the first record (the oldest retained one when the asked offset was below it).
    pub first: Offset,
    /// The records, in offset order, each `(key, committed_at_ms, payload)`.
    pub records: Vec<MoveRecord>,
    /// The source's high watermark when the read completed.
    pub high_watermark: Offset,
}

/// One record of a [`MoveChunk`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    /// The key, if any.
    pub key: Option<Vec<u8>>,
    /// When the source committed it, Unix ms (kept by the copy).
    pub committed_at_ms: u64,
    /// The payload.
    pub payload: Vec<u8>,
}

/// A partition's queue-mode state handed from a move's source to its destination.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueHandoff {
    /// The lowest offset not acked.
    pub cursor: Offset,
    /// Offsets at or past the cursor that were acked.
    pub acked_ahead: Vec<Offset>,
}

/// A partition's storage figures, as `GET /v1/topics/{t}` reports them (and an owner answers a
/// [`Control::Stat`] with). A partition with no log yet reports all zeros.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStat {
    /// Segment files.
    pub segments: u64,
    /// Oldest retained offset.
    pub oldest_offset: Offset,
    /// The offset the next record takes.
    pub next_offset: Offset,
    /// The visibility boundary.
    pub high_watermark: Offset,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// When the oldest segment was created, Unix s.
    pub oldest_segment_at_s: Option<u64>,
}

/// A record leased to a queue-mode consumer by its partition's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasedRecord {
    /// The record.
    pub record: StoredRecord,
    /// The lease's handle (its partition is the record's).
    pub handle: ReceiptHandle,
}

/// What a forwarded replay read found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplayAnswer {
    /// The record at the asked offset.
    Record(StoredRecord),
    /// The offset is at or past the high watermark.
    PastEnd,
    /// The offset is below the oldest retained record, or its frame is damaged.
    Gone,
    /// The read failed.
    Failed(String),
    /// The owner holds another incarnation of the topic under the name than the one asked for, or
    /// none: the asker's replica or the owner's lags behind a delete and recreate. Retriable.
    OtherIncarnation,
}

/// A visible record read back from a partition log, as a replay read answers it (locally, or
/// forwarded from its owner).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// Its offset.
    pub offset: Offset,
    /// The key it was produced with, if any.
    pub key: Option<Vec<u8>>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// When the owner committed it, Unix ms.
    pub committed_at_ms: u64,
}

impl Control {
    /// The frame body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![OP_CONTROL];
        out.extend_from_slice(&postcard::to_stdvec(self).expect("postcard encodes to a Vec"));
        out
    }

    /// Decodes [`Control::encode`]'s body.
    pub fn decode(body: &[u8]) -> Result<Control, DecodeError> {
        let mut reader = Reader::new(body);
        expect_op(&mut reader, OP_CONTROL)?;
        postcard_exact(reader.take(reader.remaining())?)
    }
}

impl ControlAnswer {
    /// The frame body.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("postcard encodes to a Vec")
    }

    /// Decodes [`ControlAnswer::encode`]'s body.
    pub fn decode(body: &[u8]) -> Result<ControlAnswer, DecodeError> {
        postcard_exact(body)
    }
}

/// A request as the receiving node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// [`OP_COMMIT_PRODUCE_BATCH`].
    CommitProduceBatch(CommitProduceBatch),
    /// [`OP_COMMIT_PRODUCE`].
    CommitProduce(CommitProduce),
    /// [`OP_CONTROL`].
    Control(Control),
}

impl Request {
    /// Decodes a request body by its op byte.
    pub fn decode(body: &[u8], ids: IdSection) -> Result<Request, DecodeError> {
        match body.first().copied() {
            Some(OP_COMMIT_PRODUCE_BATCH) => {
                CommitProduceBatch::decode(body, ids).map(Request::CommitProduceBatch)
            }
            Some(OP_COMMIT_PRODUCE) => CommitProduce::decode(body, ids).map(Request::CommitProduce),
            Some(OP_CONTROL) => Control::decode(body).map(Request::Control),
            Some(op) => Err(DecodeError::UnknownFormat(op)),
            None => Err(DecodeError::Truncated),
        }
    }
}

fn postcard_exact<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|_| DecodeError::Truncated)?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(value)
}

fn expect_op(reader: &mut Reader<'_>, op: u8) -> Result<(), DecodeError> {
    match reader.u8()? {
        found if found == op => Ok(()),
        found => Err(DecodeError::UnknownFormat(found)),
    }
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("a frame's counts fit in u32 (its body is at most 16 MiB)")
}

fn put_topic(out: &mut Vec<u8>, topic: &str) {
    let len = u16::try_from(topic.len()).expect("topic names are far below 64 KiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(topic.as_bytes());
}

fn take_topic(reader: &mut Reader<'_>) -> Result<String, DecodeError> {
    let len_bytes = reader.take(2)?;
    let len = u16::from_be_bytes([len_bytes[0], len_bytes[1]]) as usize;
    let bytes = reader.take(len)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::NotUtf8)
}

/// A record: a key flag (0 none, 1 some), the key's u32 length and bytes when present, then the
/// payload's u32 length and bytes.
fn put_record(out: &mut Vec<u8>, key: Option<&[u8]>, payload: &[u8]) {
    match key {
        Some(key) => {
            out.push(1);
            out.extend_from_slice(&len_u32(key.len()).to_be_bytes());
            out.extend_from_slice(key);
        }
        None => out.push(0),
    }
    out.extend_from_slice(&len_u32(payload.len()).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Bytes of a record without key or payload: the key flag and the payload's length.
const RECORD_BYTES_MIN: usize = 5;

type KeyAndPayload = (Option<Vec<u8>>, Vec<u8>);

fn take_record(reader: &mut Reader<'_>) -> Result<KeyAndPayload, DecodeError> {
    let key = match reader.u8()? {
        0 => None,
        1 => Some(reader.u32_prefixed()?.to_vec()),
        other => return Err(DecodeError::UnknownFormat(other)),
    };
    let payload = reader.u32_prefixed()?.to_vec();
    Ok((key, payload))
}

fn put_text(out: &mut Vec<u8>, tag: u8, text: &str) {
    out.push(tag);
    out.extend_from_slice(&len_u32(text.len()).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn take_text(reader: &mut Reader<'_>) -> Result<String, DecodeError> {
    let bytes = reader.u32_prefixed()?;
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::NotUtf8)
}

fn nonzero_id(id: u64) -> Result<TopicId, DecodeError> {
    match id {
        0 => Err(DecodeError::BadLength(0)),
        id => Ok(TopicId(id)),
    }
}

/// Runs of consecutive records sharing an id (id 0 stands for "none" inside a run).
fn id_runs(records: &[WireRecord]) -> Vec<(u32, Option<TopicId>)> {
    let mut runs: Vec<(u32, Option<TopicId>)> = Vec::new();
    for record in records {
        match runs.last_mut() {
            Some((count, id)) if *id == record.topic_id => *count += 1,
            _ => runs.push((1, record.topic_id)),
        }
    }
    runs
}

fn read_id_section(reader: &mut Reader<'_>, records: &mut [WireRecord]) -> Result<(), DecodeError> {
    let runs = reader.u32()? as usize;
    if runs == 0 || runs > records.len() {
        return Err(DecodeError::BadLength(runs as u64));
    }
    let mut at = 0usize;
    for _ in 0..runs {
        let count = reader.u32()? as usize;
        let id = match reader.u64()? {
            0 => None,
            id => Some(TopicId(id)),
        };
        if count == 0 || count > records.len() - at {
            return Err(DecodeError::BadLength(count as u64));
        }
        for record in &mut records[at..at + count] {
            record.topic_id = id;
        }
        at += count;
    }
    if at != records.len() {
        return Err(DecodeError::BadLength(at as u64));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

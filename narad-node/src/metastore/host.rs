//! The metastore host: drives raft-rs's sans-IO `RawNode` over [`MetaDisk`] and applies committed
//! entries to the pure [`MetaState`].
//!
//! One task owns the `RawNode`, the state machine and the open files. It takes proposals from a bounded
//! mailbox ([`PROPOSALS_QUEUED_MAX`]), ticks raft every [`TICK`], and after each turn processes raft's
//! `Ready` in the order raft-rs requires: send messages; apply the snapshot, if any; apply the committed
//! entries; persist the new entries (write + fdatasync) and the hard state; then `advance` and apply what
//! the persisted entries committed. Disk work runs on the blocking pool (inline under madsim).
//!
//! A proposal carries a context (`boot nonce | proposal id`); the caller is answered when its entry is
//! applied, with the state machine's own answer, so "created" means "in the durable log and applied".
//! A nonce per start keeps a previous process's entries, replayed after a restart, from answering a new
//! proposal that reused an id.
//!
//! Reads come from the local replica: [`Metastore::view`] is the state as of the last applied entry,
//! published copy-on-write through a `watch` channel (metadata changes are rare; readers never block the
//! host). `caught_up` turns true once everything the log held at start-up is applied again, which is
//! what `/readyz` waits for.
//!
//! A disk failure latches the metastore: pending and later proposals get [`ProposeError::Unavailable`],
//! reads keep serving the last applied state, and a restart is the only way out (as for the WAL).
//!
//! Decisions: one voter for now (the cluster issue adds peers, the transport for `Ready` messages and
//! conf changes); a single voter campaigns at start instead of waiting for an election timeout. Raft's
//! own election jitter draws from rand 0.8's `thread_rng`, which nothing seeds (its `getrandom` 0.2 uses
//! the raw syscall, past madsim): a single voter runs without jitter (`max_election_tick` one past the
//! minimum), so simulated runs replay; several voters will need a seeded jitter.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use narad_core::disk::Disk;
use narad_core::ids::NodeId;
use narad_core::metastore::{Applied, Command, MetaState, TopicError};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{RawNode, Storage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, oneshot, watch};

use super::slog_bridge;
use super::storage::{MetaDisk, MetaStorageError, Recovered, StoredSnapshot, ENTRY_BYTES_MAX};

/// How often raft ticks.
pub const TICK: Duration = Duration::from_millis(100);
/// Ticks without a leader before a follower campaigns.
pub const ELECTION_TICKS: usize = 10;
/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 3;
/// Proposals waiting in the mailbox before `propose` waits for room.
pub const PROPOSALS_QUEUED_MAX: usize = 1024;
/// Proposals taken from the mailbox in one turn.
const PROPOSALS_PER_TURN_MAX: usize = 256;
/// How long a proposal may wait to be applied before it is answered "unavailable".
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Applied entries between snapshots (the log is rewritten then).
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 1000;

/// Why a proposal got no answer from the state machine.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// The state machine refused the command (the same answer on every replica).
    #[error(transparent)]
    Refused(#[from] TopicError),
    /// No answer: not the leader, disk failed, shutting down, or timed out (HTTP 503).
    #[error("control plane unavailable: {0}")]
    Unavailable(String),
}

/// What the local replica shows.
#[derive(Clone, Debug, Default)]
pub struct MetaView {
    /// The state after the last applied entry.
    pub state: MetaState,
    /// Raft index of that entry.
    pub applied_index: u64,
    /// Whether everything the log held at start-up has been applied again.
    pub caught_up: bool,
    /// The disk failure that latched the metastore, if any.
    pub failed: Option<String>,
}

/// Who this node is in the metastore, and its snapshot cadence.
#[derive(Clone, Debug)]
pub struct MetastoreOptions {
    /// Raft id and member id.
    pub node_id: NodeId,
    /// Address recorded in the member set.
    pub addr: String,
    /// Applied entries between snapshots ([`SNAPSHOT_EVERY_ENTRIES`]).
    pub snapshot_every_entries: u64,
    /// Seeds this start's nonce (see the module documentation), mixed with the log's position at
    /// start, so simulated runs replay; `None` draws the nonce from the OS.
    pub boot_nonce: Option<u64>,
}

impl MetastoreOptions {
    /// Options with the default snapshot cadence.
    pub fn new(node_id: NodeId, addr: String) -> Self {
        MetastoreOptions {
            node_id,
            addr,
            snapshot_every_entries: SNAPSHOT_EVERY_ENTRIES,
            boot_nonce: None,
        }
    }
}

/// A handle on the running metastore; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metastore {
    requests: mpsc::Sender<Proposal>,
    view: watch::Receiver<Arc<MetaView>>,
}

struct Proposal {
    command: Command,
    reply: oneshot::Sender<Result<Applied, ProposeError>>,
}

impl std::fmt::Debug for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proposal")
            .field("command", &self.command)
            .finish()
    }
}

impl Metastore {
    /// Opens the metastore files on `disk`, restores the state and starts the host task, which replays
    /// the log and then adds this node to the member set if it is not there. The task ends when every
    /// handle is dropped. Use [`Metastore::wait_caught_up`] before trusting reads.
    pub async fn open(
        disk: Arc<dyn Disk>,
        options: MetastoreOptions,
    ) -> Result<Metastore, MetaStorageError> {
        let (meta_disk, recovered) = blocking(move || MetaDisk::open(disk)).await?;
        if recovered.torn_bytes > 0 {
            tracing::warn!(
                torn_bytes = recovered.torn_bytes,
                "metastore log had a torn tail; truncated"
            );
        }
        let host = Host::new(meta_disk, recovered, &options)?;
        let (requests, mailbox) = mpsc::channel(PROPOSALS_QUEUED_MAX);
        let view = host.view_tx.subscribe();
        tokio::spawn(host.run(mailbox));
        let metastore = Metastore { requests, view };
        let joining = metastore.clone();
        tokio::spawn(async move { joining.join_as_member(&options).await });
        Ok(metastore)
    }

    /// The local replica's state as of the last applied entry.
    pub fn view(&self) -> Arc<MetaView> {
        self.view.borrow().clone()
    }

    /// A receiver that wakes on every applied change of the local replica (and on a latch).
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetaView>> {
        self.view.clone()
    }

    /// Waits until the replica has applied everything its log held at start-up (or failed).
    pub async fn wait_caught_up(&self) -> Result<(), ProposeError> {
        self.wait_until(|view| view.caught_up).await
    }

    /// Waits until the view satisfies `predicate`; fails if the metastore latched or stopped first.
    pub async fn wait_until(
        &self,
        mut predicate: impl FnMut(&MetaView) -> bool,
    ) -> Result<(), ProposeError> {
        let mut view = self.view.clone();
        let result = view
            .wait_for(|view| predicate(view) || view.failed.is_some())
            .await;
        match result {
            Ok(view) => match &view.failed {
                Some(failure) => Err(ProposeError::Unavailable(failure.clone())),
                None => Ok(()),
            },
            Err(_) => Err(ProposeError::Unavailable("metastore stopped".to_string())),
        }
    }

    /// Proposes a command and waits until it is applied (or [`PROPOSE_TIMEOUT`] passes).
    pub async fn propose(&self, command: Command) -> Result<Applied, ProposeError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || ProposeError::Unavailable("metastore stopped".to_string());
        let outcome = tokio::time::timeout(PROPOSE_TIMEOUT, async {
            self.requests
                .send(Proposal { command, reply })
                .await
                .map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        })
        .await;
        match outcome {
            Ok(result) => result,
            Err(_) => Err(ProposeError::Unavailable(
                "metastore proposal timed out".to_string(),
            )),
        }
    }

    /// Adds this node to the member set once the replica is caught up, if it is not there yet.
    async fn join_as_member(&self, options: &MetastoreOptions) {
        if self.wait_caught_up().await.is_err() {
            return;
        }
        let known = self.view().state.members().get(&options.node_id).cloned();
        if known.is_some_and(|member| member.addr == options.addr) {
            return;
        }
        let command = Command::AddMember {
            node: options.node_id,
            addr: options.addr.clone(),
        };
        if let Err(error) = self.propose(command).await {
            tracing::error!(%error, "could not add this node to the metastore members");
        }
    }
}

/// Runs disk work off the async workers: on the blocking pool, or inline under madsim (whose disk is in
/// memory, and which has no blocking pool).
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    #[cfg(madsim)]
    {
        work()
    }
    #[cfg(not(madsim))]
    {
        match tokio::task::spawn_blocking(work).await {
            Ok(value) => value,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
}

/// Where a proposal's answer goes.
type ProposalReply = oneshot::Sender<Result<Applied, ProposeError>>;

/// The task that owns raft and the state machine.
struct Host {
    node: RawNode<MemStorage>,
    /// The open files; `None` only while a blocking persist has them.
    disk: Option<MetaDisk>,
    state: MetaState,
    applied_index: u64,
    snapshot_index: u64,
    snapshot_every_entries: u64,
    /// The last log index found at start-up: caught up once applied reaches it.
    recovered_last_index: u64,
    nonce: u64,
    next_proposal: u64,
    pending: BTreeMap<u64, oneshot::Sender<Result<Applied, ProposeError>>>,
    /// Answers of applied proposals, sent only once the view that shows them is published (a
    /// caller answered "created" must find the topic in the view at once).
    answers: Vec<(ProposalReply, Result<Applied, ProposeError>)>,
    failed: Option<String>,
    view_tx: watch::Sender<Arc<MetaView>>,
}

impl Host {
    fn new(
        disk: MetaDisk,
        recovered: Recovered,
        options: &MetastoreOptions,
    ) -> Result<Host, MetaStorageError> {
        let id = u64::from(options.node_id.0);
        let corrupt = |reason: String| MetaStorageError::Corrupt {
            path: "metastore".to_string(),
            reason,
        };
        let storage = MemStorage::new();
        let (state, snapshot_index) = match &recovered.snapshot {
            Some(stored) => {
                let state = MetaState::decode_snapshot(&stored.state)
                    .map_err(|error| corrupt(error.to_string()))?;
                let mut snapshot = Snapshot::default();
                let metadata = snapshot.mut_metadata();
                metadata.index = stored.index;
                metadata.term = stored.term;
                metadata.set_conf_state(ConfState::from((
                    stored.voters.clone(),
                    stored.learners.clone(),
                )));
                storage
                    .wl()
                    .apply_snapshot(snapshot)
                    .map_err(|error| corrupt(error.to_string()))?;
                (state, stored.index)
            }
            None => {
                storage.initialize_with_conf_state(ConfState::from((vec![id], vec![])));
                (MetaState::new(), 0)
            }
        };
        let last_index = recovered
            .entries
            .last()
            .map_or(snapshot_index, |entry| entry.index);
        let last_term = recovered.entries.last().map_or(0, |entry| entry.term);
        storage
            .wl()
            .append(&recovered.entries)
            .map_err(|error| corrupt(error.to_string()))?;
        let mut hard_state: HardState = recovered.hard_state.clone();
        hard_state.term = hard_state
            .term
            .max(last_term)
            .max(storage.rl().hard_state().term);
        let hard_state_term = hard_state.term;
        hard_state.commit = hard_state.commit.clamp(snapshot_index, last_index);
        storage.wl().set_hardstate(hard_state);

        let voters = storage
            .initial_state()
            .map_err(|error| corrupt(error.to_string()))?
            .conf_state
            .voters;
        let single_voter = voters == [id];
        let config = raft::Config {
            id,
            election_tick: ELECTION_TICKS,
            // Raft draws its election jitter from rand 0.8's `thread_rng`, which nothing can seed (the
            // simulator included). A single voter has nobody to split a vote with: no jitter, so its
            // timing replays. The cluster issue must seed it before running several voters.
            max_election_tick: if single_voter { ELECTION_TICKS + 1 } else { 0 },
            heartbeat_tick: HEARTBEAT_TICKS,
            applied: snapshot_index,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 256,
            pre_vote: true,
            ..raft::Config::default()
        };
        config
            .validate()
            .map_err(|error| corrupt(error.to_string()))?;
        let mut node = RawNode::new(&config, storage, &slog_bridge::logger())
            .map_err(|error| corrupt(error.to_string()))?;
        if single_voter {
            node.campaign()
                .map_err(|error| corrupt(error.to_string()))?;
        }
        // A given seed may start the node many times (tests, the simulator's restarts): mixing in where
        // the log stood at this start keeps a previous start's replayed entries from matching.
        let nonce = match options.boot_nonce {
            Some(seed) => {
                seed ^ last_index.rotate_left(32)
                    ^ hard_state_term.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            }
            None => ChaCha8Rng::from_os_rng().random(),
        };
        let caught_up = snapshot_index >= last_index;
        let view = MetaView {
            state: state.clone(),
            applied_index: snapshot_index,
            caught_up,
            failed: None,
        };
        Ok(Host {
            node,
            disk: Some(disk),
            state,
            applied_index: snapshot_index,
            snapshot_index,
            snapshot_every_entries: options.snapshot_every_entries.max(1),
            recovered_last_index: last_index,
            nonce,
            next_proposal: 0,
            pending: BTreeMap::new(),
            answers: Vec::new(),
            failed: None,
            view_tx: watch::Sender::new(Arc::new(view)),
        })
    }

    async fn run(mut self, mut mailbox: mpsc::Receiver<Proposal>) {
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Biased (ticks first, then the mailbox, drained below): an unbiased select draws from
            // tokio's thread RNG, which the simulator cannot seed.
            tokio::select! {
                biased;
                _ = ticker.tick() => {
                    self.node.tick();
                }
                proposal = mailbox.recv() => match proposal {
                    Some(proposal) => self.on_proposal(proposal),
                    None => return,
                },
            }
            for _ in 0..PROPOSALS_PER_TURN_MAX {
                match mailbox.try_recv() {
                    Ok(proposal) => self.on_proposal(proposal),
                    Err(_) => break,
                }
            }
            if self.failed.is_none() {
                self.on_ready().await;
            }
        }
    }

    fn on_proposal(&mut self, proposal: Proposal) {
        if let Some(failure) = &self.failed {
            let _ = proposal
                .reply
                .send(Err(ProposeError::Unavailable(failure.clone())));
            return;
        }
        let data = proposal.command.encode();
        if data.len() > ENTRY_BYTES_MAX - 64 {
            let _ = proposal.reply.send(Err(ProposeError::Unavailable(
                "metastore command too large".to_string(),
            )));
            return;
        }
        let id = self.next_proposal;
        self.next_proposal += 1;
        let mut context = self.nonce.to_be_bytes().to_vec();
        context.extend_from_slice(&id.to_be_bytes());
        match self.node.propose(context, data) {
            Ok(()) => {
                self.pending.insert(id, proposal.reply);
            }
            Err(error) => {
                let _ = proposal
                    .reply
                    .send(Err(ProposeError::Unavailable(error.to_string())));
            }
        }
    }

    async fn on_ready(&mut self) {
        if !self.node.has_ready() {
            return;
        }
        let mut ready = self.node.ready();
        self.send_messages(ready.take_messages());
        if !ready.snapshot().is_empty() {
            // Only a follower receives snapshots; a single voter never does.
            tracing::error!("metastore received a raft snapshot; followers are not supported yet");
        }
        let mut applied_any = self.apply_entries(ready.take_committed_entries());
        let entries = ready.take_entries();
        let hard_state = ready.hs().cloned();
        if let Err(failure) = self.persist(entries.clone(), hard_state.clone()).await {
            self.latch(failure);
            return;
        }
        {
            let store = self.node.mut_store();
            if let Err(error) = store.wl().append(&entries) {
                panic!("raft handed entries the memory log refuses: {error}");
            }
            if let Some(hard_state) = hard_state {
                store.wl().set_hardstate(hard_state);
            }
        }
        self.send_messages(ready.take_persisted_messages());
        let mut light = self.node.advance(ready);
        if let Some(commit) = light.commit_index() {
            self.node.mut_store().wl().mut_hard_state().commit = commit;
        }
        self.send_messages(light.take_messages());
        applied_any |= self.apply_entries(light.take_committed_entries());
        self.node.advance_apply();
        if applied_any {
            self.maybe_snapshot().await;
            self.publish();
        }
        self.send_answers();
    }

    /// Answers the applied proposals; call after publishing the view that shows them.
    fn send_answers(&mut self) {
        for (reply, result) in self.answers.drain(..) {
            // A caller that stopped waiting does not need the answer.
            let _ = reply.send(result);
        }
    }

    /// Single voter: raft never has messages to send. The cluster issue routes them to peers.
    fn send_messages(&self, messages: Vec<raft::eraftpb::Message>) {
        for message in messages {
            tracing::error!(
                to = message.to,
                "metastore has no transport for a raft message yet"
            );
        }
    }

    async fn persist(
        &mut self,
        entries: Vec<Entry>,
        hard_state: Option<HardState>,
    ) -> Result<(), String> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        let mut disk = self
            .disk
            .take()
            .expect("the host owns its disk between turns");
        let (disk, result) = blocking(move || {
            let result = disk.append(&entries).and_then(|()| match &hard_state {
                Some(hard_state) => disk.store_hard_state(hard_state),
                None => Ok(()),
            });
            (disk, result)
        })
        .await;
        self.disk = Some(disk);
        result.map_err(|fault| format!("metastore disk failure: {fault}"))
    }

    /// Applies committed entries in order; answers the proposals among them. Returns whether any was.
    fn apply_entries(&mut self, entries: Vec<Entry>) -> bool {
        let any = !entries.is_empty();
        for entry in entries {
            assert_eq!(
                entry.index,
                self.applied_index + 1,
                "raft applies entries in order"
            );
            self.applied_index = entry.index;
            match entry.entry_type {
                EntryType::EntryNormal => self.apply_normal(&entry),
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    tracing::error!(
                        index = entry.index,
                        "metastore membership changes are not supported by this build; skipped"
                    );
                }
            }
        }
        any
    }

    fn apply_normal(&mut self, entry: &Entry) {
        if entry.data.is_empty() {
            return; // A new leader's empty entry.
        }
        let result = match Command::decode(&entry.data) {
            Ok(command) => self.state.apply(&command).map_err(ProposeError::Refused),
            Err(error) => {
                // Every replica skips the same undecodable entry, so they still agree.
                tracing::error!(index = entry.index, %error, "metastore entry does not decode; skipped");
                Err(ProposeError::Unavailable(error.to_string()))
            }
        };
        if let Some(id) = self.own_proposal(&entry.context) {
            if let Some(reply) = self.pending.remove(&id) {
                self.answers.push((reply, result));
            }
        }
    }

    fn own_proposal(&self, context: &[u8]) -> Option<u64> {
        let (nonce, id) = context.split_at_checked(8)?;
        if nonce != self.nonce.to_be_bytes() {
            return None;
        }
        Some(u64::from_be_bytes(id.try_into().ok()?))
    }

    /// Every `snapshot_every_entries` applied entries: store the state and drop the log below it.
    async fn maybe_snapshot(&mut self) {
        if self.applied_index - self.snapshot_index < self.snapshot_every_entries {
            return;
        }
        let index = self.applied_index;
        let (term, above, conf_state) = {
            let store = self.node.store();
            let last = store.last_index().unwrap_or(index);
            let term = store.term(index).unwrap_or(0);
            let above = if last > index {
                store
                    .entries(
                        index + 1,
                        last + 1,
                        None,
                        raft::GetEntriesContext::empty(false),
                    )
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            let conf_state = store
                .initial_state()
                .map(|initial| initial.conf_state)
                .unwrap_or_default();
            (term, above, conf_state)
        };
        let snapshot = StoredSnapshot {
            index,
            term,
            voters: conf_state.voters.clone(),
            learners: conf_state.learners.clone(),
            state: self.state.encode_snapshot(),
        };
        let mut disk = self
            .disk
            .take()
            .expect("the host owns its disk between turns");
        let (disk, result) = blocking(move || {
            let result = disk.store_snapshot(&snapshot, &above);
            (disk, result)
        })
        .await;
        self.disk = Some(disk);
        match result {
            Ok(()) => {
                self.snapshot_index = index;
                if let Err(error) = self.node.mut_store().wl().compact(index) {
                    tracing::warn!(%error, "metastore memory log compaction failed");
                }
            }
            Err(fault) => self.latch(format!("metastore snapshot failure: {fault}")),
        }
    }

    fn latch(&mut self, failure: String) {
        tracing::error!(%failure, "metastore latched: proposals are refused until restart");
        for (_, reply) in std::mem::take(&mut self.pending) {
            let _ = reply.send(Err(ProposeError::Unavailable(failure.clone())));
        }
        self.failed = Some(failure);
        self.publish();
        self.send_answers();
    }

    fn publish(&self) {
        let view = MetaView {
            state: self.state.clone(),
            applied_index: self.applied_index,
            caught_up: self.applied_index >= self.recovered_last_index,
            failed: self.failed.clone(),
        };
        self.view_tx.send_replace(Arc::new(view));
    }
}

#[cfg(test)]
mod tests;

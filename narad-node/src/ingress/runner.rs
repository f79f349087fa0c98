//! The WAL and the checkpointer as the ingress host runs them: their commands, their I/O, and the
//! routing of their outputs (to the executors, the status, the callers and the dispatcher).

use super::*;

/// Who waits for an append's outcome.
pub(super) type AppendReply = oneshot::Sender<Result<SeqRange, AppendError>>;

/// The actor task's state.
pub(super) struct Runner {
    pub(super) wal: IngressWal,
    pub(super) checkpointer: Checkpointer,
    pub(super) wal_io: IoExecutor<Event>,
    pub(super) checkpoint_io: IoExecutor<Event>,
    pub(super) clock: Clock,
    pub(super) status: watch::Sender<WalStatus>,
    pub(super) appends: BTreeMap<AppendId, AppendReply>,
    /// Append outcomes routed but not yet sent (sent at the end of each drain).
    pub(super) answers: Vec<(AppendReply, Result<SeqRange, AppendError>)>,
    pub(super) reads: BTreeMap<WalReadId, oneshot::Sender<Result<Vec<WalFrame>, WalReadError>>>,
    /// Checkpoint stores waiting for their write: `(value, caller)`.
    pub(super) stores: Vec<(Seq, StoreReply)>,
    pub(super) observer: Option<DurableObserver>,
    pub(super) next_id: u64,
    /// Requests submitted to either executor whose completion has not been handled yet.
    pub(super) io_in_flight: usize,
    /// No new command is taken once set.
    pub(super) stopping: bool,
    pub(super) shutdown_replies: Vec<oneshot::Sender<Result<Seq, CheckpointFailure>>>,
    /// The final flush's outcome, once it came.
    pub(super) flushed: Option<Result<Seq, CheckpointFailure>>,
    pub(super) audit: WalAudit,
    /// Each group commit's answer instant, kept until its records are below the written checkpoint.
    pub(super) accept_times: AcceptTimes,
    /// The appends of the commands being handed over, fed to the WAL as one batch.
    pub(super) appending: Vec<WalInput>,
    /// The WAL's durable frontier, as last routed (the dispatcher follows it).
    pub(super) durable_next: Seq,
    /// The dispatcher's read, to be fed to the WAL at the start of the next drain.
    pub(super) dispatch_read: Option<ReadWal>,
    /// The WAL's id of the dispatcher's read in flight.
    pub(super) dispatch_read_id: Option<WalReadId>,
    /// The dispatcher's checkpoint store, to be fed to the checkpointer at the start of the next drain.
    pub(super) dispatch_store: Option<Seq>,
    /// The dispatcher's store waiting for its in-place write.
    pub(super) dispatch_store_waiting: Option<Seq>,
    /// Answers for the dispatcher, fed by the ingress host after each drain.
    pub(super) dispatch_inputs: VecDeque<DispatcherInput>,
}

/// The WAL's invariants as the host sees them (see [`crate::observer`]): what its requests did to the
/// disk against what it acknowledges and deletes. Kept only while an observer watches.
pub(super) struct WalAudit {
    observer: Observer,
    /// Segment files with a completed write that no completed fdatasync has covered since.
    unsynced: BTreeSet<String>,
}

impl WalAudit {
    pub(super) fn new(observer: Observer) -> WalAudit {
        WalAudit {
            observer,
            unsynced: BTreeSet::new(),
        }
    }

    /// Notes what the ops of a finished request did, up to the first failed one.
    fn on_completed(&mut self, request: &IoRequest, completion: &IoCompletion) {
        if !self.observer.is_watched() {
            return;
        }
        let done = match &completion.result {
            Ok(_) => request.ops.len(),
            Err((index, _)) => *index,
        };
        for op in &request.ops[..done] {
            match op {
                IoOp::WriteAt { path, .. }
                | IoOp::WriteZeros { path, .. }
                | IoOp::SetLen { path, .. } => {
                    self.unsynced.insert(path.clone());
                }
                IoOp::SyncData { path } | IoOp::Remove { path } => {
                    self.unsynced.remove(path);
                }
                IoOp::Rename { from, to } => {
                    if self.unsynced.remove(from) {
                        self.unsynced.insert(to.clone());
                    } else {
                        self.unsynced.remove(to);
                    }
                }
                IoOp::Create { .. }
                | IoOp::CreateDirAll { .. }
                | IoOp::ReadAt { .. }
                | IoOp::ReadCrc { .. }
                | IoOp::Len { .. }
                | IoOp::SyncDir { .. }
                | IoOp::List { .. } => {}
            }
        }
    }

    /// An acknowledgement is going out: every segment write must be covered by a completed sync.
    fn on_ack(&self, range: SeqRange) {
        if range.is_empty() {
            return;
        }
        if let Some(path) = self.unsynced.iter().find(|path| path.ends_with(".wal")) {
            self.observer.violation(
                Invariant::AckBeforeSync,
                format_args!(
                    "records {}..{} acknowledged while {path} holds a write no fdatasync covered",
                    range.first, range.next
                ),
            );
        }
    }

    /// The WAL emitted `request`: a segment deletion must trail the checkpoint an fdatasync made durable.
    fn on_request(&self, request: &IoRequest, oldest_kept: Seq, synced: Option<Seq>) {
        if !self.observer.is_watched() {
            return;
        }
        let removes_segment = request
            .ops
            .iter()
            .any(|op| matches!(op, IoOp::Remove { path } if path.ends_with(".wal")));
        if removes_segment && synced.is_none_or(|synced| oldest_kept > synced) {
            self.observer.violation(
                Invariant::CompactionAheadOfSyncedCheckpoint,
                format_args!(
                    "segments below {oldest_kept} deleted while the synced checkpoint is {synced:?}"
                ),
            );
        }
        if removes_segment {
            self.observer.event(
                "wal",
                format_args!("compact: oldest kept {oldest_kept}, synced checkpoint {synced:?}"),
            );
        }
    }
}

impl Runner {
    pub(super) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Feeds the WAL a read named `id`.
    fn feed_read(&mut self, now: Instant, id: WalReadId, read: ReadWal) {
        let ReadWal {
            from,
            max_records,
            max_bytes,
        } = read;
        let input = WalInput::Read {
            id,
            from,
            max_records,
            max_bytes,
        };
        narad_core::feed(&mut self.wal, now, input);
    }

    /// Stages an append for the batch [`Runner::feed_appends`] hands the WAL.
    pub(super) fn stage_append(&mut self, command: Command) {
        match command {
            Command::Append { record, reply } => {
                let id = AppendId(self.next_id());
                self.appends.insert(id, reply);
                self.appending.push(WalInput::Append { id, record });
            }
            Command::AppendMany { sizes, fill, reply } => {
                let id = AppendId(self.next_id());
                self.appends.insert(id, reply);
                self.appending
                    .push(WalInput::AppendMany { id, sizes, fill });
            }
            other @ (Command::Read { .. }
            | Command::StoreCheckpoint { .. }
            | Command::Shutdown { .. }
            | Command::StartDispatch { .. }
            | Command::StopDispatch { .. }
            | Command::AcceptTime { .. }) => self.on_command(other),
        }
    }

    /// Feeds the staged appends to the WAL as one input: one group commit for all of them.
    pub(super) fn feed_appends(&mut self) {
        if self.appending.is_empty() {
            return;
        }
        // A command before these may have left the WAL's outputs (the drain rule).
        self.route_all();
        match self.appending.len() {
            0 => {}
            1 => {
                let input = self.appending.pop().expect("one");
                narad_core::feed(&mut self.wal, self.clock.now(), input);
            }
            _ => {
                let inputs = std::mem::take(&mut self.appending);
                narad_core::feed(&mut self.wal, self.clock.now(), WalInput::Batch(inputs));
            }
        }
    }

    pub(super) fn on_command(&mut self, command: Command) {
        let now = self.clock.now();
        match command {
            Command::Append { .. } | Command::AppendMany { .. } => {
                self.stage_append(command);
                self.feed_appends();
            }
            Command::StartDispatch { .. } | Command::StopDispatch { .. } => {
                unreachable!("the ingress host handles the dispatcher's commands")
            }
            Command::AcceptTime { seq, reply } => {
                let answer = (self.accept_times.accepted_at(seq), self.accept_times.len());
                let _ = reply.send(answer);
            }
            Command::Read {
                from,
                max_records,
                max_bytes,
                reply,
            } => {
                let id = WalReadId(self.next_id());
                self.reads.insert(id, reply);
                let read = ReadWal {
                    from,
                    max_records,
                    max_bytes,
                };
                self.feed_read(now, id, read);
            }
            Command::StoreCheckpoint { seq, reply } => {
                self.store_checkpoint_now(now, seq);
                if let Some(reply) = reply {
                    self.stores.push((seq, reply));
                }
            }
            Command::Shutdown { reply } => {
                self.shutdown_replies.push(reply);
                self.begin_stop();
            }
        }
    }

    pub(super) fn store_checkpoint_now(&mut self, now: Instant, seq: Seq) {
        narad_core::feed(&mut self.checkpointer, now, CheckpointInput::Store(seq));
        let stored = self.checkpointer.stored();
        // Silent (see `IngressHost::subscribe`): one store per dispatched batch would wake every
        // subscriber for a value none of them follows.
        self.status.send_if_modified(|status| {
            status.checkpoint_stored = stored;
            false
        });
    }

    /// Ends the host once nothing is outstanding: no caller waits and no request of either actor
    /// runs, so a WAL reopened on the same disk right after never races an old request.
    pub(super) fn try_finish(&mut self) -> bool {
        if !self.stopping
            || !self.appends.is_empty()
            || !self.reads.is_empty()
            || self.io_in_flight > 0
        {
            return false;
        }
        let Some(flushed) = self.flushed.clone() else {
            return false;
        };
        for reply in self.shutdown_replies.drain(..) {
            // A caller that gave up waiting does not need the answer.
            let _ = reply.send(flushed.clone());
        }
        true
    }

    pub(super) fn begin_stop(&mut self) {
        if !self.stopping {
            self.stopping = true;
            narad_core::feed(
                &mut self.checkpointer,
                self.clock.now(),
                CheckpointInput::Flush,
            );
        }
    }

    pub(super) fn on_io(&mut self, event: Event) {
        self.io_in_flight -= 1;
        let now = self.clock.now();
        match event {
            Event::Dispatch(_) => unreachable!("the ingress host hands these to the dispatcher"),
            Event::Wal(request, completion) => {
                self.audit.on_completed(&request, &completion);
                narad_core::feed(
                    &mut self.wal,
                    now,
                    WalInput::IoDone {
                        request,
                        completion,
                    },
                )
            }
            Event::Checkpoint(completion) => {
                narad_core::feed(&mut self.checkpointer, now, CheckpointInput::Io(completion))
            }
        }
    }

    /// Feeds each actor its tick once its own timeout has passed (by the clock, not the timer).
    pub(super) fn on_tick(&mut self) {
        let now = self.clock.now();
        if self.wal.poll_timeout().is_some_and(|at| at <= now) {
            narad_core::feed(&mut self.wal, now, WalInput::Tick);
        }
        if self.checkpointer.poll_timeout().is_some_and(|at| at <= now) {
            narad_core::feed(&mut self.checkpointer, now, CheckpointInput::Tick);
        }
    }

    /// Routes both actors' outputs until neither has any (a synced checkpoint feeds the WAL), then
    /// answers the appends, so a caller that is answered already sees the status that answer implies.
    pub(super) fn drain(&mut self) {
        // What the last input asked for goes out before the dispatcher's read and store come in
        // (the drain rule: an actor takes its next input only once its outputs are carried out).
        self.route_all();
        let now = self.clock.now();
        if let Some(read) = self.dispatch_read.take() {
            let id = WalReadId(self.next_id());
            self.dispatch_read_id = Some(id);
            self.feed_read(now, id, read);
        }
        if let Some(seq) = self.dispatch_store.take() {
            self.store_checkpoint_now(now, seq);
            self.dispatch_store_waiting = Some(seq);
        }
        self.route_all();
        for (reply, result) in self.answers.drain(..) {
            // A caller that stopped waiting still had its record handled truthfully.
            let _ = reply.send(result);
        }
        let written = self.checkpointer.written();
        if self.status.borrow().checkpoint_written != written {
            // Silent, like the stored value (see `IngressHost::subscribe`).
            self.status.send_if_modified(|status| {
                status.checkpoint_written = written;
                false
            });
            // Everything below a written checkpoint is visible: its accept instants are not needed.
            self.accept_times.forget_below(written);
        }
        if let Some(seq) = self.dispatch_store_waiting {
            if seq <= written {
                self.dispatch_store_waiting = None;
                self.dispatch_inputs
                    .push_back(DispatcherInput::CheckpointStored { seq });
            }
        }
        // Most drains answer no store (one waits for the write in flight): look before rebuilding.
        if self.stores.iter().any(|(seq, _)| *seq <= written) {
            let (done, waiting) = std::mem::take(&mut self.stores)
                .into_iter()
                .partition(|(seq, _)| *seq <= written);
            self.stores = waiting;
            for (_, reply) in done {
                let _ = reply.send(Ok(()));
            }
        }
    }

    pub(super) fn route_all(&mut self) {
        loop {
            let mut idle = true;
            while let Some(output) = self.wal.poll_output() {
                idle = false;
                self.route_wal(output);
            }
            // One at a time: a synced checkpoint feeds the WAL, whose outputs go out before the next.
            if let Some(output) = self.checkpointer.poll_output() {
                idle = false;
                self.route_checkpoint(output);
            }
            if idle {
                return;
            }
        }
    }

    pub(super) fn route_wal(&mut self, output: WalOutput) {
        match output {
            WalOutput::Io(request) => {
                self.audit.on_request(
                    &request,
                    self.wal.oldest_segment_first_seq(),
                    self.checkpointer.synced(),
                );
                self.io_in_flight += 1;
                self.wal_io.submit(request);
            }
            WalOutput::AppendDone { id, result } => {
                if let Ok(range) = &result {
                    self.audit.on_ack(*range);
                }
                if let Some(reply) = self.appends.remove(&id) {
                    self.answers.push((reply, result));
                }
            }
            WalOutput::Durable { next_seq } => {
                let (repaired, before) = {
                    let status = self.status.borrow();
                    (status.repaired, status.durable_next_seq)
                };
                if repaired && next_seq > before {
                    self.audit.observer.event_fields(
                        "wal",
                        &[
                            TraceField::Str("group commit"),
                            TraceField::U64(before.0),
                            TraceField::U64(next_seq.0),
                        ],
                        format_args!("group commit {before}..{next_seq}"),
                    );
                    // The flush's callers are answered at the end of this drain: their 202 instant.
                    self.accept_times.committed(next_seq, self.clock.now());
                }
                if let Some(observer) = &self.observer {
                    // The open repair's frontier is recovery, not a group commit.
                    if repaired && next_seq > before {
                        observer(next_seq.0 - before.0);
                    }
                }
                self.status.send_modify(|status| {
                    status.repaired = true;
                    status.durable_next_seq = next_seq;
                });
                self.durable_next = next_seq;
            }
            WalOutput::ReadDone { id, result } => {
                if self.dispatch_read_id == Some(id) {
                    self.dispatch_read_id = None;
                    let input = match result {
                        Ok(frames) => DispatcherInput::WalFrames {
                            frames: frames
                                .into_iter()
                                .map(|frame| (frame.seq, frame.payload))
                                .collect(),
                        },
                        Err(WalReadError::Io(fault)) => DispatcherInput::WalReadFailed { fault },
                        Err(error) => DispatcherInput::WalReadFailed {
                            fault: IoFault::Other(error.to_string()),
                        },
                    };
                    self.dispatch_inputs.push_back(input);
                } else if let Some(reply) = self.reads.remove(&id) {
                    let _ = reply.send(result);
                }
            }
            WalOutput::Latched { fault } => {
                tracing::error!(%fault, "ingress WAL latched: every append is refused until restart");
                self.audit
                    .observer
                    .event("wal", format_args!("latched: {fault}"));
                self.status
                    .send_modify(|status| status.latched = Some(fault));
            }
            WalOutput::Warning(warning) => {
                tracing::warn!(?warning, "{}", warning.message());
            }
        }
    }

    pub(super) fn route_checkpoint(&mut self, output: CheckpointOutput) {
        match output {
            CheckpointOutput::Io(request) => {
                self.io_in_flight += 1;
                self.checkpoint_io.submit(request);
            }
            CheckpointOutput::Synced(seq) => {
                self.status.send_modify(|status| {
                    status.checkpoint_synced = seq;
                    status.checkpoint_failure = None;
                });
                narad_core::feed(
                    &mut self.wal,
                    self.clock.now(),
                    WalInput::CheckpointSynced { seq },
                );
            }
            CheckpointOutput::Failed(failure) => {
                tracing::warn!(op = ?failure.op, fault = %failure.fault, "ingress dispatch checkpoint store failed");
                for (_, reply) in self.stores.drain(..) {
                    let _ = reply.send(Err(failure.clone()));
                }
                if let Some(seq) = self.dispatch_store_waiting.take() {
                    let fault = failure.fault.clone();
                    self.dispatch_inputs
                        .push_back(DispatcherInput::CheckpointStoreFailed { seq, fault });
                }
                self.status
                    .send_modify(|status| status.checkpoint_failure = Some(failure));
            }
            CheckpointOutput::Flushed(result) => {
                if self.stopping {
                    self.flushed = Some(result);
                }
            }
        }
    }
}

impl WalPort for Runner {
    fn read(&mut self, read: ReadWal) {
        assert!(
            self.dispatch_read.is_none() && self.dispatch_read_id.is_none(),
            "at most one dispatcher read is outstanding"
        );
        self.dispatch_read = Some(read);
    }

    fn store_checkpoint(&mut self, seq: Seq) {
        assert!(
            self.dispatch_store.is_none() && self.dispatch_store_waiting.is_none(),
            "at most one dispatcher store is outstanding"
        );
        self.dispatch_store = Some(seq);
    }

    fn accept_times(&self) -> &AcceptTimes {
        &self.accept_times
    }
}

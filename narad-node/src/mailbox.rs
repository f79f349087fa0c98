//! Sending into a host's bounded mailbox.
//!
//! Contract: [`send`] is `mpsc::Sender::send` (waits for room, errs once the receiver is gone), minus
//! the send and permit futures when the mailbox has room, which is nearly always: a record's path
//! sends several commands and completions, each costing a future where a `try_send` costs none.

use tokio::sync::mpsc;

/// Sends `value` into `sender`'s mailbox: at once when it has room, else waiting for room like
/// [`mpsc::Sender::send`]. Errs, handing `value` back, once the receiver is gone.
pub async fn send<T>(sender: &mpsc::Sender<T>, value: T) -> Result<(), mpsc::error::SendError<T>> {
    match sender.try_send(value) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Full(value)) => sender.send(value).await,
        Err(mpsc::error::TrySendError::Closed(value)) => Err(mpsc::error::SendError(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_send_with_room_lands_at_once_a_full_mailbox_waits_for_room_and_a_closed_one_errs() {
        let (sender, mut receiver) = mpsc::channel(1);
        send(&sender, 1).await.unwrap();
        // Full: waits until the receiver takes the first value.
        let waiting = tokio::spawn({
            let sender = sender.clone();
            async move { send(&sender, 2).await }
        });
        assert_eq!(receiver.recv().await, Some(1));
        waiting.await.unwrap().unwrap();
        assert_eq!(receiver.recv().await, Some(2));
        drop(receiver);
        assert_eq!(send(&sender, 3).await.unwrap_err().0, 3);
    }
}

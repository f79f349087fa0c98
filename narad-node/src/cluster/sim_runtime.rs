//! quinn on madsim's network (compiled only with `--cfg madsim`): a quinn [`Runtime`] whose timers and
//! tasks are madsim's, and an [`AsyncUdpSocket`] over a madsim [`Endpoint`].
//!
//! madsim's endpoint sends and receives with `async` calls only, while quinn's socket is poll-based:
//! - a send is queued (never `WouldBlock`) and a task of the node hands each datagram to madsim on a
//!   task of its own (madsim delays every send by at least a millisecond; in turn, they would cap the
//!   socket's rate);
//! - [`RECEIVERS`] tasks of the node receive into a queue that [`AsyncUdpSocket::poll_recv`] drains.
//!
//! Both tasks are spawned on the current madsim node, so a kill of the node drops them with the rest
//! of its tasks (and its endpoint's port binding). A datagram is a madsim message with tag 0 holding a
//! `Vec<u8>`, as madsim's own `UdpSocket` sends them.

use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use madsim::net::Endpoint;
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncTimer, AsyncUdpSocket, Runtime, UdpPoller};
use tokio::sync::mpsc;

use crate::clock::WakeTimer;

/// The madsim message tag of a datagram (as madsim's `UdpSocket`).
const DATAGRAM_TAG: u64 = 0;
/// Datagrams received and not yet read by quinn, at most (more are dropped, as a full socket buffer
/// drops them).
const RECEIVED_MAX: usize = 4096;
/// Receive tasks per socket: each takes a datagram per millisecond at most (madsim's delay floor),
/// so this many carry about 40 MB/s of 1,200-byte datagrams.
const RECEIVERS: usize = 32;

/// quinn's runtime under the simulator: madsim's timers and tasks.
#[derive(Debug, Default)]
pub struct SimRuntime;

impl Runtime for SimRuntime {
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(WakeTimer::at(at))
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        madsim::task::spawn(future);
    }

    fn wrap_udp_socket(&self, _socket: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        // The simulator has no OS sockets; endpoints are built with `new_with_abstract_socket`.
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no OS sockets under the simulator",
        ))
    }
}

/// quinn's timers are the node's wake-up timer: one madsim timer event per deadline, not per poll.
impl AsyncTimer for WakeTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        WakeTimer::reset(&mut self, at);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Future::poll(self.as_mut(), cx)
    }
}

/// A UDP socket on madsim's network.
pub struct SimSocket {
    local: SocketAddr,
    outgoing: mpsc::UnboundedSender<(SocketAddr, Vec<u8>)>,
    incoming: Mutex<mpsc::Receiver<(SocketAddr, Vec<u8>)>>,
}

impl fmt::Debug for SimSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSocket")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl SimSocket {
    /// Binds `addr` on the current madsim node and starts the socket's send and receive tasks there.
    pub async fn bind(addr: SocketAddr) -> io::Result<Arc<SimSocket>> {
        let endpoint = Endpoint::bind(addr).await?;
        let local = endpoint.local_addr()?;
        let (outgoing, mut to_send) = mpsc::unbounded_channel::<(SocketAddr, Vec<u8>)>();
        let (received, incoming) = mpsc::channel(RECEIVED_MAX);
        let sender = endpoint.clone();
        madsim::task::spawn(async move {
            while let Some((to, datagram)) = to_send.recv().await {
                // Each send on its own task: madsim delays every send and every receive by at
                // least a millisecond (its `sleep` floor) before the link's latency, so one task
                // sending in turn would cap a socket at a thousand datagrams a second, about
                // 1.2 MB/s, and a large commit would crawl for a reason no real network has. A
                // datagram is fire and forget: a send that fails is a lost packet, which QUIC
                // repairs; their order is the network's to keep or not, as with any UDP.
                let sender = sender.clone();
                madsim::task::spawn(async move {
                    let _ = sender
                        .send_to_raw(to, DATAGRAM_TAG, Box::new(datagram))
                        .await;
                });
            }
        });
        // Receivers side by side, for the same reason as the sends.
        for _ in 0..RECEIVERS {
            let endpoint = endpoint.clone();
            let received = received.clone();
            madsim::task::spawn(async move {
                loop {
                    let Ok((payload, from)) = endpoint.recv_from_raw(DATAGRAM_TAG).await else {
                        return;
                    };
                    let Ok(datagram) = payload.downcast::<Vec<u8>>() else {
                        continue;
                    };
                    match received.try_send((from, *datagram)) {
                        Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                        Err(mpsc::error::TrySendError::Closed(_)) => return,
                    }
                }
            });
        }
        Ok(Arc::new(SimSocket {
            local,
            outgoing,
            incoming: Mutex::new(incoming),
        }))
    }
}

/// Always writable: sends are queued.
#[derive(Debug)]
struct Writable;

impl UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for SimSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable)
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        // One datagram per transmit (`max_transmit_segments` is 1).
        self.outgoing
            .send((transmit.destination, transmit.contents.to_vec()))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the socket's sender stopped"))
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut incoming = self
            .incoming
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut filled = 0;
        while filled < bufs.len().min(meta.len()) {
            let polled = if filled == 0 {
                incoming.poll_recv(cx)
            } else {
                match incoming.try_recv() {
                    Ok(datagram) => Poll::Ready(Some(datagram)),
                    Err(_) => break,
                }
            };
            match polled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the socket's receiver stopped",
                    )))
                }
                Poll::Ready(Some((from, datagram))) => {
                    let buf = &mut bufs[filled];
                    let len = datagram.len().min(buf.len());
                    buf[..len].copy_from_slice(&datagram[..len]);
                    meta[filled] = RecvMeta {
                        addr: from,
                        len,
                        stride: len,
                        ecn: None,
                        dst_ip: Some(self.local.ip()),
                    };
                    filled += 1;
                }
            }
        }
        Poll::Ready(Ok(filled))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

//! A TCP proxy in front of PostgreSQL that a test can cut, to take the database away from
//! one replica without disturbing any other test.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Forwards every byte both ways.
    Open,
    /// Closes every connection and refuses new ones, as a dead server would.
    Severed,
    /// Keeps connections open but forwards nothing, as a partitioned network would.
    Stalled,
    /// Forwards every byte both ways, each chunk this late, as a slow network would.
    Delayed(std::time::Duration),
}

/// The mode, and how many times it was set: a connection lives within one setting.
#[derive(Clone, Copy, Debug)]
struct Setting {
    mode: Mode,
    epoch: u64,
    /// Where connections go: moved, as a virtual IP or HAProxy moves to a promoted standby.
    upstream: SocketAddr,
}

pub(crate) struct Proxy {
    address: SocketAddr,
    setting: watch::Sender<Setting>,
    task: tokio::task::JoinHandle<()>,
    counts: Arc<Counts>,
}

/// How many client connections are open through the proxy, now and at most so far: what the
/// replica holds open to "the database", whatever the database does.
#[derive(Default)]
struct Counts {
    open: AtomicUsize,
    peak: AtomicUsize,
}

/// Counts one client connection as open for as long as it lives.
struct Open(Arc<Counts>);

impl Open {
    fn new(counts: &Arc<Counts>) -> Open {
        let open = counts.open.fetch_add(1, Ordering::SeqCst) + 1;
        counts.peak.fetch_max(open, Ordering::SeqCst);
        Open(counts.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Proxy {
    /// Starts forwarding 127.0.0.1:<some port> to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (setting, watcher) = watch::channel(Setting { mode: Mode::Open, epoch: 0, upstream });
        let counts = Arc::new(Counts::default());
        let task = tokio::spawn({
            let counts = counts.clone();
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else { return };
                    let (open, watcher) = (Open::new(&counts), watcher.clone());
                    tokio::spawn(async move {
                        let _open = open;
                        forward(client, watcher).await;
                    });
                }
            }
        });
        Proxy { address, setting, task, counts }
    }

    /// The most client connections that were open at once so far.
    pub(crate) fn peak_connections(&self) -> usize {
        self.counts.peak.load(Ordering::SeqCst)
    }

    /// Client connections open now.
    pub(crate) fn open_connections(&self) -> usize {
        self.counts.open.load(Ordering::SeqCst)
    }

    pub(crate) fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sends new connections to `upstream` from now on, and closes every open one, as a
    /// virtual IP or a health-checking proxy does when a standby is promoted.
    pub(crate) fn retarget(&self, upstream: SocketAddr) {
        self.setting.send_modify(|setting| {
            setting.upstream = upstream;
            setting.epoch += 1;
        });
    }

    /// Sends new connections to `upstream` from now on and leaves every open one where it is,
    /// as a DNS name moved to a promoted standby does: what was connected stays connected.
    pub(crate) fn repoint(&self, upstream: SocketAddr) {
        self.setting.send_modify(|setting| setting.upstream = upstream);
    }

    /// Changes the mode; every connection opened under the previous setting is closed (a
    /// stalled one as soon as the stall ends).
    pub(crate) fn set(&self, mode: Mode) {
        self.setting.send_modify(|setting| {
            setting.mode = mode;
            setting.epoch += 1;
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set(Mode::Severed);
        self.task.abort();
    }
}

async fn forward(mut client: TcpStream, mut setting: watch::Receiver<Setting>) {
    let start = *setting.borrow_and_update();
    let upstream = start.upstream;
    match start.mode {
        Mode::Severed => return,
        Mode::Stalled => {
            // Accept and say nothing until the setting changes, or the client gives up.
            tokio::select! {
                _ = setting.wait_for(|now| now.epoch != start.epoch) => {}
                () = until_closed(&mut client) => {}
            }
            return;
        }
        Mode::Delayed(delay) => {
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            let ((from_client, to_client), (from_server, to_server)) =
                (client.into_split(), server.into_split());
            tokio::select! {
                () = pump(from_client, to_server, delay) => {}
                () = pump(from_server, to_client, delay) => {}
                _ = setting.wait_for(|now| now.epoch != start.epoch) => {}
            }
            return;
        }
        Mode::Open => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    let changed = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
        changed = setting.wait_for(|now| now.epoch != start.epoch) => changed.map(|now| *now),
    };
    if let Ok(Setting { mode: Mode::Stalled, epoch, .. }) = changed {
        // Hold both sockets open and silent until the stall ends (or the client closes its
        // end), then close them.
        tokio::select! {
            _ = setting.wait_for(|now| now.epoch != epoch) => {}
            () = until_closed(&mut client) => {}
        }
    }
}

/// Copies one direction, holding each chunk back for `delay`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: std::time::Duration,
) {
    use tokio::io::AsyncWriteExt;
    let mut buffer = vec![0_u8; 16 * 1024];
    while let Ok(read) = from.read(&mut buffer).await {
        if read == 0 {
            return;
        }
        tokio::time::sleep(delay).await;
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// Reads and discards what the client sends until it closes its end.
async fn until_closed(client: &mut TcpStream) {
    let mut sink = [0_u8; 1024];
    while let Ok(read) = client.read(&mut sink).await {
        if read == 0 {
            return;
        }
    }
}

//! A TCP proxy in front of PostgreSQL that a test can cut, to take the database away from
//! one replica without disturbing any other test.

use std::net::SocketAddr;

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
}

/// The mode, and how many times it was set: a connection lives within one setting.
#[derive(Clone, Copy, Debug)]
struct Setting {
    mode: Mode,
    epoch: u64,
}

pub(crate) struct Proxy {
    address: SocketAddr,
    setting: watch::Sender<Setting>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding 127.0.0.1:<some port> to `upstream`.
    pub(crate) async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (setting, watcher) = watch::channel(Setting { mode: Mode::Open, epoch: 0 });
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                tokio::spawn(forward(client, upstream, watcher.clone()));
            }
        });
        Proxy { address, setting, task }
    }

    pub(crate) fn address(&self) -> SocketAddr {
        self.address
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

async fn forward(mut client: TcpStream, upstream: SocketAddr, mut setting: watch::Receiver<Setting>) {
    let start = *setting.borrow_and_update();
    match start.mode {
        Mode::Severed => return,
        Mode::Stalled => {
            // Accept and say nothing until the setting changes.
            let _ = setting.wait_for(|now| now.epoch != start.epoch).await;
            return;
        }
        Mode::Open => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    let changed = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
        changed = setting.wait_for(|now| now.epoch != start.epoch) => changed.map(|now| *now),
    };
    if let Ok(Setting { mode: Mode::Stalled, epoch }) = changed {
        // Hold both sockets open and silent until the stall ends, then close them.
        let _ = setting.wait_for(|now| now.epoch != epoch).await;
    }
}

//! Every log line the test binary's code writes, kept in memory so a test can read its own.
//!
//! The subscriber is the process's global one (replicas log from tasks on many threads), so
//! lines of concurrent tests interleave in it; a test finds its own by something only it
//! logs, such as a request id it chose.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::fmt::MakeWriter;

#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// The process's captured logs, installing the capture the first time.
    pub(crate) fn capture() -> Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            tracing_subscriber::fmt()
                .with_env_filter("info")
                .with_ansi(false)
                .with_writer(logs.clone())
                .init();
            logs
        })
        .clone()
    }

    /// A capture of every line this thread's code logs at `level` or above, for as long as the
    /// guard lives, apart from the process's capture. A test on a current-thread runtime (as
    /// `#[sqlx::test]` is) sees its replicas' lines too, since their tasks run on its thread.
    pub(crate) fn capture_this_thread(level: tracing::Level) -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(logs.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (logs, guard)
    }

    /// Everything captured.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())).into_owned()
    }

    /// Every line that contains `needle`.
    pub(crate) fn lines_with(&self, needle: &str) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

pub(crate) struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Logs {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter(self.0.clone())
    }
}

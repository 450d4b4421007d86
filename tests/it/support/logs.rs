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

thread_local! {
    /// This thread's own capture, while a [`ThreadCapture`] guard lives: where its lines go,
    /// and from which level.
    static THIS_THREAD: std::cell::RefCell<Option<(Logs, tracing::Level)>> = const { std::cell::RefCell::new(None) };
}

/// While it lives, the lines of its thread's code are captured apart (see
/// [`Logs::capture_this_thread`]).
pub(crate) struct ThreadCapture(());

impl Drop for ThreadCapture {
    fn drop(&mut self) {
        THIS_THREAD.with(|capture| capture.borrow_mut().take());
    }
}

/// The writer of a thread's own capture; it writes nowhere on a thread without one.
#[derive(Clone, Copy)]
struct ThisThread;

impl<'a> MakeWriter<'a> for ThisThread {
    type Writer = Box<dyn Write>;

    fn make_writer(&'a self) -> Self::Writer {
        match THIS_THREAD.with(|capture| capture.borrow().as_ref().map(|(logs, _)| logs.clone())) {
            Some(logs) => Box::new(LogWriter(logs.0)),
            None => Box::new(std::io::sink()),
        }
    }
}

impl Logs {
    /// The process's captured logs (`info` and above), installing the capture the first time.
    ///
    /// One subscriber serves the whole process for its whole life, with a second layer for the
    /// threads that capture their own lines: per-thread subscribers (`set_default`) race with
    /// one another and with the global one over tracing's cached callsite interest, and a
    /// capture then missed most of its lines while other tests ran beside it.
    pub(crate) fn capture() -> Logs {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        use tracing_subscriber::Layer;

        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs::default();
            let process = tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(logs.clone())
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
            // Asked at every span and event (the callsite's interest is "sometimes", never
            // cached as yes or no), so a thread that starts capturing later sees its lines.
            let this_thread =
                tracing_subscriber::fmt::layer().with_ansi(false).with_writer(ThisThread).with_filter(
                    tracing_subscriber::filter::dynamic_filter_fn(|metadata, _| {
                        THIS_THREAD.with(|capture| {
                            capture.borrow().as_ref().is_some_and(|(_, level)| metadata.level() <= level)
                        })
                    })
                    .with_callsite_filter(|_| tracing::subscriber::Interest::sometimes()),
                );
            tracing_subscriber::registry().with(process).with(this_thread).init();
            logs
        })
        .clone()
    }

    /// A capture of every line this thread's code logs at `level` or above, for as long as the
    /// guard lives, apart from the process's capture. A test on a current-thread runtime (as
    /// `#[sqlx::test]` is) sees its replicas' lines too, since their tasks run on its thread.
    pub(crate) fn capture_this_thread(level: tracing::Level) -> (Logs, ThreadCapture) {
        Logs::capture();
        let logs = Logs::default();
        THIS_THREAD.with(|capture| *capture.borrow_mut() = Some((logs.clone(), level)));
        (logs, ThreadCapture(()))
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

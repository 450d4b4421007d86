//! `PLEXSPHERE_RULES_DIR`: the leader applies a directory of envoyproxy/ratelimit
//! configuration files as `plexsphere rules apply --prune` would, when it becomes leader and
//! within an interval of any change, as envoyproxy/ratelimit reloads its runtime directory (a
//! mounted ConfigMap works as it is: its hidden `..data` entries are skipped, its visible
//! files are links into them).
//!
//! A change is noticed by the files' names and contents, read at every look (configuration
//! files are small), not by modification times, which a ConfigMap's swap of links does not
//! change. A refused file is logged and counted once per content, and nothing of any file is
//! applied: the rules in force stay as they were. A store that cannot answer is tried again at
//! the next look. Only the leader applies, so two replicas never apply the same change.

use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::observation::metrics::{Metrics, RulesDirOutcome};
use crate::runtime::leader::Leadership;

/// The loop's name, as logs and the tasks' list say it.
pub const LOOP_NAME: &str = "the rules directory";

/// The files' names and contents, hashed; `None` when the directory cannot be read.
fn fingerprint(directory: &PathBuf) -> Result<[u8; 32], rules::files::FileError> {
    let mut hash = Sha256::new();
    for file in rules::files::list_files(std::slice::from_ref(directory))? {
        let content = std::fs::read(&file.location).map_err(|error| rules::files::FileError {
            file: file.name.clone(),
            path: String::new(),
            reason: format!("cannot be read: {error}"),
        })?;
        for field in [file.name.as_bytes(), &content] {
            hash.update((field.len() as u64).to_be_bytes());
            hash.update(field);
        }
    }
    Ok(hash.finalize().into())
}

/// Applies `directory` while this replica leads, until `shutdown`.
pub async fn run(
    directory: PathBuf,
    operations: service::Operations,
    mut leadership: Leadership,
    metrics: Metrics,
    interval: Duration,
    shutdown: CancellationToken,
) {
    // What the last look that needs no retry saw: applied, or refused.
    let mut settled: Option<[u8; 32]> = None;
    loop {
        if !leadership.is_leader() {
            // A new leader applies at once: its predecessor may not have seen the last change.
            settled = None;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = leadership.wait_until(true) => {}
            }
        }
        match fingerprint(&directory) {
            Ok(seen) if settled == Some(seen) => {}
            Ok(seen) => {
                if look(&directory, &operations, &metrics).await {
                    settled = Some(seen);
                }
            }
            Err(error) => {
                tracing::error!(directory = %directory.display(), %error, "cannot read the rules directory; the rules in force stay");
                metrics.rules_dir_apply(RulesDirOutcome::error);
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Reads and applies the directory once; whether the outcome is settled (applied, or refused
/// for its content) rather than worth another try.
async fn look(directory: &PathBuf, operations: &service::Operations, metrics: &Metrics) -> bool {
    let files = match rules::files::read(std::slice::from_ref(directory)) {
        Ok(files) => files,
        Err(refused) => {
            tracing::error!(directory = %directory.display(), error = %refused, "a file of the rules directory was refused; nothing of it was applied and the rules in force stay");
            metrics.rules_dir_apply(RulesDirOutcome::refused);
            return true;
        }
    };
    let applied = operations
        .apply_rule_files(audit::Actor::rules_directory(), &files, rules::Prune::EveryFileRule, false)
        .await;
    match applied {
        Ok(changes) => {
            for change in changes.iter().filter(|change| change.applied != rules::Applied::Unchanged) {
                tracing::info!(
                    change = change.applied.as_str(),
                    rule = %change.id,
                    path = %change.path,
                    file = %change.source,
                    "applied a rule from the rules directory"
                );
            }
            metrics.rules_dir_apply(RulesDirOutcome::applied);
            true
        }
        Err(error) => {
            tracing::error!(directory = %directory.display(), error = %ratebudget::cause_chain(&error), "cannot apply the rules directory; trying again at the next look");
            metrics.rules_dir_apply(RulesDirOutcome::error);
            false
        }
    }
}

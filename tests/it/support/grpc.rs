//! An independent client of Envoy's rate limit service protocol: Python's grpcio with Envoy's
//! protos (those the envoy-types package ships) compiled by grpcio-tools (`tests/grpc/`), not
//! the server's own generated code, so the wire format is checked against a second
//! implementation.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The client's python, its environment set up once per test process (`tests/grpc/setup.sh`
/// installs what is missing and does nothing otherwise).
fn python() -> &'static PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let output = Command::new("bash")
            .arg(workspace().join("tests/grpc/setup.sh"))
            .current_dir(workspace())
            .stderr(Stdio::inherit())
            .output()
            .expect("bash runs");
        assert!(
            output.status.success(),
            "the gRPC test client needs python3 with venv and pip's grpcio and grpcio-tools: `bash tests/grpc/setup.sh` failed"
        );
        workspace().join(String::from_utf8(output.stdout).unwrap().trim())
    })
}

/// Makes `calls` (see `tests/grpc/rls_client.py`) in order against `target`; one answer each:
/// `{"grpc": <status code name>, "details", "response"}`.
pub(crate) async fn calls(target: SocketAddr, calls: Value) -> Vec<Value> {
    let script = json!({ "target": target.to_string(), "calls": calls }).to_string();
    let output = run("tests/grpc/rls_client.py", script).await;
    assert!(output.status.success(), "the gRPC client failed");
    serde_json::from_slice::<Vec<Value>>(&output.stdout).expect("the client prints a JSON array")
}

/// One call's answer.
pub(crate) async fn call(target: SocketAddr, call: Value) -> Value {
    calls(target, json!([call])).await.remove(0)
}

/// Runs a script of tests/grpc/ (on the client's python) with `arguments` and `env`: whether it
/// exited 0, and what it printed.
pub(crate) async fn script(path: &str, arguments: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut command = Command::new(python());
    command.arg(workspace().join(path)).args(arguments).current_dir(workspace());
    for (name, value) in env {
        command.env(name, value);
    }
    let output =
        tokio::task::spawn_blocking(move || command.output().expect("the script starts")).await.unwrap();
    let mut printed = String::from_utf8_lossy(&output.stdout).into_owned();
    printed.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), printed)
}

/// Runs simulated Envoys (`tests/grpc/rlqs_envoys.py`: each Envoy's `rate_limit_quota` filter
/// as Envoy's source has it, its load, its reports and its streams) by `script`, and returns
/// what they did.
pub(crate) async fn envoys(script: Value) -> Value {
    let output = run("tests/grpc/rlqs_envoys.py", script.to_string()).await;
    assert!(output.status.success(), "the simulated Envoys failed");
    let done: Value = serde_json::from_slice(&output.stdout).expect("the simulated Envoys print JSON");
    assert!(
        done.get("error").is_none_or(Value::is_null),
        "the simulated Envoys stopped early: {}",
        done["error"]
    );
    done
}

/// Runs the script at `path` (from the workspace) on the client's python, `input` on its
/// standard input; its standard error is the test's.
async fn run(path: &'static str, input: String) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(python())
            .arg(workspace().join(path))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| panic!("{path} starts: {error}"));
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

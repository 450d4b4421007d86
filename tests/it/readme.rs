//! The README's walk-through, run as a newcomer would run it: every shell block of "Walk-through"
//! and "Rules", twice in a row in one shell, against the binary served with the quick start's
//! own knobs, each command's answer checked against what the README says it answers.
//!
//! A step is a command and the `# → ` lines after it, which say what it prints; `…` stands for
//! text that differs from run to run (ids, instants, counts). A step without such lines must
//! succeed (exit status 0). Two things are substituted, and only these: the replica's address
//! for the quick start's `127.0.0.1:8080`, and this test's database and binary for the
//! command line's `DATABASE_URL=… cargo run … --`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::support::process::{database_url, Launch, BINARY};

const README: &str = include_str!("../../README.md");

/// One command of a block and what the README says it prints.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The first ```sh block after the heading `heading`.
fn block_after(heading: &str) -> &'static str {
    let from = README.find(heading).unwrap_or_else(|| panic!("the README has no {heading:?}"));
    let start = README[from..].find("```sh\n").expect("a shell block") + from + "```sh\n".len();
    let end = README[start..].find("```").expect("the block ends") + start;
    &README[start..end]
}

fn steps(block: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continued = false;
    for line in block.lines() {
        if let Some(expected) = line.strip_prefix("# → ") {
            steps.last_mut().expect("an expectation follows a command").expected.push(expected.to_owned());
        } else if line.trim().is_empty() || line.starts_with('#') {
            continue;
        } else if continued {
            let step = steps.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
        } else {
            steps.push(Step { command: line.to_owned(), expected: Vec::new() });
        }
        continued = line.ends_with('\\');
    }
    steps
}

/// Whether `output` is what `expected` says, line by line, `…` standing for any text within a
/// line.
fn answers(output: &str, expected: &[String]) -> bool {
    let lines: Vec<&str> = output.lines().collect();
    lines.len() == expected.len()
        && lines.iter().zip(expected).all(|(line, pattern)| matches(line.trim_end(), pattern))
}

/// A glob match of one line, `…` the only wildcard.
fn matches(line: &str, pattern: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let [first, middle @ .., last] = parts.as_slice() else { return line == pattern };
    let Some(mut rest) = line.strip_prefix(first) else { return false };
    for part in middle {
        let Some(at) = rest.find(part) else { return false };
        rest = &rest[at + part.len()..];
    }
    rest.ends_with(last)
}

/// A shell the steps run in, one after another, so that variables carry from one to the next.
struct Shell {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: BufReader<std::process::ChildStdout>,
}

const END: &str = "__readme_step_done__";

impl Shell {
    fn start(directory: &std::path::Path) -> Shell {
        let mut child = Command::new("bash")
            .current_dir(directory)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bash runs");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Shell { child, input, output }
    }

    /// Runs `command` and returns what it printed (standard output and error) and its status.
    fn run(&mut self, command: &str) -> (String, i32) {
        writeln!(self.input, "{{\n{command}\n}} 2>&1; printf '\\n{END} %s\\n' $?").unwrap();
        self.input.flush().unwrap();
        let mut printed = String::new();
        loop {
            let mut line = String::new();
            assert!(self.output.read_line(&mut line).unwrap() > 0, "the shell ended after {command}");
            if let Some(status) = line.strip_prefix(END) {
                // The newline printed before the marker is the test's, not the command's.
                let printed = printed.strip_suffix('\n').unwrap_or(&printed).to_owned();
                return (printed, status.trim().parse().unwrap());
            }
            printed.push_str(&line);
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[sqlx::test(migrator = "app::migrations::MIGRATOR")]
async fn the_walk_through_answers_what_the_readme_says_twice_in_a_row(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // The quick start's knobs, as the README writes them.
    let serve = README.lines().find(|line| line.contains("-- serve")).expect("the quick start serves");
    let knob = |name: &str| {
        serve
            .split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("the quick start sets {name}"))
            .to_owned()
    };
    let database = database_url(&connect);
    let replica = Launch::serve(&database)
        .knob("PLEXSPHERE_OPERATOR_TOKEN", &knob("PLEXSPHERE_OPERATOR_TOKEN"))
        .knob("PLEXSPHERE_SECRETS_KEY", &knob("PLEXSPHERE_SECRETS_KEY"))
        .start()
        .await;
    let quick_start_database = knob("DATABASE_URL");

    let substitute = |block: &str| {
        block.replace("127.0.0.1:8080", &replica.address().to_string()).replace(
            &format!("DATABASE_URL={quick_start_database} cargo run -q --release -p app --bin plexsphere --"),
            &format!("DATABASE_URL={database} {BINARY}"),
        )
    };
    let walk_through = substitute(block_after("### Walk-through"));
    let rules = substitute(block_after("### Rules:"));
    assert!(!walk_through.contains("cargo run"), "every command line is substituted:\n{walk_through}");

    let directory = std::env::temp_dir().join(format!("plexsphere-readme-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&directory).unwrap();
    let mut shell = Shell::start(&directory);
    for run in 1..=2 {
        for block in [&walk_through, &rules] {
            for step in steps(block) {
                let (printed, status) = shell.run(&step.command);
                assert_eq!(status, 0, "run {run}: {}\nprinted:\n{printed}", step.command);
                if !step.expected.is_empty() {
                    assert!(
                        answers(&printed, &step.expected),
                        "run {run}: {}\nprinted:\n{printed}\nthe README says:\n{}",
                        step.command,
                        step.expected.join("\n")
                    );
                }
            }
        }
    }
    drop(shell);
    std::fs::remove_dir_all(&directory).unwrap();
}

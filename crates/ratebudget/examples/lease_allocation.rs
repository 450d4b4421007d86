//! How replicas that lease one saturated bucket share it (issue 25, item 2), simulated against
//! exact one-at-a-time decisions: each replica sizing its own leases from its demand and the
//! bucket's level (what the guard does), or a leader handing out shares of the rate in
//! proportion to the demand each replica reports, or max-min fairly.
//!
//! ```text
//! cargo run --release -p ratebudget --example lease_allocation
//! ```
//!
//! Simulated time, one bucket (rate R, burst B), three replicas whose requests of one token
//! arrive as Poisson processes, each decided at its arrival (a statement's round trip is left
//! out: it delays a decision, it does not change who gets the tokens). It prints, per scenario and allocator,
//! every replica's grants beside the exact decisions', the total, and the worst window of
//! grant instants beyond `B + R × window` (never above 0 for any of them: the allocators
//! differ in who gets the tokens, not in how many there are).

// A simulation prints its figures.
#![allow(clippy::print_stdout)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Seconds simulated per scenario.
const SECONDS: f64 = 20.0;
/// The lease period, and how often the leader hands out shares.
const PERIOD: f64 = 0.1;
/// The most of the burst one lease takes (the guard's MAX_SHARE).
const MAX_SHARE: f64 = 0.25;

#[derive(Clone, Copy)]
struct Bucket {
    rate: f64,
    burst: f64,
    level: f64,
    at: f64,
    /// The number of the latest lease, as the row's lease_serial.
    serial: u64,
}

impl Bucket {
    fn refill(&mut self, now: f64) {
        self.level = (self.level + (now - self.at).max(0.0) * self.rate).min(self.burst);
        self.at = self.at.max(now);
    }

    /// The lease statement: give back `refund` of lease `serial` if it is the latest, then
    /// take whole tokens between 1 and `at_most`; (taken, serial, level left).
    fn lease(&mut self, now: f64, at_most: f64, refund: f64, serial: u64) -> (f64, u64, f64) {
        self.refill(now);
        if refund > 0.0 && serial == self.serial {
            self.level = (self.level + refund).min(self.burst);
        }
        if self.level < 1.0 {
            return (0.0, self.serial, self.level);
        }
        let taken = self.level.min(at_most.max(1.0)).floor();
        self.level -= taken;
        self.serial += 1;
        (taken, self.serial, self.level)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Allocator {
    Exact,
    SelfSized,
    Proportional,
    MaxMin,
}

impl Allocator {
    fn name(self) -> &'static str {
        match self {
            Allocator::Exact => "exact, one at a time",
            Allocator::SelfSized => "self-sized leases",
            Allocator::Proportional => "leader, proportional shares",
            Allocator::MaxMin => "leader, max-min fair shares",
        }
    }
}

/// One replica's lease, as the guard keeps it.
#[derive(Clone, Copy, Default)]
struct Lease {
    held: f64,
    serial: u64,
    /// The level the lease left, and when: refilled, the most the row can hold since.
    row: (f64, f64),
    /// Arrivals counted in the current and the last period.
    asked: f64,
    last: f64,
    window: f64,
    /// The leader's share for the current period, in tokens.
    share: f64,
}

impl Lease {
    fn usable(&self, bucket: &Bucket, now: f64) -> f64 {
        let row = (self.row.0 + (now - self.row.1) * bucket.rate).min(bucket.burst);
        self.held.min(bucket.burst - row).max(0.0)
    }
}

/// The shares of `rate × PERIOD` a leader hands out for `demands` (tokens a period).
fn shares(allocator: Allocator, demands: &[f64], supply: f64) -> Vec<f64> {
    match allocator {
        Allocator::Proportional => {
            let total: f64 = demands.iter().sum();
            demands.iter().map(|demand| if total > 0.0 { supply * demand / total } else { 0.0 }).collect()
        }
        Allocator::MaxMin => {
            // Water-filling: everyone gets the same until their demand is met.
            let mut share = vec![0.0; demands.len()];
            let mut left = supply;
            let mut open: Vec<usize> = (0..demands.len()).filter(|&i| demands[i] > 0.0).collect();
            while left > 1e-9 && !open.is_empty() {
                let each = left / open.len() as f64;
                let mut next = Vec::new();
                for &i in &open {
                    let give = each.min(demands[i] - share[i]);
                    share[i] += give;
                    left -= give;
                    if demands[i] - share[i] > 1e-9 {
                        next.push(i);
                    }
                }
                if next.len() == open.len() {
                    break;
                }
                open = next;
            }
            share
        }
        Allocator::Exact | Allocator::SelfSized => vec![0.0; demands.len()],
    }
}

/// Simulates `allocator` with replicas asking `demands` tokens a second: grants per replica,
/// and the worst window's excess over the bound.
fn simulate(allocator: Allocator, rate: f64, burst: f64, demands: &[f64], seed: u64) -> (Vec<u64>, f64, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Every arrival, in time order: (instant, replica).
    let mut arrivals = Vec::new();
    for (replica, &demand) in demands.iter().enumerate() {
        let mut at = 0.0;
        loop {
            at += -(1.0 - rng.random::<f64>()).ln() / demand;
            if at >= SECONDS {
                break;
            }
            arrivals.push((at, replica));
        }
    }
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut bucket = Bucket { rate, burst, level: burst, at: 0.0, serial: 0 };
    let mut leases = vec![Lease::default(); demands.len()];
    let mut granted = vec![0_u64; demands.len()];
    let mut instants = Vec::new();
    let mut next_share = 0.0;
    let mut statements = 0_u64;
    for &(arrived, replica) in &arrivals {
        if matches!(allocator, Allocator::Proportional | Allocator::MaxMin) && arrived >= next_share {
            // The leader's round: each replica reports its last period's demand.
            let demands: Vec<f64> = leases.iter().map(|lease| lease.last.max(lease.asked)).collect();
            for (lease, share) in leases.iter_mut().zip(shares(allocator, &demands, rate * PERIOD)) {
                lease.share = share;
            }
            next_share = arrived + PERIOD;
        }
        let lease = &mut leases[replica];
        let now = arrived;
        if now - lease.window >= PERIOD {
            lease.last = lease.asked * PERIOD / (now - lease.window);
            lease.asked = 0.0;
            lease.window = now;
        }
        lease.asked += 1.0;
        let grant = match allocator {
            Allocator::Exact => {
                statements += 1;
                bucket.refill(now);
                let granted = bucket.level >= 1.0;
                if granted {
                    bucket.level -= 1.0;
                }
                granted
            }
            _ if lease.usable(&bucket, now) >= 1.0 => {
                lease.held -= 1.0;
                true
            }
            _ => {
                let wanted = match allocator {
                    Allocator::SelfSized => lease.last.max(lease.asked),
                    _ => lease.share,
                };
                let at_most = wanted.min(burst * MAX_SHARE);
                let refund = lease.usable(&bucket, now);
                statements += 1;
                let (taken, serial, left) = bucket.lease(now, at_most, refund, lease.serial);
                lease.serial = serial;
                lease.row = (left, now);
                lease.held = (taken - 1.0).max(0.0);
                taken >= 1.0
            }
        };
        if grant {
            granted[replica] += 1;
            instants.push(now);
        }
    }
    instants.sort_by(f64::total_cmp);
    let mut worst = f64::MIN;
    let mut first = 0;
    // Windows ending at each grant: the one from the earliest start is the tightest only in
    // count, so try every start within reach (B + R × window grows with the window).
    for last in 0..instants.len() {
        while instants[last] - instants[first] > 5.0 {
            first += 1;
        }
        for start in first..=last {
            let allowed = burst + rate * (instants[last] - instants[start]);
            worst = worst.max((last - start + 1) as f64 - allowed);
        }
    }
    (granted, worst, statements)
}

fn main() {
    let scenarios: [(&str, f64, f64, [f64; 3]); 5] = [
        ("equal, 3x the rate", 1000.0, 500.0, [1000.0, 1000.0, 1000.0]),
        ("skewed, 2x the rate", 1000.0, 500.0, [1500.0, 400.0, 100.0]),
        ("one hog, 5x the rate", 1000.0, 500.0, [4800.0, 100.0, 100.0]),
        ("below the rate", 1000.0, 500.0, [300.0, 300.0, 300.0]),
        ("near the rate, a big burst", 1000.0, 5000.0, [400.0, 300.0, 250.0]),
    ];
    println!("one bucket, three replicas, {SECONDS} s, lease period {PERIOD} s");
    for (label, rate, burst, demands) in scenarios {
        println!("\n{label}: rate {rate}/s, burst {burst}, demands {demands:?}/s");
        println!(
            "{:<30} {:>28} {:>10} {:>10} {:>14} {:>12}",
            "allocator", "grants per replica", "total", "vs exact", "worst window", "statements"
        );
        let (exact, _, _) = simulate(Allocator::Exact, rate, burst, &demands, 7);
        let exact_total: u64 = exact.iter().sum();
        for allocator in [Allocator::Exact, Allocator::SelfSized, Allocator::Proportional, Allocator::MaxMin]
        {
            let (granted, worst, statements) = simulate(allocator, rate, burst, &demands, 7);
            let total: u64 = granted.iter().sum();
            println!(
                "{:<30} {:>28} {:>10} {:>9.2}% {:>14.2} {:>12}",
                allocator.name(),
                format!("{granted:?}"),
                total,
                (total as f64 - exact_total as f64) * 100.0 / exact_total as f64,
                worst,
                statements
            );
        }
    }
}

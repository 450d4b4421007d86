#!/usr/bin/env bash
# Envoy's Rate Limit Quota Service (issue 35): simulated Envoys (tests/grpc/rlqs_envoys.py,
# each doing what Envoy's rate_limit_quota filter does with its assignments, reporting every
# 5 s as Envoy does) against two replicas of a release build, on one rule of RATE a second and
# a burst of BURST. Two runs:
#
# 1. Admissions: 3 Envoys (two on one replica, one on the other), one bucket each, each offered
#    LOAD requests a second (saturating): every window of their admissions against
#    burst + rate x window, and their admissions in the steady state (after three intervals)
#    against exact one-at-a-time decisions (one token bucket of RATE and BURST deciding the
#    same requests as they arrived).
# 2. Reports: 3 Envoys with BUCKETS buckets each under a light load: calls of
#    plexsphere.quota_assign (PostgreSQL's own count, track_functions) per bucket reported a
#    report interval, and the replicas' and PostgreSQL's CPU a report of a bucket, after the
#    first 20 s (each bucket's first reports: its holders arrive as newcomers the others are
#    told to shrink for, a few pushes each).
#
#   bash bench/rlqs.sh
#
# Knobs: DATABASE_ADMIN_URL (default the local cluster), SECONDS_PER_RUN (60), RATE (1000),
# BURST (100), LOAD (2000), BUCKETS (50).
set -euo pipefail
cd "$(dirname "$0")/.."

admin_url="${DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
database=plexsphere_rlqs_bench
url="${admin_url%/*}/$database"
seconds="${SECONDS_PER_RUN:-60}"
rate="${RATE:-1000}"
burst="${BURST:-100}"
load="${LOAD:-2000}"
buckets="${BUCKETS:-50}"
warm=20
operator=bench-operator-token-0123456789
token=bench-rlqs-token-0123456789
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

python=$(bash tests/grpc/setup.sh)
echo "building (release)..." >&2
cargo build -q --release -p app --bin plexsphere
binary=target/release/plexsphere

psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" -c "CREATE DATABASE $database" \
    -c "ALTER DATABASE $database SET track_functions = 'pl'"
DATABASE_URL="$url" "$binary" migrate >/dev/null

# Replica $1 on HTTP port $2 and gRPC port $3.
serve() {
    DATABASE_URL="$url" PLEXSPHERE_OPERATOR_TOKEN=$operator \
        PLEXSPHERE_SECRETS_KEY=ZGV2ZWxvcG1lbnQta2V5LW5ldmVyLXByb2R1Y3Rpb24= \
        PLEXSPHERE_DECIDE_TOKENS="bench:$token" PLEXSPHERE_LISTEN="127.0.0.1:$2" \
        PLEXSPHERE_GRPC_LISTEN="127.0.0.1:$3" RUST_LOG=warn \
        "$binary" serve > "$work/replica-$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do
        curl -fs "localhost:$2/readyz" >/dev/null && return
        sleep 0.1
    done
    cat "$work/replica-$1.log" >&2
    exit 1
}
serve a 18180 18181
serve b 18280 18281
replicas="${pids[*]}"

curl -fs -X PUT "localhost:18180/v1/rules/bench-checkout" -H "Authorization: Bearer $operator" \
    -d "{\"service\": \"bench\", \"api\": \"checkout\", \"selector\": {\"tenant\": \"*\"}, \"rate\": $rate, \"burst\": $burst}" >/dev/null
sleep 1  # the other replica hears of the rule (it polls and listens)

# CPU seconds (user + system) of the replicas and of PostgreSQL's processes, so far.
cpu() {
    local ticks
    ticks=$(getconf CLK_TCK)
    local postgres
    postgres=$(pgrep -d ' ' -x postgres || true)
    python3 - "$ticks" "$replicas" "$postgres" <<'PY'
import sys
ticks = int(sys.argv[1])
def seconds(pids):
    total = 0
    for pid in pids.split():
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / ticks
print(seconds(sys.argv[2]), seconds(sys.argv[3]))
PY
}

calls() {
    psql -qAt "$url" -c "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'quota_assign'"
}

# $1: buckets an Envoy; $2: requests a second a bucket; $3: the output.
envoys() {
    "$python" - "$1" "$2" "$seconds" "$token" <<'PY' > "$3.in"
import json, sys
buckets, load, seconds, token = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
targets = ["127.0.0.1:18181", "127.0.0.1:18181", "127.0.0.1:18281"]
print(json.dumps({"duration_s": seconds, "tick_ms": 10, "envoys": [
    {"name": f"e{i + 1}", "target": target, "token": token, "domain": "bench", "report_interval_s": 5,
     "no_assignment": "DENY_ALL",
     "buckets": [{"bucket_id": {"api": "checkout", "tenant": f"t{b}"}, "load_rps": load} for b in range(buckets)]}
    for i, target in enumerate(targets)]}))
PY
    "$python" tests/grpc/rlqs_envoys.py < "$3.in" > "$3"
}

echo "run 1: 3 Envoys, one bucket, $load requests a second each, ${seconds}s..." >&2
envoys 1 "$load" "$work/admissions.json"
echo "run 2: 3 Envoys, $buckets buckets each, ${seconds}s (counted after the first ${warm}s)..." >&2
envoys "$buckets" 2 "$work/reports.json" &
run=$!
# Counted in the steady state: every bucket's first reports (each holder a newcomer the others
# shrink for) are the warm-up.
sleep "$warm"
read -r replicas_before postgres_before < <(cpu)
calls_before=$(calls)
wait "$run"
read -r replicas_after postgres_after < <(cpu)
sleep 2  # each backend flushes its function counts to the shared statistics within a second
calls_after=$(calls)

"$python" - "$work/admissions.json" "$work/reports.json" "$rate" "$burst" "$((calls_after - calls_before))" \
    "$replicas_before" "$replicas_after" "$postgres_before" "$postgres_after" "$warm" <<'PY'
import json, sys
admissions, reports = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rate, burst, calls = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
replicas_cpu = float(sys.argv[7]) - float(sys.argv[6])
postgres_cpu = float(sys.argv[9]) - float(sys.argv[8])

# Run 1: every window of the Envoys' admissions against burst + rate x window.
allowed, offered = {}, {}
for envoy in admissions["envoys"]:
    for t, _, a, d in envoy["admitted"]:
        allowed[t] = allowed.get(t, 0) + a
        offered[t] = offered.get(t, 0) + a + d
ticks = sorted(offered)
worst = float("-inf")
prefix = [0]
for t in ticks:
    prefix.append(prefix[-1] + allowed.get(t, 0))
for i in range(len(ticks)):
    for j in range(i, len(ticks)):
        worst = max(worst, prefix[j + 1] - prefix[i] - (burst + rate * (ticks[j] - ticks[i]) / 1000))
# Exact one-at-a-time decisions of the same requests: one token bucket, full at the start.
tokens, last, exact = burst, None, {}
for t in ticks:
    if last is not None:
        tokens = min(burst, tokens + rate * (t - last) / 1000)
    last = t
    admit = min(offered[t], int(tokens))
    tokens -= admit
    exact[t] = admit
steady = 3 * 5000
span = (ticks[-1] - steady) / 1000
got = sum(n for t, n in allowed.items() if t >= steady)
ideal = sum(n for t, n in exact.items() if t >= steady)
print(f"run 1, {len(admissions['envoys'])} Envoys saturating one bucket of {rate:g}/s, burst {burst:g}:")
print(f"  worst window: {worst:+.0f} tokens against burst + rate x window (<= 0: never over)")
print(f"  steady state ({span:.0f} s after three intervals): admitted {got / span:.1f}/s, "
      f"exact one-at-a-time {ideal / span:.1f}/s, under-admission {100 * (1 - got / ideal):.2f}%")
for envoy in admissions["envoys"]:
    mine = sum(a for t, _, a, _ in envoy["admitted"] if t >= steady)
    print(f"    {envoy['name']}: {mine / span:.1f}/s")

# Run 2: statements and CPU a report of a bucket.
warm_ms = int(sys.argv[10]) * 1000
# A report in the run's last second may not be answered before its stream is closed.
last_ms = reports["duration_ms"] - 1000
bucket_reports = sum(
    1 for envoy in reports["envoys"] for report in envoy["reports"] if warm_ms <= report[0] < last_ms)
buckets = len(reports["envoys"][0]["reports"] and {r[1] for r in reports["envoys"][0]["reports"]})
print(f"run 2, {len(reports['envoys'])} Envoys of {buckets} buckets each: {bucket_reports} reports of a bucket after {warm_ms // 1000} s")
print(f"  quota_assign calls a report of a bucket (statements per Envoy per bucket per interval): {calls / bucket_reports:.3f}")
print(f"  replicas' CPU a report of a bucket: {1e6 * replicas_cpu / bucket_reports:.0f} us; "
      f"PostgreSQL's: {1e6 * postgres_cpu / bucket_reports:.0f} us")
PY

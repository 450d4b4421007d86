#!/usr/bin/env bash
# End to end: requests per second of GET /v1/secrets/{name} and POST /v1/ingest through a
# release build of plexsphere, at 64 concurrent connections, driven by wrk (a real HTTP
# client; installed from the distribution's packages when missing), with the database
# statements per request counted from pg_stat_database.
#
#   bash bench/e2e.sh            # about two minutes, plus a release build of the baseline
#
# The same run also builds and measures BASELINE (a commit, default 98bb712: main before
# coalesced takes and the secret cache) in a worktree of its own, so that the two figures
# come from the same machine in the same minutes; BASELINE= skips it.
#
# Knobs: DATABASE_ADMIN_URL, DURATION (10s), CONNECTIONS (64), NODES (64), DOMAINS (4),
# BASELINE (98bb712), BASELINE_TARGET_DIR (the baseline's cargo target directory; default a
# temporary one, so every run builds it afresh: name a lasting one to build it once).
set -euo pipefail
cd "$(dirname "$0")/.."

admin_url="${DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
database=plexsphere_e2e
url="${admin_url%/*}/$database"
duration="${DURATION:-10s}"
connections="${CONNECTIONS:-64}"
nodes="${NODES:-64}"
domains="${DOMAINS:-4}"
listen=127.0.0.1:18080
api="http://$listen"
operator_token=e2e-operator-token-0123456789
# A fixed, throwaway key: the values sealed with it live in a database this script drops.
secrets_key=$(printf 'e2e-secrets-key-0123456789abcdef' | base64)
baseline="${BASELINE-98bb712}"
work=$(mktemp -d)
server_pid=
baseline_tree=
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    [ -n "$baseline_tree" ] && git worktree remove --force "$baseline_tree" 2>/dev/null
    [ -n "${KEEP_WORK:-}" ] && echo "kept $work" >&2 && return
    rm -rf "$work"
}
trap cleanup EXIT

if ! command -v wrk >/dev/null; then
    echo "installing wrk..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi

cargo build -q --release -p app --bin plexsphere
if [ -n "$baseline" ]; then
    baseline_tree="$work/baseline"
    git worktree add -q --detach "$baseline_tree" "$baseline"
    # Its own target directory, so the two builds never share (or clobber) artefacts.
    baseline_target="${BASELINE_TARGET_DIR:-$work/baseline-target}"
    (cd "$baseline_tree" && CARGO_TARGET_DIR="$baseline_target" cargo build -q --release -p app --bin plexsphere)
fi

json_field() { sed 's/.*"'"$1"'":"\([^"]*\)".*/\1/'; }
op=(-H "Authorization: Bearer $operator_token")

# Starts `$1` on a fresh database with Domains, Nodes and a secret per Domain; fills tokens.
start_server() {
    local binary=$1
    psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" -c "CREATE DATABASE $database"

    # Budgets far above what the run can spend: this measures the cost of a decision, not refusals.
    DATABASE_URL="$url" PLEXSPHERE_SECRETS_KEY="$secrets_key" PLEXSPHERE_OPERATOR_TOKEN="$operator_token" PLEXSPHERE_LISTEN="$listen" \
        PLEXSPHERE_SECRET_READ_NODE_PER_SECOND=1000000 PLEXSPHERE_SECRET_READ_NODE_BURST=1000000000 \
        PLEXSPHERE_SECRET_READ_DOMAIN_PER_SECOND=1000000 PLEXSPHERE_SECRET_READ_DOMAIN_BURST=1000000000 \
        PLEXSPHERE_INGEST_NODE_BYTES_PER_SECOND=1000000000 PLEXSPHERE_INGEST_NODE_BYTES_BURST=100000000000 \
        PLEXSPHERE_INGEST_DOMAIN_BYTES_PER_SECOND=1000000000 PLEXSPHERE_INGEST_DOMAIN_BYTES_BURST=100000000000 \
        PLEXSPHERE_DATABASE_MAX_CONNECTIONS=16 RUST_LOG=warn \
        "$binary" serve > "$work/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 100); do curl -fs "$api/readyz" >/dev/null && break; sleep 0.1; done

    tokens=()
    for d in $(seq 1 "$domains"); do
        domain=$(curl -fs -X POST "$api/v1/domains" "${op[@]}" -d "{\"name\": \"domain-$d\", \"issuance_per_second\": 1000, \"issuance_burst\": 1000}" | json_field id)
        curl -fs -X PUT "$api/v1/domains/$domain/secrets/api-key" "${op[@]}" -d '{"value": "s3cr3t-value-of-a-typical-size-0123456789"}'
        for n in $(seq 1 $((nodes / domains))); do
            tokens+=("$(curl -fs -X POST "$api/v1/domains/$domain/nodes" "${op[@]}" -d "{\"name\": \"node-$n\"}" | json_field token)")
        done
    done
    write_scripts
}

stop_server() {
    kill "$server_pid" && wait "$server_pid" 2>/dev/null || true
    server_pid=
}

# Each wrk connection takes the next Node's token, so reads spread over every Node and Domain.
write_scripts() {
    {
        printf 'local tokens = {'
        printf '"%s",' "${tokens[@]}"
        printf '}\n'
        cat <<'LUA'
    local counter = 0
    function setup(thread)
        thread:set("offset", counter)
        counter = counter + 1
    end
    local i = 0
    request = function()
        i = i + 1
        local token = tokens[((i * 2 + offset) % #tokens) + 1]
        wrk.headers["Authorization"] = "Bearer " .. token
        return wrk.format(wrk.method, wrk.path, wrk.headers, wrk.body)
    end
LUA
    } > "$work/tokens.lua"
    cp "$work/tokens.lua" "$work/ingest.lua"
    printf 'wrk.method = "POST"\nwrk.body = string.rep("m", 512)\n' >> "$work/ingest.lua"
}

statements() {
    psql -Atq "$admin_url" -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$database'"
}

run() {
    local name=$1 path=$2 script=$3
    # Warm the credential cache and the connections, then measure.
    wrk -t2 -c"$connections" -d2s -s "$script" "$api$path" >/dev/null
    # Backends report their transaction counts when they go idle, within 10 s.
    sleep 11
    local before after out requests rps non2xx
    before=$(statements)
    out=$(wrk -t2 -c"$connections" -d"$duration" --latency -s "$script" "$api$path")
    sleep 11
    after=$(statements)
    requests=$(echo "$out" | sed -n 's/^ *\([0-9]*\) requests in.*/\1/p')
    rps=$(echo "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\)/\1/p')
    non2xx=$(echo "$out" | sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\)/\1/p')
    p50=$(echo "$out" | sed -n 's/^ *50% *\(.*\)/\1/p')
    p99=$(echo "$out" | sed -n 's/^ *99% *\(.*\)/\1/p')
    printf '%-40s %10.0f %10s %10s %12s %22.2f\n' "$name" "$rps" "$p50" "$p99" "${non2xx:-0}" \
        "$(echo "($after - $before) / $requests" | bc -l)"
}

measure() {
    local label=$1 binary=$2
    start_server "$binary"
    run "$label GET /v1/secrets/api-key" /v1/secrets/api-key "$work/tokens.lua"
    run "$label POST /v1/ingest (512 B)" /v1/ingest "$work/ingest.lua"
    stop_server
}

printf '%-40s %10s %10s %10s %12s %22s\n' request req/s p50 p99 non-2xx statements/request
measure "this tree" ./target/release/plexsphere
if [ -n "$baseline" ]; then
    measure "$baseline" "$baseline_target/release/plexsphere"
fi

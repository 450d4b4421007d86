#!/usr/bin/env bash
# Store::take against PostgreSQL's own ceiling: for every workload and client count, runs the
# Rust benchmark (crates/ratebudget/benches/take.rs) and then pgbench with the identical
# statement, the same client count and the same database, and prints ours / pgbench.
#
#   bash bench/compare.sh                 # the full table (about 3 minutes)
#   SECONDS_PER_RUN=3 CLIENTS="1 16" WORKLOADS="random" bash bench/compare.sh
#
# Knobs: DATABASE_ADMIN_URL (default the local cluster), SECONDS_PER_RUN (3), CLIENTS
# ("1 4 16 64"), WORKLOADS ("random hot refused pair"), COMMIT_MODES ("off": the limiter
# pool's mode; "off on" adds synchronous commits, doubling the time), COALESCED_CLIENTS
# ("16 64 256"; "" skips the second table), LEASED_SECONDS (10; "" skips the third table).
#
# The second table is coalescing (docs/adr/0006): for random keys and one hot key, with
# synchronous commit on, the store coalescing concurrent takes against the same store sending
# each take as its own statement (both over at most 64 connections), and pgbench's
# single-statement take at min(callers, 64) clients in the same run: ours/pg is how many times
# PostgreSQL's one-statement-per-decision ceiling the coalesced store reaches. bound/s is what
# no client-side coalescing of that many callers can beat, by Little's law: pgbench keeping
# the same number of takes in flight in the cheapest statements that take them together
# (random: 2 clients, each one plain unguarded upsert of callers/2 distinct buckets; hot: 1
# client, one UPDATE of the hot row by all the callers' takes), counted in takes.
set -euo pipefail
cd "$(dirname "$0")/.."

admin_url="${DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
database=plexsphere_bench
url="${admin_url%/*}/$database"
seconds="${SECONDS_PER_RUN:-3}"
clients_list="${CLIENTS:-1 4 16 64}"
workloads="${WORKLOADS:-random hot refused pair}"
commit_modes="${COMMIT_MODES:-off}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "building (release)..." >&2
bench_binary=$(cargo bench -q -p ratebudget --bench take --no-run --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
# Recreates the database, migrated, with bench/seed.sql's rows.
"$bench_binary" --setup --database-url "$url"

# The pgbench scripts: the statement files themselves, comments dropped, parameters named.
# Keys are md5(i)::uuid (bench/seed.sql), the one expression pgbench can turn an integer into.
statement() {
    grep -v '^[[:space:]]*--' "crates/ratebudget/queries/$1.sql" | sed -e '$s/$/;/'
}
{
    echo '\set k random(1, 100000)'
    statement take | sed -e 's/\$1::text/:scope::text/g' -e 's/\$2::uuid/md5(:k::text)::uuid/g' \
        -e 's/\$3::/:cost::/g' -e 's/\$4::/:rate::/g' -e 's/\$5::/:burst::/g' -e 's/\$6::/:now::/g'
} > "$work/random.sql"
{
    statement take | sed -e 's/\$1::text/:scope::text/g' -e 's/\$2::uuid/:key::uuid/g' \
        -e 's/\$3::/:cost::/g' -e 's/\$4::/:rate::/g' -e 's/\$5::/:burst::/g' -e 's/\$6::/:now::/g'
} > "$work/fixed.sql"
{
    echo '\set n random(1, 100000)'
    echo '\set d random(1, 1000)'
    statement decide_pair | sed -e 's/\$10::/:burst::/g' -e 's/\$11::/:now::/g' \
        -e 's/\$1::text/:node_scope::text/g' -e 's/\$2::uuid/md5(:n::text)::uuid/g' -e 's/\$3::/:cost::/g' \
        -e 's/\$4::/:rate::/g' -e 's/\$5::/:burst::/g' -e 's/\$6::text/:domain_scope::text/g' \
        -e 's/\$7::uuid/md5(:d::text)::uuid/g' -e 's/\$8::/:cost::/g' -e 's/\$9::/:rate::/g'
} > "$work/pair.sql"

common=(-D cost=1 -D now=2026-01-01T00:00:00Z -D burst=1e12)
pgbench_args() {
    case "$1" in
        random) echo "-f $work/random.sql -D scope=ingest_node -D rate=1e9 ${common[*]}" ;;
        hot) echo "-f $work/fixed.sql -D scope=secret_read_node -D key=00000000-0000-4000-8000-000000000001 -D rate=1e9 ${common[*]}" ;;
        refused) echo "-f $work/fixed.sql -D scope=secret_read_node -D key=00000000-0000-4000-8000-000000000002 -D rate=1e9 ${common[*]}" ;;
        pair) echo "-f $work/pair.sql -D node_scope=ingest_node -D domain_scope=ingest_domain -D rate=1e9 ${common[*]}" ;;
    esac
}

printf '%-8s %-7s %-6s %12s %9s %9s %12s %12s %7s\n' workload clients sync ours/s p50_us p99_us pgbench/s pg_avg_us ratio
for sync in $commit_modes; do
    for workload in $workloads; do
        for clients in $clients_list; do
            read -r _ _ _ ours p50 p99 < <("$bench_binary" --database-url "$url" --workload "$workload" \
                --clients "$clients" --seconds "$seconds" --synchronous-commit "$sync")
            threads=$(( clients < 2 ? 1 : 2 ))
            # shellcheck disable=SC2046
            pg_out=$(PGOPTIONS="-c synchronous_commit=$sync" pgbench -n -M prepared -c "$clients" -j "$threads" \
                -T $((seconds + 1)) $(pgbench_args "$workload") "$url" 2>&1)
            theirs=$(echo "$pg_out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
            pg_latency_ms=$(echo "$pg_out" | sed -n 's/^latency average = \([0-9.]*\) ms/\1/p')
            if [ -z "$theirs" ]; then
                echo "$pg_out" >&2
                exit 1
            fi
            printf '%-8s %-7s %-6s %12.0f %9s %9s %12.0f %12.0f %7.2f\n' "$workload" "$clients" "$sync" "$ours" \
                "$p50" "$p99" "$theirs" "$(echo "$pg_latency_ms * 1000" | bc -l)" "$(echo "$ours / $theirs" | bc -l)"
        done
    done
done

# Takes a second of pgbench keeping `callers` takes in flight in the cheapest statements
# that take them together (see the header); the statements skip take.sql's snapshot guard and
# its answers, so this is a ceiling, not a twin.
in_flight_bound() {
    local workload=$1 callers=$2 clients per_statement out tps
    if [ "$workload" = hot ]; then
        clients=1
        per_statement=$callers
        cat > "$work/bound.sql" <<SQL
UPDATE plexsphere.rate_budgets SET tokens = tokens - $per_statement, refilled_at = GREATEST(refilled_at, '2026-01-01T00:00:00Z')
WHERE scope = 'secret_read_node' AND bucket_key = '00000000-0000-4000-8000-000000000001';
SQL
    else
        clients=2
        per_statement=$(( (callers + 1) / 2 ))
        cat > "$work/bound.sql" <<SQL
INSERT INTO plexsphere.rate_budgets AS b (scope, bucket_key, tokens, refilled_at)
SELECT 'ingest_node', k, 1e12, '2026-01-01T00:00:00Z'
FROM (SELECT DISTINCT md5((floor(random() * 100000) + 1)::int::text)::uuid AS k FROM generate_series(1, $per_statement)) AS s
ORDER BY 1, 2
ON CONFLICT (scope, bucket_key) DO UPDATE
SET tokens = LEAST(1e12, b.tokens + GREATEST(0::float8, date_part('epoch', EXCLUDED.refilled_at - b.refilled_at)) * 1e9) - 1,
    refilled_at = GREATEST(b.refilled_at, EXCLUDED.refilled_at);
SQL
    fi
    out=$(PGOPTIONS="-c synchronous_commit=on" pgbench -n -M prepared -c "$clients" -j "$clients" \
        -T $((seconds + 1)) -f "$work/bound.sql" "$url" 2>&1)
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
    if [ -z "$tps" ]; then
        echo "$out" >&2
        exit 1
    fi
    echo "$tps * $per_statement" | bc -l
}

coalesced_clients="${COALESCED_CLIENTS-16 64 256}"
if [ -n "$coalesced_clients" ]; then
    echo
    printf '%-8s %-7s %12s %9s %12s %9s %12s %9s %12s %9s\n' workload callers coalesced/s p99_us single/s p99_us \
        pgbench/s ours/pg bound/s bound/pg
    for workload in random hot; do
        for clients in $coalesced_clients; do
            run() {
                "$bench_binary" --database-url "$url" --workload "$workload" --clients "$clients" \
                    --seconds "$seconds" --synchronous-commit on "$@"
            }
            read -r _ _ _ coalesced _ coalesced_p99 < <(run --coalesce)
            read -r _ _ _ single _ single_p99 < <(run)
            pg_clients=$(( clients < 64 ? clients : 64 ))
            # shellcheck disable=SC2046
            pg_out=$(PGOPTIONS="-c synchronous_commit=on" pgbench -n -M prepared -c "$pg_clients" -j 2 \
                -T $((seconds + 1)) $(pgbench_args "$workload") "$url" 2>&1)
            theirs=$(echo "$pg_out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
            if [ -z "$theirs" ]; then
                echo "$pg_out" >&2
                exit 1
            fi
            bound=$(in_flight_bound "$workload" "$clients")
            printf '%-8s %-7s %12.0f %9s %12.0f %9s %12.0f %9.2f %12.0f %9.2f\n' "$workload" "$clients" "$coalesced" \
                "$coalesced_p99" "$single" "$single_p99" "$theirs" "$(echo "$coalesced / $theirs" | bc -l)" \
                "$bound" "$(echo "$bound / $theirs" | bc -l)"
        done
    done
fi

# The third table is leases (issue 25, docs/adr/0034): one hot bucket, 64 callers, in-process
# through the library, with leases on and off (crates/ratebudget/benches/lease.rs).
# LEASED_SECONDS (10); "" skips it.
if [ -n "${LEASED_SECONDS-10}" ]; then
    echo
    cargo bench -q -p ratebudget --bench lease -- --seconds "${LEASED_SECONDS:-10}" \
        --database-url "${admin_url%/*}/plexsphere_bench_lease"
fi

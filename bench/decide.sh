#!/usr/bin/env bash
# plexsphere as a rate-limit service under load (issue 23): decisions a second through Envoy's
# gRPC protocol (ShouldRateLimit) and through POST /v1/decide, 64 requests in flight, for one
# hot tenant and for 100,000 random tenants, against pgbench's single-statement take at 64
# clients on the same database in the same run (PostgreSQL's one-statement-per-decision
# ceiling). A release build of the binary serves; the rule admits everything, so what is
# measured is deciding, not refusing. Then (issue 34, item 3) requests of 8 descriptors, each
# a random tenant, over HTTP: every descriptor of a request is one take of 8 buckets, all or
# nothing, and the row counts descriptors decided a second against the single-descriptor
# random HTTP row's. Last, the floor: the same gRPC stack deciding nothing.
#
#   bash bench/decide.sh
#
# Knobs: DATABASE_ADMIN_URL (default the local cluster), SECONDS_PER_RUN (10), IN_FLIGHT (64),
# TENANTS (100000), DESCRIPTORS (8: the descriptors of a request of the many-descriptor row),
# ROUNDS (3: interleaved rounds of each workload, compared by their medians),
# LEASE_MS (100: the leased rows' PLEXSPHERE_LEASE_MS). Needs wrk (Debian's package) for the
# HTTP runs; installs it when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

admin_url="${DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
database=plexsphere_decide_bench
url="${admin_url%/*}/$database"
seconds="${SECONDS_PER_RUN:-10}"
in_flight="${IN_FLIGHT:-64}"
tenants="${TENANTS:-100000}"
http_port=18080
grpc_port=18081
operator=bench-operator-token-0123456789
token=bench-decide-token-0123456789
work=$(mktemp -d)
server_pid=
floor_pid=
cleanup() {
    if [ -n "$floor_pid" ]; then
        kill "$floor_pid" 2>/dev/null || true
        wait "$floor_pid" 2>/dev/null || true
    fi
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2; }

echo "building (release)..." >&2
cargo build -q --release -p app --bin plexsphere --example decide_load --example grpc_floor
binary=target/release/plexsphere
load=target/release/examples/decide_load

psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" -c "CREATE DATABASE $database"
DATABASE_URL="$url" "$binary" migrate >/dev/null

# Serves with leases of $1 ms (0: none), replacing a server already running.
serve() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid"
        wait "$server_pid" 2>/dev/null || true
    fi
    DATABASE_URL="$url" PLEXSPHERE_OPERATOR_TOKEN=$operator \
        PLEXSPHERE_SECRETS_KEY=ZGV2ZWxvcG1lbnQta2V5LW5ldmVyLXByb2R1Y3Rpb24= \
        PLEXSPHERE_DECIDE_TOKENS="bench:$token" PLEXSPHERE_LISTEN=127.0.0.1:$http_port \
        PLEXSPHERE_GRPC_LISTEN=127.0.0.1:$grpc_port PLEXSPHERE_LEASE_MS="$1" RUST_LOG=warn \
        "$binary" serve > "$work/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 100); do
        curl -fs "localhost:$http_port/readyz" >/dev/null && break
        sleep 0.1
    done
    curl -fs "localhost:$http_port/readyz" >/dev/null || { cat "$work/server.log" >&2; exit 1; }
}
serve 0

# Every tenant of the API has its own bucket, large enough never to refuse.
curl -fs -X PUT "localhost:$http_port/v1/rules/bench-per-tenant" -H "Authorization: Bearer $operator" \
    -d '{"service": "bench", "api": "GET /v1/users", "selector": {"tenant": "*"}, "rate": 1e9, "burst": 1e9}' >/dev/null

grpc_run() {
    "$load" "127.0.0.1:${2:-$grpc_port}" "$token" "$in_flight" "$seconds" "$1" 2>&1
}

# Prints a row of figures: the workload, how it was sent, and what the command after them
# printed. A run whose calls failed stops the benchmark: its figures would leave them out.
row() {
    local workload=$1 via=$2 out
    shift 2
    out=$("$@") || { echo "$workload $via: $out" >&2; exit 1; }
    printf '%-7s %-8s %s\n' "$workload" "$via" "$out"
}

# wrk posts the same request as JSON, a tenant per request. Each thread builds every request
# once, before the run, rather than a string per request as it is sent: wrk shares the cores
# with the service it measures (BENCHMARKS.md section 8 has the figures of both).
cat > "$work/decide.lua" <<LUA
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer $token"
wrk.headers["Content-Type"] = "application/json"
local tenants = tonumber(os.getenv("TENANTS_FOR_WRK"))
local descriptors = tonumber(os.getenv("DESCRIPTORS_FOR_WRK") or "1")
local requests = {}
local function descriptor(tenant)
    return '{"entries":[{"key":"api","value":"GET /v1/users"},{"key":"tenant","value":"' .. tenant .. '"}]}'
end
local function decide(tenants)
    local each = {}
    for i, tenant in ipairs(tenants) do each[i] = descriptor(tenant) end
    return wrk.format(nil, "/v1/decide", nil, '{"domain":"bench","descriptors":[' .. table.concat(each, ",") .. ']}')
end
init = function(args)
    if tenants and descriptors > 1 then
        -- Requests of random tenants each (distinct within a request), built before the run:
        -- a fifth as many requests as tenants covers every tenant about once per descriptor.
        math.randomseed(os.time() + tonumber(tostring(args):match("0x(%x+)") or "0", 16))
        for r = 1, math.max(1, math.floor(tenants / 5)) do
            local chosen, seen = {}, {}
            while #chosen < descriptors do
                local tenant = math.random(0, tenants - 1)
                if not seen[tenant] then
                    seen[tenant] = true
                    chosen[#chosen + 1] = "t" .. tenant
                end
            end
            requests[r] = decide(chosen)
        end
    elseif tenants then
        for i = 0, tenants - 1 do requests[i + 1] = decide({"t" .. i}) end
    else
        requests[1] = decide({"hot"})
    end
end
request = function()
    return requests[math.random(#requests)]
end
LUA
http_run() {
    local out
    out=$(TENANTS_FOR_WRK="$1" DESCRIPTORS_FOR_WRK="${2:-1}" wrk -t2 -c"$in_flight" -d"${seconds}s" --latency -s "$work/decide.lua" "http://127.0.0.1:$http_port" 2>&1)
    local rps p50 p99 non2xx errors
    rps=$(echo "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p')
    p50=$(echo "$out" | sed -n 's/^ *50% *\(.*\)$/\1/p')
    p99=$(echo "$out" | sed -n 's/^ *99% *\(.*\)$/\1/p')
    non2xx=$(echo "$out" | sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p')
    errors=$(echo "$out" | sed -n 's/^ *Socket errors: *\(.*\)$/\1/p')
    echo "decisions/s ${rps:-0} p50 ${p50:-?} p99 ${p99:-?} non_2xx ${non2xx:-0}${errors:+ socket_errors $errors}"
    # A decision answers 200 admitted or not: anything else, or a broken connection, is a
    # failed call, and the figures would leave it out.
    [ "${non2xx:-0}" = 0 ] && [ -z "$errors" ] && [ -n "$rps" ]
}

# pgbench: take.sql itself, on the bucket name the service uses, a key per tenant.
statement() {
    grep -v '^[[:space:]]*--' "crates/ratebudget/queries/$1.sql" | sed -e '$s/$/;/'
}
{
    echo "\\set k random(1, $tenants)"
    statement take | sed -e 's/\$1::text/:scope::text/g' -e 's/\$2::uuid/md5(:k::text)::uuid/g' \
        -e 's/\$3::/:cost::/g' -e 's/\$4::/:rate::/g' -e 's/\$5::/:burst::/g' -e 's/\$6::/now()::/g'
} > "$work/random.sql"
{
    statement take | sed -e 's/\$1::text/:scope::text/g' -e 's/\$2::uuid/md5(0::text)::uuid/g' \
        -e 's/\$3::/:cost::/g' -e 's/\$4::/:rate::/g' -e 's/\$5::/:burst::/g' -e 's/\$6::/now()::/g'
} > "$work/hot.sql"
pgbench_run() {
    local out
    out=$(PGOPTIONS="-c synchronous_commit=off" pgbench -n -M prepared -c "$in_flight" -j 2 -T "$seconds" \
        -f "$work/$1.sql" -D scope=service_requests -D cost=1 -D rate=1e9 -D burst=1e9 "$url" 2>&1)
    echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1
}

# Each round runs gRPC, HTTP and pgbench one after another; the summary compares medians over
# the rounds. This machine's speed drifts by a fifth within minutes (BENCHMARKS.md section 8),
# so one run of each, 20 s apart, compared the drift as much as the paths.
rounds="${ROUNDS:-3}"
printf '%-7s %-8s %s\n' workload via figures
descriptors="${DESCRIPTORS:-8}"
for workload in hot random; do
    arg=$([ "$workload" = hot ] && echo hot || echo "$tenants")
    wrk_tenants=$([ "$workload" = hot ] && echo "" || echo "$tenants")
    for _ in $(seq 1 "$rounds"); do
        row "$workload" grpc grpc_run "$arg" | tee -a "$work/$workload.grpc"
        row "$workload" http http_run "$wrk_tenants" | tee -a "$work/$workload.http"
        if [ "$workload" = random ]; then
            # Requests of $descriptors descriptors, each a random tenant: one take of that many
            # buckets a request.
            row "random$descriptors" http http_run "$tenants" "$descriptors" | tee -a "$work/random-many.http"
        fi
        printf '%-7s %-8s tps %s\n' "$workload" pgbench "$(pgbench_run "$workload")" | tee -a "$work/$workload.pgbench"
    done
done

# Leased rows (issue 25): the same hot tenant with PLEXSPHERE_LEASE_MS=$LEASE_MS, against the
# coalesced rows above.
serve "${LEASE_MS:-100}"
row hot grpc-leased grpc_run hot
row hot http-leased http_run ""

# The floor (crates/app/examples/grpc_floor.rs): the same gRPC stack answering a fixed response
# and deciding nothing, through the same load generator: the most any decision path reaches
# here.
floor_port=18082
kill "$server_pid"
wait "$server_pid" 2>/dev/null || true
server_pid=
target/release/examples/grpc_floor "127.0.0.1:$floor_port" > "$work/floor.log" 2>&1 &
floor_pid=$!
for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$floor_port") 2>/dev/null && break
    sleep 0.1
done
row hot grpc-floor grpc_run hot "$floor_port"

# The median of one figure ($2: the word before it) over a workload's rows in file $1, with
# latencies in milliseconds whatever unit wrk printed.
median() {
    awk -v field="$2" '{
        for (i = 1; i < NF; i++) if ($i == field) {
            v = $(i + 1)
            if (field ~ /_us$/) v = v / 1000
            else if (v ~ /us$/) v = v / 1000
            else if (v ~ /ms$/) v = v + 0
            else if (v ~ /s$/) v = v * 1000
            print v + 0
        }
    }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo
echo "medians over $rounds rounds (issue 23: hot at least 10x pgbench, random at least 2x, p99 under 10 ms)"
for workload in hot random; do
    need=$([ "$workload" = hot ] && echo 10 || echo 2)
    tps=$(median "$work/$workload.pgbench" tps)
    for via in grpc http; do
        p99_field=$([ "$via" = grpc ] && echo p99_us || echo p99)
        rate=$(median "$work/$workload.$via" decisions/s)
        p99=$(median "$work/$workload.$via" "$p99_field")
        awk -v w="$workload" -v via="$via" -v rate="$rate" -v tps="$tps" -v p99="$p99" -v need="$need" 'BEGIN {
            ratio = rate / tps
            printf "%-7s %-8s decisions/s %.0f = %.2fx pgbench %.0f, p99 %.2f ms: %s\n", w, via, rate, ratio, tps, p99,
                (ratio >= need && p99 < 10) ? "meets" : "short"
        }'
    done
done
# Issue 34, item 3: descriptors decided a second in requests of $descriptors, against the
# single-descriptor random HTTP row.
one=$(median "$work/random.http" decisions/s)
many=$(median "$work/random-many.http" decisions/s)
many_p99=$(median "$work/random-many.http" p99)
awk -v d="$descriptors" -v one="$one" -v many="$many" -v p99="$many_p99" 'BEGIN {
    printf "random%s http     requests/s %.0f = descriptors/s %.0f, %.2fx the single-descriptor row'"'"'s %.0f, p99 %.2f ms: %s\n",
        d, many, many * d, many * d / one, one, p99, (many * d >= one) ? "meets" : "short"
}'

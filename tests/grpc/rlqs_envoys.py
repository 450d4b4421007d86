"""Simulated Envoys speaking the Rate Limit Quota Service protocol, for the tests.

Each simulated Envoy does what Envoy's `rate_limit_quota` HTTP filter does with an RLQS server,
as Envoy's source has it (source/extensions/filters/http/rate_limit_quota/ at upstream commit
cb2a49b09e; where Envoy's code and the protos' comments disagree, this does what the code does;
docs/adr/0041 lists the details that decide exactness). Built on grpcio and Envoy's protos compiled by
tests/grpc/setup.sh, independently of the server's generated code. Run it on the python that
setup.sh prints. Reads one JSON object from standard input:

    {"duration_s": 30, "tick_ms": 10,
     "envoys": [{"name": "e1", "target": "127.0.0.1:8081", "token": "secret", "domain": "svc",
                 "report_interval_s": 5,
                 "no_assignment": "DENY_ALL",
                 "expired_fallback": {"blanket": "ALLOW_ALL", "timeout_s": 10},
                 "start_s": 0, "stop_s": null, "kill_at_s": null,
                 "buckets": [{"bucket_id": {"name": "checkout", "tenant": "acme"},
                              "load_rps": 500, "load": [[0, 500], [20, 0]]}]}],
     "http": [{"at_s": 20, "method": "PUT", "url": "http://127.0.0.1:8080/v1/...",
               "headers": {"authorization": "Bearer x"}, "body": {"any": "JSON"}}]}

Per Envoy (defaults in brackets): "target" and "domain" are required; "token" [none] is sent as
`authorization: Bearer <token>` on each stream; "report_interval_s" [5, Envoy's hard-coded
value] may be fractional; "no_assignment" [ALLOW_ALL] is the blanket rule of
no_assignment_behavior; "expired_fallback" [null] is expired_assignment_behavior's blanket
fallback_rate_limit and its timeout (whole seconds are read, as Envoy reads them); the load runs
in [start_s, stop_s) [0, forever] and ends at kill_at_s, when the Envoy dies (its stream is
cancelled, and it admits, reports and reconnects no more). A bucket's load is "load", a
piecewise-constant schedule of [from_s, rps] (times from the simulation's start, 0 rps before
the first), or else a constant "load_rps" [0]. Requests arrive evenly spaced, the first at the
start of each piece, and are decided at the first tick at or after their arrival. "name"
defaults to e<index>. Each "http" action is made (urllib, on a thread of its own) at its "at_s"
on the simulation's clock; "body" is sent as JSON unless it is a string; "headers" and "method"
[GET, or POST with a body] are optional. Unknown keys are an error (exit 2), to catch typos.

Prints one JSON object, all times in milliseconds from the start (ticks are multiples of
tick_ms; received messages take the time they arrived):

    {"started_unix": 1767000000.0, "duration_ms": 30000, "tick_ms": 10,
     "envoys": [{"name": "e1",
        "admitted": [[t_ms, bucket_index, allowed, denied], ...],      per tick with any request
        "reports": [[t_ms, bucket_index, allowed, denied, elapsed_s], ...],  written to a stream
        "dropped_reports": [[t_ms, bucket_index, allowed, denied, elapsed_s], ...],  no stream
        "messages": [[t_ms, stream_index, usages], ...],  every report message written
        "assignments": [{"t_ms", "bucket_index", "kind", ...}, ...],
        "expiries": [[t_ms, bucket_index], ...],       an assignment's TTL ran out
        "fallback_ends": [[t_ms, bucket_index], ...],  expired_fallback's timeout ran out
        "streams": [{"opened_ms", "closed_ms", "status", "details", "responses"}, ...],
        "killed_ms": null}],
     "http": [{"at_s", "sent_ms", "done_ms", "status", "body", "error"}, ...]}

Reports: a usage report's counts are reset when it is built, so "dropped_reports" are counts
the server never gets (the stream was down: Envoy only reopens at a report tick, and a new
bucket's immediate report is dropped when there is no stream). "messages" also shows report
messages with no usage (a tick with no bucket cached, which Envoy still sends). An assignment's
"kind" is token_bucket, blanket, unset (a BucketAction with neither oneof: cached, fails open,
expires at once), abandon, ignored (requests_per_time_unit or no strategy: Envoy keeps the old
assignment) or skipped (no bucket_id, or a bucket not cached: "reason", and "bucket_index"
when the id is one of this Envoy's buckets); it carries what the server sent ("blanket";
"max_tokens", "tokens_per_fill" (null when unset), "fill_interval_s", "fill_interval_nanos";
"ttl_s", "ttl_nanos" (null when unset)) and, for a token bucket, whether the old one was
"kept" and the new one's "initial_tokens". A stream's "status" is the gRPC code's name it ended
with (CANCELLED with details "killed" for kill_at_s), null if still open when the run ended;
"responses" counts the messages it brought. "http" entries follow the input's order; "status" is
null and "error" says why when no HTTP answer came; "body" is JSON when it parses, else text.

The run ends at duration_s; whatever happens (a server that never answers, a hung HTTP call),
the script prints and exits by duration_s + 10 s. The Envoy model (EnvoyModel, TokenBucket)
is pure, fed a clock value, and testable without a network: tests/grpc/rlqs_envoys_selftest.py.
"""

import json
import math
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from fractions import Fraction

sys.path.insert(0, os.path.join(os.path.dirname(sys.executable), "..", "rls"))

ALLOW_ALL = "ALLOW_ALL"
DENY_ALL = "DENY_ALL"
BLANKETS = (ALLOW_ALL, DENY_ALL)
# Seconds the script may take past duration_s to close its streams and print before it stops
# itself regardless.
GRACE_S = 10
# AtomicTokenBucketImpl's minimal fill rate: one token a year.
MIN_FILL_RATE = Fraction(1, 365 * 24 * 60 * 60)


# ---------------------------------------------------------------------------------------------
# The model: one Envoy's rate_limit_quota filter and its global RLQS client, pure, given the
# time (integer milliseconds from the start) at each call.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenBucketRule:
    """A TokenBucket as the server sent it (envoy.type.v3.TokenBucket)."""

    max_tokens: int
    tokens_per_fill: int | None  # None: the UInt32Value wrapper is unset (Envoy reads 0)
    fill_seconds: int
    fill_nanos: int


@dataclass(frozen=True)
class Strategy:
    """A RateLimitStrategy: kind is blanket, token_bucket, requests_per_time_unit or none."""

    kind: str
    blanket: str | None = None
    token_bucket: TokenBucketRule | None = None


@dataclass(frozen=True)
class Action:
    """One BucketAction of a response: kind is assignment, abandon or unset (neither oneof)."""

    bucket_id: dict | None
    kind: str
    strategy: Strategy | None = None
    ttl_seconds: int | None = None  # None: assignment_time_to_live unset
    ttl_nanos: int | None = None


@dataclass
class Report:
    """A RateLimitQuotaUsageReports: usages are (bucket_index, bucket_id, allowed, denied,
    elapsed_s)."""

    domain: str
    usages: list


def truncated_seconds(seconds, nanos):
    """absl::ToInt64Seconds of a Duration: whole seconds, truncated toward zero."""
    total = seconds * 1_000_000_000 + nanos
    return (abs(total) // 1_000_000_000) * (1 if total >= 0 else -1)


class TokenBucket:
    """Envoy's AtomicTokenBucketImpl as the RLQS client builds it.

    The state is the time t0 from which the bucket has been filling: tokens(now) =
    min(max_tokens, (now - t0) * fill_rate), and a consume of one token moves t0 so that one
    token fewer remains. Exact arithmetic (Fractions) where Envoy uses doubles, so that a
    token due exactly at a tick is there; Envoy's rounding can differ by one token at such an
    instant. A fill interval under one second makes the rate +inf (NaN when tokens_per_fill is
    0 too); Envoy's double arithmetic then always finds min(max_tokens, inf or NaN) =
    max_tokens, which is what `infinite` stands for.
    """

    def __init__(self, rule, now_ms, existing=None):
        self.rule = rule
        self.max_tokens = rule.max_tokens
        per_fill = rule.tokens_per_fill or 0
        interval = truncated_seconds(rule.fill_seconds, rule.fill_nanos)
        self.infinite = interval == 0
        if not self.infinite:
            # fill_rate_ = max(|rate|, 1/year); a negative interval makes a negative rate.
            self.fill_rate = max(abs(Fraction(per_fill, interval)), MIN_FILL_RATE)
        now = Fraction(now_ms, 1000)
        if existing is None:
            initial = self.max_tokens
        elif existing.max_tokens == 0:
            # remaining / max is 0/0, NaN, and its cast to uint64_t undefined behaviour; x86-64
            # code gives 2^63, which fills the bucket.
            initial = self.max_tokens
        else:
            # max_tokens * (remainingTokens() / maxTokens()), cast to uint64_t: truncated.
            initial = math.floor(self.max_tokens * (existing.remaining(now_ms) / existing.max_tokens))
        self.initial_tokens = initial
        self.t0 = now
        if initial and not self.infinite:
            self.t0 = now - initial / self.fill_rate

    def remaining(self, now_ms):
        if self.infinite:
            return Fraction(self.max_tokens)
        return min(Fraction(self.max_tokens), (Fraction(now_ms, 1000) - self.t0) * self.fill_rate)

    def consume(self, now_ms):
        """consume(1, false): takes one token when at least one is there."""
        tokens = self.remaining(now_ms)
        if tokens < 1:
            return False
        if not self.infinite:
            self.t0 = Fraction(now_ms, 1000) - (tokens - 1) / self.fill_rate
        return True


def same_token_bucket(new, old):
    """protoTokenBucketsEq: max_tokens, tokens_per_fill's value and fill_interval's nanos only."""
    return (
        new.max_tokens == old.max_tokens
        and (new.tokens_per_fill or 0) == (old.tokens_per_fill or 0)
        and new.fill_nanos == old.fill_nanos
    )


@dataclass
class CachedBucket:
    index: int
    bucket_id: dict
    allowed: int
    denied: int
    last_report_ms: int
    # The cached action's strategy (an assignment's, the fallback's, or Strategy("none") for an
    # action with neither oneof); None: the no-assignment default applies.
    action: Strategy | None = None
    token_bucket: TokenBucket | None = None
    # (due_ms, "assignment" | "fallback"): the expiry timer of the cached action, if any.
    timer: tuple | None = None


def bucket_key(bucket_id):
    return frozenset(bucket_id.items())


@dataclass
class EnvoyConfig:
    name: str
    domain: str
    bucket_ids: list
    report_interval_ms: int = 5000
    no_assignment: str = ALLOW_ALL
    fallback: str | None = None  # expired_fallback's blanket rule
    fallback_timeout_s: int = 0


class NullTransport:
    """A transport whose streams open and swallow what is sent (for a model on its own)."""

    def __init__(self):
        self.opened = 0
        self.sent = []

    def start(self, now_ms):
        self.opened += 1
        return self.opened

    def send(self, stream, now_ms, report):
        self.sent.append((now_ms, stream, report))


@dataclass
class EnvoyModel:
    """One Envoy's RLQS client and filter, for one (target, domain).

    Calls come in time order: on_response and on_stream_closed when a message or the end of
    the stream arrives; tick at each simulation tick with the requests that arrived since the
    last one. `transport` opens streams (start(now_ms) -> stream id, or None when it cannot)
    and sends report messages (send(stream, now_ms, report)).
    """

    config: EnvoyConfig
    transport: object = field(default_factory=NullTransport)
    buckets: dict = field(default_factory=dict)  # bucket_key -> CachedBucket, creation order
    stream: object = None
    stream_tried: bool = False
    next_report_ms: int | None = None
    killed_ms: int | None = None
    admitted: list = field(default_factory=list)
    reports: list = field(default_factory=list)
    dropped_reports: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    assignments: list = field(default_factory=list)
    expiries: list = field(default_factory=list)
    fallback_ends: list = field(default_factory=list)

    def __post_init__(self):
        self.index_of = {bucket_key(b): i for i, b in enumerate(self.config.bucket_ids)}
        if len(self.index_of) != len(self.config.bucket_ids):
            raise ValueError(f"{self.config.name}: two buckets have the same bucket_id")

    # -- requests ------------------------------------------------------------------------------

    def default_strategy(self):
        return Strategy("blanket", blanket=self.config.no_assignment)

    def request(self, now_ms, index):
        """One request of bucket `index`: whether it is allowed."""
        key = bucket_key(self.config.bucket_ids[index])
        bucket = self.buckets.get(key)
        if bucket is None:
            # Only a blanket DENY_ALL default denies the first request.
            allowed = self.config.no_assignment != DENY_ALL
            self._create_bucket(now_ms, index, allowed)
            return allowed
        strategy = bucket.action or self.default_strategy()
        if strategy.kind == "blanket":
            allowed = strategy.blanket != DENY_ALL
        elif strategy.kind == "token_bucket":
            allowed = bucket.token_bucket.consume(now_ms)
        else:
            # requests_per_time_unit, or no strategy: Envoy fails open.
            allowed = True
        if allowed:
            bucket.allowed += 1
        else:
            bucket.denied += 1
        return allowed

    def _create_bucket(self, now_ms, index, allowed):
        if not self.stream_tried:
            # The first bucket ever starts the report timer and the stream.
            self.stream_tried = True
            self.next_report_ms = now_ms + self.config.report_interval_ms
            self.stream = self.transport.start(now_ms)
        bucket_id = self.config.bucket_ids[index]
        bucket = CachedBucket(index, bucket_id, int(allowed), int(not allowed), now_ms)
        self.buckets[bucket_key(bucket_id)] = bucket
        # The new bucket's own report, at once; dropped (its counts lost) without a stream.
        self._send(now_ms, [self._usage(now_ms, bucket)])

    # -- reports -------------------------------------------------------------------------------

    def _usage(self, now_ms, bucket):
        """A bucket's usage since its last report, and the counts reset (getUsageFromBucket)."""
        usage = (
            bucket.index,
            bucket.bucket_id,
            bucket.allowed,
            bucket.denied,
            (now_ms - bucket.last_report_ms) // 1000,  # whole seconds, truncated
        )
        bucket.allowed = bucket.denied = 0
        bucket.last_report_ms = now_ms
        return usage

    def _send(self, now_ms, usages):
        rows = [[now_ms, i, a, d, e] for i, _, a, d, e in usages]
        if self.stream is None:
            self.dropped_reports.extend(rows)
            return
        self.reports.extend(rows)
        self.messages.append([now_ms, self.stream, len(usages)])
        self.transport.send(self.stream, now_ms, Report(self.config.domain, usages))

    def _report_tick(self, now_ms):
        # Every bucket, counts reset before the stream is looked at (onSendReportsTimer).
        usages = [self._usage(now_ms, bucket) for bucket in self.buckets.values()]
        if self.stream is None:
            self.stream = self.transport.start(now_ms)
        self._send(now_ms, usages)

    # -- timers --------------------------------------------------------------------------------

    def fire_expiries(self, now_ms):
        """Runs the expiry timers due by now_ms, in the order they are due."""
        while True:
            due = [b for b in self.buckets.values() if b.timer is not None and b.timer[0] <= now_ms]
            if not due:
                return
            bucket = min(due, key=lambda b: b.timer[0])
            at, kind = bucket.timer
            bucket.timer = None
            bucket.token_bucket = None
            if kind == "assignment":
                self.expiries.append([at, bucket.index])
                if self.config.fallback is None:
                    bucket.action = None
                else:
                    # A blanket fallback drops the token bucket, for the fallback's timeout.
                    bucket.action = Strategy("blanket", blanket=self.config.fallback)
                    bucket.timer = (at + self.config.fallback_timeout_s * 1000, "fallback")
            else:
                self.fallback_ends.append([at, bucket.index])
                bucket.action = None

    def tick(self, now_ms, arrivals):
        """A tick: expiries due, then the requests that arrived ([count per bucket index], each
        decided in turn at now_ms), then the report timer if due."""
        if self.killed_ms is not None:
            return
        self.fire_expiries(now_ms)
        for index, count in enumerate(arrivals):
            if count:
                allowed = sum(self.request(now_ms, index) for _ in range(count))
                self.admitted.append([now_ms, index, allowed, count - allowed])
        while self.next_report_ms is not None and self.next_report_ms <= now_ms:
            self._report_tick(now_ms)
            self.next_report_ms += self.config.report_interval_ms

    # -- the stream ----------------------------------------------------------------------------

    def on_response(self, now_ms, actions):
        """A RateLimitQuotaResponse's bucket actions, handled in order (onQuotaResponseImpl)."""
        if self.killed_ms is not None:
            return
        self.fire_expiries(now_ms)
        for action in actions:
            record = {"t_ms": now_ms, "bucket_index": None}
            record.update(describe(action))
            self.assignments.append(record)
            if action.bucket_id:
                record["bucket_index"] = self.index_of.get(bucket_key(action.bucket_id))
            else:
                record.update(kind="skipped", reason="no_bucket_id")
                continue
            bucket = self.buckets.get(bucket_key(action.bucket_id))
            if bucket is None:
                record.update(kind="skipped", reason="not_cached")
                continue
            if action.kind == "abandon":
                # Erased with its usage; the next request creates it anew.
                del self.buckets[bucket_key(action.bucket_id)]
                continue
            if action.kind == "unset":
                strategy, token_bucket = Strategy("none"), None
            elif action.strategy.kind == "blanket":
                strategy, token_bucket = action.strategy, None
            elif action.strategy.kind == "token_bucket":
                strategy, rule = action.strategy, action.strategy.token_bucket
                if (
                    bucket.action is not None
                    and bucket.action.kind == "token_bucket"
                    and same_token_bucket(rule, bucket.action.token_bucket)
                ):
                    # The same bucket object, tokens and all; only its TTL restarts.
                    token_bucket = bucket.token_bucket
                    record.update(kept=True, initial_tokens=None)
                else:
                    token_bucket = TokenBucket(rule, now_ms, bucket.token_bucket)
                    record.update(kept=False, initial_tokens=token_bucket.initial_tokens)
            else:
                # requests_per_time_unit or no strategy: skipped whole, the old assignment and
                # its timer stay.
                record.update(kind="ignored", reason=action.strategy.kind)
                continue
            bucket.action = strategy
            bucket.token_bucket = token_bucket
            # Only the TTL's seconds are read; unset is 0, which expires at once.
            bucket.timer = (now_ms + max(action.ttl_seconds or 0, 0) * 1000, "assignment")

    def on_stream_closed(self, now_ms, stream):
        """The stream ended (onRemoteClose): forgotten, and nothing else."""
        if stream == self.stream:
            self.stream = None

    def kill(self, now_ms):
        self.killed_ms = now_ms
        self.stream = None
        self.next_report_ms = None


def describe(action):
    """What the server sent, for the output."""
    if action.kind == "abandon":
        return {"kind": "abandon"}
    out = {"kind": "unset" if action.kind == "unset" else action.strategy.kind}
    if action.kind == "assignment":
        out.update(ttl_s=action.ttl_seconds, ttl_nanos=action.ttl_nanos)
        strategy = action.strategy
        if strategy.kind == "blanket":
            out["blanket"] = strategy.blanket
        elif strategy.kind == "token_bucket":
            rule = strategy.token_bucket
            out.update(
                max_tokens=rule.max_tokens,
                tokens_per_fill=rule.tokens_per_fill,
                fill_interval_s=rule.fill_seconds,
                fill_interval_nanos=rule.fill_nanos,
            )
    return out


# ---------------------------------------------------------------------------------------------
# Load: when requests arrive.
# ---------------------------------------------------------------------------------------------


def exact(number):
    """A JSON number as an exact fraction (0.1 as 1/10, not its binary double)."""
    return Fraction(repr(number)) if isinstance(number, float) else Fraction(number)


class Load:
    """Evenly spaced arrivals of a piecewise-constant rate, within [start_s, end_s)."""

    def __init__(self, schedule, start_s=0, end_s=None):
        self.pieces = []  # (from, to or None, rps), in seconds
        schedule = sorted((exact(at), exact(rps)) for at, rps in schedule)
        start = exact(start_s)
        end = None if end_s is None else exact(end_s)
        for i, (at, rps) in enumerate(schedule):
            until = schedule[i + 1][0] if i + 1 < len(schedule) else None
            lo = max(at, start)
            hi = until if end is None else (end if until is None else min(until, end))
            if rps > 0 and (hi is None or lo < hi):
                self.pieces.append((lo, hi, rps))

    def arrived_by(self, t_ms):
        """How many requests arrived at or before t_ms."""
        t = Fraction(t_ms, 1000)
        count = 0
        for lo, hi, rps in self.pieces:
            if t < lo:
                continue
            n = math.floor((t - lo) * rps) + 1
            if hi is not None:
                n = min(n, math.ceil((hi - lo) * rps))
            count += n
        return count


# ---------------------------------------------------------------------------------------------
# The script: input, gRPC streams, HTTP actions, the clock.
# ---------------------------------------------------------------------------------------------

ENVOY_KEYS = {
    "name", "target", "token", "domain", "report_interval_s", "no_assignment", "expired_fallback",
    "start_s", "stop_s", "kill_at_s", "buckets",
}
BUCKET_KEYS = {"bucket_id", "load_rps", "load"}
HTTP_KEYS = {"at_s", "method", "url", "headers", "body"}


def check_keys(what, given, allowed):
    unknown = set(given) - allowed
    if unknown:
        raise ValueError(f"{what}: unknown keys {sorted(unknown)}")


def config_of(i, envoy):
    check_keys(f"envoys[{i}]", envoy, ENVOY_KEYS)
    for bucket in envoy.get("buckets", []):
        check_keys(f"envoys[{i}].buckets", bucket, BUCKET_KEYS)
        if not bucket.get("bucket_id"):
            raise ValueError(f"envoys[{i}]: a bucket needs a non-empty bucket_id")
    no_assignment = envoy.get("no_assignment") or ALLOW_ALL
    fallback = envoy.get("expired_fallback")
    if no_assignment not in BLANKETS:
        raise ValueError(f"envoys[{i}].no_assignment: {no_assignment!r} is not one of {BLANKETS}")
    if fallback is not None:
        check_keys(f"envoys[{i}].expired_fallback", fallback, {"blanket", "timeout_s"})
        if fallback.get("blanket") not in BLANKETS:
            raise ValueError(f"envoys[{i}].expired_fallback.blanket must be one of {BLANKETS}")
    if exact(envoy.get("report_interval_s", 5)) * 1000 < 1:
        raise ValueError(f"envoys[{i}].report_interval_s must be at least 1 ms")
    return EnvoyConfig(
        name=envoy.get("name") or f"e{i}",
        domain=envoy["domain"],
        bucket_ids=[{str(k): str(v) for k, v in b["bucket_id"].items()} for b in envoy.get("buckets", [])],
        report_interval_ms=round(exact(envoy.get("report_interval_s", 5)) * 1000),
        no_assignment=no_assignment,
        fallback=None if fallback is None else fallback["blanket"],
        # expired_assignment_behavior_timeout.seconds(): whole seconds only.
        fallback_timeout_s=0 if fallback is None else int(fallback.get("timeout_s") or 0),
    )


def loads_of(envoy):
    end = envoy.get("stop_s")
    kill = envoy.get("kill_at_s")
    if kill is not None:
        end = kill if end is None else min(end, kill)
    loads = []
    for bucket in envoy.get("buckets", []):
        schedule = bucket.get("load") or [[0, bucket.get("load_rps", 0)]]
        loads.append(Load(schedule, envoy.get("start_s", 0), end))
    return loads


def actions_of(response):
    """A RateLimitQuotaResponse as the model's Actions."""
    actions = []
    for proto in response.bucket_action:
        bucket_id = dict(proto.bucket_id.bucket) if proto.HasField("bucket_id") else None
        which = proto.WhichOneof("bucket_action")
        if which == "abandon_action":
            actions.append(Action(bucket_id, "abandon"))
            continue
        if which is None:
            actions.append(Action(bucket_id, "unset"))
            continue
        assignment = proto.quota_assignment_action
        ttl = assignment.assignment_time_to_live
        has_ttl = assignment.HasField("assignment_time_to_live")
        strategy = assignment.rate_limit_strategy
        kind = strategy.WhichOneof("strategy")
        if kind == "blanket_rule":
            rules = strategy.DESCRIPTOR.fields_by_name["blanket_rule"].enum_type.values_by_number
            rule = rules.get(strategy.blanket_rule)
            model_strategy = Strategy("blanket", blanket=rule.name if rule else str(strategy.blanket_rule))
        elif kind == "token_bucket":
            bucket = strategy.token_bucket
            model_strategy = Strategy("token_bucket", token_bucket=TokenBucketRule(
                max_tokens=bucket.max_tokens,
                tokens_per_fill=bucket.tokens_per_fill.value if bucket.HasField("tokens_per_fill") else None,
                fill_seconds=bucket.fill_interval.seconds,
                fill_nanos=bucket.fill_interval.nanos,
            ))
        elif kind == "requests_per_time_unit":
            model_strategy = Strategy("requests_per_time_unit")
        else:
            model_strategy = Strategy("none")
        actions.append(Action(
            bucket_id, "assignment", model_strategy,
            ttl_seconds=ttl.seconds if has_ttl else None,
            ttl_nanos=ttl.nanos if has_ttl else None,
        ))
    return actions


class GrpcTransport:
    """One Envoy's RLQS streams over grpcio: a channel of its own per stream (so no reconnect
    backoff of an earlier connection delays a new stream, as Envoy's connection pool would
    not), a thread reading each stream into `events` as (t_ms, envoy, kind, stream, payload)."""

    def __init__(self, envoy, target, token, clock, events):
        import grpc
        from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc

        self.grpc, self.pb, self.pb_grpc = grpc, rlqs_pb2, rlqs_pb2_grpc
        self.envoy, self.target, self.token = envoy, target, token
        self.clock, self.events = clock, events
        self.streams = []  # the output's records, one per stream, its index its id
        self.live = {}  # stream id -> (channel, call, outgoing queue)

    def start(self, now_ms):
        try:
            channel = self.grpc.insecure_channel(self.target, options=[
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ])
            outgoing = queue.Queue()

            def messages():
                # Envoy never half-closes its stream: this ends only when the stream is done.
                while (message := outgoing.get()) is not None:
                    yield message

            metadata = [("authorization", "Bearer " + self.token)] if self.token else []
            stub = self.pb_grpc.RateLimitQuotaServiceStub(channel)
            call = stub.StreamRateLimitQuotas(messages(), metadata=metadata)
        except Exception as error:  # any failure to start is "cannot open"
            print(f"rlqs_envoys: cannot open a stream to {self.target}: {error}", file=sys.stderr)
            return None
        stream = len(self.streams)
        self.streams.append({"opened_ms": now_ms, "closed_ms": None, "status": None, "details": None,
                             "responses": 0})
        self.live[stream] = (channel, call, outgoing)
        threading.Thread(target=self._read, args=(stream, call), daemon=True).start()
        return stream

    def _read(self, stream, call):
        try:
            for response in call:
                self.events.put((self.clock(), self.envoy, "response", stream, actions_of(response)))
            status, details = call.code(), call.details()
        except self.grpc.RpcError as error:
            status, details = error.code(), error.details()
        except Exception as error:  # a broken stream, whatever broke it
            status, details = self.grpc.StatusCode.UNKNOWN, repr(error)
        name = status.name if status is not None else "UNKNOWN"
        self.events.put((self.clock(), self.envoy, "closed", stream, (name, details or "")))

    def send(self, stream, now_ms, report):
        live = self.live.get(stream)
        if live is None:
            return
        Usage = self.pb.RateLimitQuotaUsageReports.BucketQuotaUsage
        message = self.pb.RateLimitQuotaUsageReports(domain=report.domain)
        for _, bucket_id, allowed, denied, elapsed in report.usages:
            usage = Usage(num_requests_allowed=allowed, num_requests_denied=denied)
            usage.bucket_id.bucket.update(bucket_id)
            # Set even when 0 s: Envoy always sets time_elapsed (the first report's is 0 s).
            usage.time_elapsed.seconds = elapsed
            usage.time_elapsed.nanos = 0
            message.bucket_quota_usages.append(usage)
        live[2].put(message)

    def closed(self, stream, now_ms, status, details):
        """The reader saw the stream end: its record, and its channel closed."""
        record = self.streams[stream]
        if record["status"] is None:
            record.update(closed_ms=now_ms, status=status, details=details)
        self._drop(stream)

    def kill(self, now_ms):
        for stream in list(self.live):
            record = self.streams[stream]
            if record["status"] is None:
                record.update(closed_ms=now_ms, status="CANCELLED", details="killed")
            self._drop(stream)

    def shutdown(self):
        for stream in list(self.live):
            self._drop(stream)

    def _drop(self, stream):
        live = self.live.pop(stream, None)
        if live is None:
            return
        channel, call, outgoing = live
        outgoing.put(None)
        call.cancel()
        channel.close()


def http_action(action, started, record):
    """Makes one HTTP request; its answer goes into record."""
    record["sent_ms"] = round((time.monotonic() - started) * 1000)
    body = action.get("body")
    data = None
    if body is not None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
    request = urllib.request.Request(
        action["url"], data=data, headers=action.get("headers") or {},
        method=action.get("method") or ("POST" if data is not None else "GET"),
    )
    try:
        with urllib.request.urlopen(request, timeout=GRACE_S / 2) as response:
            record["status"], text = response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        record["status"], text = error.code, error.read().decode("utf-8", "replace")
    except Exception as error:  # no answer, whatever the reason
        record["error"], text = repr(error), None
    if text is not None:
        try:
            record["body"] = json.loads(text)
        except ValueError:
            record["body"] = text
    record["done_ms"] = round((time.monotonic() - started) * 1000)


class Simulation:
    """The clock and the Envoys: ticks every tick_ms until duration_s."""

    def __init__(self, script):
        check_keys("input", script, {"duration_s", "tick_ms", "envoys", "http"})
        self.duration_ms = round(exact(script["duration_s"]) * 1000)
        self.tick_ms = int(script.get("tick_ms", 10))
        if self.tick_ms <= 0:
            raise ValueError("tick_ms must be positive")
        self.envoys = script.get("envoys", [])
        self.configs = [config_of(i, e) for i, e in enumerate(self.envoys)]
        self.loads = [loads_of(e) for e in self.envoys]
        self.http = script.get("http", [])
        for i, action in enumerate(self.http):
            check_keys(f"http[{i}]", action, HTTP_KEYS)
        self.http_records = [{"at_s": a["at_s"], "sent_ms": None, "done_ms": None, "status": None,
                              "body": None, "error": None} for a in self.http]
        self.events = queue.Queue()
        self.models = []
        self.transports = []
        self.started = None
        self.started_unix = None
        self.lock = threading.Lock()  # one print, by the main thread or the watchdog
        self.printed = False

    def now_ms(self):
        return int((time.monotonic() - self.started) * 1000)

    def run(self):
        self.started = time.monotonic()
        self.started_unix = time.time()
        for i, (envoy, config) in enumerate(zip(self.envoys, self.configs)):
            transport = GrpcTransport(i, envoy["target"], envoy.get("token"), self.now_ms, self.events)
            self.transports.append(transport)
            self.models.append(EnvoyModel(config, transport))
        kill_ms = [None if e.get("kill_at_s") is None else round(exact(e["kill_at_s"]) * 1000)
                   for e in self.envoys]
        http_ms = [round(exact(a["at_s"]) * 1000) for a in self.http]
        http_threads = [None] * len(self.http)
        arrived = [[0] * len(loads) for loads in self.loads]
        held = []  # events that arrived after the tick being processed
        last = 0  # the last tick processed
        for tick in range(self.duration_ms // self.tick_ms + 1):
            now = tick * self.tick_ms
            delay = self.started + now / 1000 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            while True:
                try:
                    held.append(self.events.get_nowait())
                except queue.Empty:
                    break
            held.sort(key=lambda e: e[0])  # stable: a stream's own events keep their order
            due = [e for e in held if e[0] <= now]
            held = [e for e in held if e[0] > now]
            for at, envoy, kind, stream, payload in due:
                # An event read too late for the last tick is handled as of that tick, so that
                # the model's clock never runs backwards.
                self._event(max(at, last), envoy, kind, stream, payload)
            last = now
            for i, action in enumerate(self.http):
                if http_threads[i] is None and http_ms[i] <= now:
                    http_threads[i] = threading.Thread(
                        target=http_action, args=(action, self.started, self.http_records[i]), daemon=True
                    )
                    http_threads[i].start()
            for i, model in enumerate(self.models):
                if model.killed_ms is None and kill_ms[i] is not None and kill_ms[i] <= now:
                    model.kill(now)
                    self.transports[i].kill(now)
                counts = []
                for j, load in enumerate(self.loads[i]):
                    total = load.arrived_by(now)
                    counts.append(total - arrived[i][j])
                    arrived[i][j] = total
                model.tick(now, counts)
        for transport in self.transports:
            transport.shutdown()
        # HTTP actions still running get until the grace period's half.
        deadline = self.started + (self.duration_ms / 1000) + GRACE_S / 2
        for i, thread in enumerate(http_threads):
            if thread is None:
                self.http_records[i]["error"] = "not made: at_s is past duration_s"
            else:
                thread.join(max(0, deadline - time.monotonic()))
        return self.output()

    def _event(self, at, envoy, kind, stream, payload):
        model, transport = self.models[envoy], self.transports[envoy]
        if model.killed_ms is not None:
            return
        if kind == "response":
            transport.streams[stream]["responses"] += 1
            model.on_response(at, payload)
        else:
            status, details = payload
            transport.closed(stream, at, status, details)
            model.on_stream_closed(at, stream)

    def output(self):
        envoys = []
        for config, model, transport in zip(self.configs, self.models, self.transports):
            envoys.append({
                "name": config.name,
                "admitted": model.admitted,
                "reports": model.reports,
                "dropped_reports": model.dropped_reports,
                "messages": model.messages,
                "assignments": model.assignments,
                "expiries": model.expiries,
                "fallback_ends": model.fallback_ends,
                "streams": transport.streams,
                "killed_ms": model.killed_ms,
            })
        return {"started_unix": self.started_unix, "duration_ms": self.duration_ms,
                "tick_ms": self.tick_ms, "envoys": envoys, "http": self.http_records}

    def emit(self, result, out=None):
        with self.lock:
            if self.printed:
                return
            self.printed = True
            json.dump(result, out or sys.stdout)
            (out or sys.stdout).write("\n")
            (out or sys.stdout).flush()


def main():
    try:
        script = json.load(sys.stdin)
        simulation = Simulation(script)
    except (ValueError, KeyError, TypeError) as error:
        print(f"rlqs_envoys: bad input: {error!r}", file=sys.stderr)
        sys.exit(2)

    def watchdog():
        # Past duration_s and the grace: print what there is and stop, whatever is stuck.
        result = simulation.output()
        result["error"] = "timed out closing down"
        simulation.emit(result)
        os._exit(1)

    timer = threading.Timer(simulation.duration_ms / 1000 + GRACE_S, watchdog)
    timer.daemon = True
    timer.start()
    simulation.emit(simulation.run())
    timer.cancel()


if __name__ == "__main__":
    main()

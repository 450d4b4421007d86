"""Self-test of tests/grpc/rlqs_envoys.py, the simulated Envoys; needs no plexsphere server.

The model's rules (Envoy's source, as rlqs_envoys.py's docstring says) are checked in-process, given clock values: the token bucket
(an equal assignment keeps its tokens, another carries the remaining share over, a fill
interval and a TTL count in whole seconds), the handling of each kind of bucket action, expiry
and the expired fallback, reports and stream breaks. Then the script's gRPC streams run end to
end against a small grpcio RLQS server in this process that serves fixed assignments, and the
script itself runs as the tests run it (JSON in and out, bounded in time).

    target/grpc-venv/bin/python tests/grpc/rlqs_envoys_selftest.py [-v]

Runs on the python that tests/grpc/setup.sh prints (grpcio and Envoy's compiled protos).
"""

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import unittest
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(sys.executable), "..", "rls"))

import grpc  # noqa: E402
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc  # noqa: E402

import rlqs_envoys  # noqa: E402
from rlqs_envoys import (  # noqa: E402
    ALLOW_ALL,
    DENY_ALL,
    Action,
    EnvoyConfig,
    EnvoyModel,
    Load,
    Strategy,
    TokenBucket,
    TokenBucketRule,
)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rlqs_envoys.py")
A = {"name": "checkout", "tenant": "acme"}
B = {"name": "search", "tenant": "acme"}


def token_bucket(max_tokens, per_fill, seconds=1, nanos=0, ttl=3, ttl_nanos=0, bucket_id=A):
    rule = TokenBucketRule(max_tokens, per_fill, seconds, nanos)
    return Action(bucket_id, "assignment", Strategy("token_bucket", token_bucket=rule), ttl, ttl_nanos)


def blanket(rule, ttl=3, ttl_nanos=0, bucket_id=A):
    return Action(bucket_id, "assignment", Strategy("blanket", blanket=rule), ttl, ttl_nanos)


class FakeTransport:
    """Streams that open (or not) and record what is sent."""

    def __init__(self, can_open=True):
        self.can_open = can_open
        self.started = []
        self.sent = []  # (t_ms, stream, Report)

    def start(self, now_ms):
        if not self.can_open:
            return None
        self.started.append(now_ms)
        return len(self.started) - 1

    def send(self, stream, now_ms, report):
        self.sent.append((now_ms, stream, report))


def model(no_assignment=DENY_ALL, fallback=None, fallback_timeout_s=0, interval_ms=5000, can_open=True):
    config = EnvoyConfig("e", "svc", [A, B], interval_ms, no_assignment, fallback, fallback_timeout_s)
    return EnvoyModel(config, FakeTransport(can_open))


def decide(envoy, now_ms, count, index=0):
    """`count` requests of a bucket at now_ms, as a tick decides them: how many were allowed."""
    envoy.fire_expiries(now_ms)
    return sum(envoy.request(now_ms, index) for _ in range(count))


class TokenBucketRules(unittest.TestCase):
    def test_starts_full_and_fills_continuously(self):
        bucket = TokenBucket(TokenBucketRule(5, 10, 1, 0), 0)
        self.assertEqual(sum(bucket.consume(0) for _ in range(7)), 5)
        # 10 a second: one token every 100 ms, none before.
        self.assertFalse(bucket.consume(99))
        self.assertTrue(bucket.consume(100))
        self.assertFalse(bucket.consume(100))
        # Capped at max_tokens however long it waits.
        self.assertEqual(sum(bucket.consume(60_000) for _ in range(9)), 5)

    def test_fill_interval_counts_in_whole_seconds(self):
        # 1.9 s is 1 s: 10 tokens a second, not 10 per 1.9 s.
        bucket = TokenBucket(TokenBucketRule(10, 10, 1, 900_000_000), 0)
        self.assertEqual(sum(bucket.consume(0) for _ in range(10)), 10)
        self.assertEqual(sum(bucket.consume(500) for _ in range(10)), 5)
        # 2.5 s is 2 s: 5 tokens a second.
        bucket = TokenBucket(TokenBucketRule(10, 10, 2, 500_000_000), 0)
        self.assertEqual(sum(bucket.consume(0) for _ in range(10)), 10)
        self.assertEqual(sum(bucket.consume(1000) for _ in range(10)), 5)

    def test_fill_interval_under_a_second_never_runs_dry(self):
        # 0 whole seconds: the rate is +inf, and NaN with tokens_per_fill 0; both leave the
        # bucket at max_tokens.
        for per_fill in (10, 0, None):
            bucket = TokenBucket(TokenBucketRule(3, per_fill, 0, 500_000_000), 0)
            self.assertEqual(sum(bucket.consume(0) for _ in range(1000)), 1000)
        empty = TokenBucket(TokenBucketRule(0, 10, 0, 500_000_000), 0)
        self.assertFalse(empty.consume(0))

    def test_unset_tokens_per_fill_is_zero_so_a_token_a_year(self):
        bucket = TokenBucket(TokenBucketRule(2, None, 1, 0), 0)
        self.assertEqual(sum(bucket.consume(0) for _ in range(5)), 2)
        self.assertFalse(bucket.consume(3_600_000))
        self.assertTrue(bucket.consume(365 * 24 * 3_600_000))

    def test_carries_the_remaining_share_over_truncated(self):
        slow = TokenBucketRule(10, 1, 1000, 0)
        old = TokenBucket(slow, 0)
        for _ in range(7):
            self.assertTrue(old.consume(0))
        # 3 of 10 left: a new bucket of 5 gets floor(5 * 0.3) = 1, one of 4 gets floor(1.2) = 1,
        # one of 20 gets 6.
        self.assertEqual(TokenBucket(TokenBucketRule(5, 1, 1000, 0), 0, old).initial_tokens, 1)
        self.assertEqual(TokenBucket(TokenBucketRule(4, 1, 1000, 0), 0, old).initial_tokens, 1)
        new = TokenBucket(TokenBucketRule(20, 1, 1000, 0), 0, old)
        self.assertEqual(new.initial_tokens, 6)
        self.assertEqual(sum(new.consume(0) for _ in range(10)), 6)
        # An empty old bucket leaves the new one empty: 0 initial tokens is empty, not full.
        drained = TokenBucket(TokenBucketRule(1, 1, 1000, 0), 0)
        self.assertTrue(drained.consume(0))
        self.assertEqual(TokenBucket(TokenBucketRule(5, 1, 1000, 0), 0, drained).initial_tokens, 0)


class Requests(unittest.TestCase):
    def test_first_request_takes_the_default_and_is_reported_at_once(self):
        envoy = model(DENY_ALL)
        self.assertFalse(envoy.request(250, 0))
        self.assertEqual(envoy.transport.started, [250])
        (at, stream, report), = envoy.transport.sent
        self.assertEqual((at, stream, report.domain), (250, 0, "svc"))
        self.assertEqual(report.usages, [(0, A, 0, 1, 0)])
        self.assertEqual(decide(envoy, 300, 4), 0)
        # A second bucket: no second stream, its own immediate report.
        self.assertFalse(envoy.request(400, 1))
        self.assertEqual(envoy.transport.started, [250])
        self.assertEqual(envoy.transport.sent[-1][2].usages, [(1, B, 0, 1, 0)])

        envoy = model(ALLOW_ALL)
        self.assertEqual(decide(envoy, 0, 3), 3)
        self.assertEqual(envoy.transport.sent[0][2].usages, [(0, A, 1, 0, 0)])

    def test_requests_per_time_unit_default_strategy_fails_open(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.buckets[rlqs_envoys.bucket_key(A)].action = Strategy("requests_per_time_unit")
        self.assertEqual(decide(envoy, 10, 5), 5)


class Responses(unittest.TestCase):
    def test_token_bucket_assignment_then_the_same_keeps_its_tokens(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(10, [token_bucket(5, 10)])
        self.assertEqual(decide(envoy, 10, 3), 3)
        # Equal in max_tokens, tokens_per_fill and fill_interval's nanos: the same bucket, two
        # tokens left (not full again), and the TTL restarted.
        envoy.on_response(10, [token_bucket(5, 10, ttl=4)])
        self.assertEqual(decide(envoy, 10, 5), 2)
        self.assertEqual(envoy.assignments[-1]["kept"], True)
        self.assertEqual(envoy.buckets[rlqs_envoys.bucket_key(A)].timer, (4010, "assignment"))
        # fill_interval.seconds alone differs (2 s): still equal, the old 10/s rate stays.
        envoy.on_response(10, [token_bucket(5, 10, seconds=2)])
        self.assertTrue(envoy.assignments[-1]["kept"])
        self.assertEqual(decide(envoy, 210, 5), 2)
        # max_tokens differs: a new bucket, which carries over 0 of 5 left as floor(6 * 0) = 0.
        envoy.on_response(210, [token_bucket(6, 10)])
        self.assertEqual(envoy.assignments[-1]["kept"], False)
        self.assertEqual(envoy.assignments[-1]["initial_tokens"], 0)
        self.assertEqual(decide(envoy, 210, 5), 0)
        # fill_interval.nanos differs: a new bucket too.
        envoy.on_response(1210, [token_bucket(6, 10, nanos=1)])
        self.assertEqual(envoy.assignments[-1]["kept"], False)

    def test_proportional_carry_over_on_a_changed_assignment(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(0, [token_bucket(10, 1, seconds=1000)])
        self.assertEqual(decide(envoy, 0, 6), 6)
        envoy.on_response(0, [token_bucket(5, 1, seconds=1000)])  # 4/10 of 5: 2
        self.assertEqual(envoy.assignments[-1]["initial_tokens"], 2)
        self.assertEqual(decide(envoy, 0, 5), 2)

    def test_blanket_drops_the_token_bucket_so_the_next_starts_full(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(0, [token_bucket(5, 1, seconds=1000)])
        self.assertEqual(decide(envoy, 0, 5), 5)
        envoy.on_response(0, [blanket(DENY_ALL)])
        self.assertEqual(decide(envoy, 0, 3), 0)
        envoy.on_response(0, [blanket(ALLOW_ALL)])
        self.assertEqual(decide(envoy, 0, 3), 3)
        envoy.on_response(0, [token_bucket(5, 1, seconds=1000)])
        self.assertEqual(envoy.assignments[-1]["initial_tokens"], 5)
        self.assertEqual(decide(envoy, 0, 9), 5)

    def test_ttl_counts_in_whole_seconds_and_unset_expires_at_once(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(100, [blanket(ALLOW_ALL, ttl=1, ttl_nanos=900_000_000)])  # 1.9 s: 1 s
        self.assertEqual(decide(envoy, 1099, 2), 2)
        self.assertEqual(decide(envoy, 1100, 2), 0)
        self.assertEqual(envoy.expiries, [[1100, 0]])
        # 0.5 s and unset are 0 s: expired before the next request, even at the same instant.
        envoy.on_response(2000, [blanket(ALLOW_ALL, ttl=0, ttl_nanos=500_000_000)])
        self.assertEqual(decide(envoy, 2000, 2), 0)
        envoy.on_response(3000, [blanket(ALLOW_ALL, ttl=None, ttl_nanos=None)])
        self.assertEqual(decide(envoy, 3000, 2), 0)
        self.assertEqual(envoy.expiries, [[1100, 0], [2000, 0], [3000, 0]])

    def test_expiry_reverts_to_the_default_and_keeps_the_bucket_and_its_usage(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(0, [token_bucket(5, 1, seconds=1000, ttl=2)])
        self.assertEqual(decide(envoy, 0, 3), 3)
        self.assertEqual(decide(envoy, 2000, 3), 0)
        bucket = envoy.buckets[rlqs_envoys.bucket_key(A)]
        self.assertEqual((bucket.allowed, bucket.denied, bucket.action, bucket.token_bucket), (3, 3, None, None))
        # The first token bucket after an expiry starts full, the expired one forgotten.
        envoy.on_response(2000, [token_bucket(5, 1, seconds=1000)])
        self.assertEqual(envoy.assignments[-1]["initial_tokens"], 5)

    def test_expired_fallback_applies_for_its_timeout_then_the_default(self):
        envoy = model(DENY_ALL, fallback=ALLOW_ALL, fallback_timeout_s=2)
        envoy.request(0, 0)
        envoy.on_response(0, [token_bucket(1, 1, seconds=1000, ttl=1)])
        self.assertEqual(decide(envoy, 500, 3), 1)
        self.assertEqual(decide(envoy, 1000, 3), 3)  # the fallback, ALLOW_ALL
        self.assertEqual(decide(envoy, 2999, 3), 3)
        self.assertEqual(decide(envoy, 3000, 3), 0)  # the default, DENY_ALL
        self.assertEqual((envoy.expiries, envoy.fallback_ends), ([[1000, 0]], [[3000, 0]]))
        # A timeout of 0 ends at once.
        envoy = model(DENY_ALL, fallback=ALLOW_ALL, fallback_timeout_s=0)
        envoy.request(0, 0)
        envoy.on_response(0, [blanket(ALLOW_ALL, ttl=1)])
        self.assertEqual(decide(envoy, 1000, 3), 0)
        self.assertEqual(envoy.fallback_ends, [[1000, 0]])

    def test_requests_per_time_unit_and_no_strategy_are_ignored_whole(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(0, [token_bucket(5, 1, seconds=1000, ttl=2)])
        self.assertEqual(decide(envoy, 0, 3), 3)
        ignored = [
            Action(A, "assignment", Strategy("requests_per_time_unit"), 60, 0),
            Action(A, "assignment", Strategy("none"), 60, 0),
        ]
        envoy.on_response(1000, ignored)
        self.assertEqual([a["kind"] for a in envoy.assignments[-2:]], ["ignored", "ignored"])
        # The token bucket (2 left) and its 2 s TTL stay.
        self.assertEqual(decide(envoy, 1000, 5), 2)
        self.assertEqual(decide(envoy, 2000, 1), 0)
        self.assertEqual(envoy.expiries, [[2000, 0]])

    def test_an_action_with_neither_oneof_is_cached_and_expires_at_once(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(0, [blanket(ALLOW_ALL, ttl=60)])
        envoy.on_response(500, [Action(A, "unset")])
        self.assertEqual(envoy.assignments[-1]["kind"], "unset")
        self.assertEqual(decide(envoy, 500, 2), 0)
        self.assertEqual(envoy.expiries, [[500, 0]])

    def test_abandon_erases_the_bucket_and_its_usage(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(0, [blanket(ALLOW_ALL, ttl=60)])
        self.assertEqual(decide(envoy, 100, 4), 4)
        envoy.on_response(200, [Action(A, "abandon")])
        self.assertEqual(envoy.buckets, {})
        # The 4 allowed are never reported; the next request makes the bucket anew, reported at once.
        self.assertFalse(envoy.request(300, 0))
        self.assertEqual(envoy.transport.sent[-1][2].usages, [(0, A, 0, 1, 0)])
        self.assertEqual(envoy.transport.started, [0])
        envoy.tick(5000, [0, 0])
        self.assertEqual(envoy.transport.sent[-1][2].usages, [(0, A, 0, 0, 4)])

    def test_actions_without_an_id_or_for_no_cached_bucket_are_skipped(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        other = {"name": "nobody"}
        envoy.on_response(0, [blanket(ALLOW_ALL, bucket_id=None), blanket(ALLOW_ALL, bucket_id={}),
                              blanket(ALLOW_ALL, bucket_id=B), blanket(ALLOW_ALL, bucket_id=other),
                              Action(B, "abandon")])
        reasons = [(a["kind"], a.get("reason"), a["bucket_index"]) for a in envoy.assignments]
        self.assertEqual(reasons, [("skipped", "no_bucket_id", None)] * 2 + [
            ("skipped", "not_cached", 1), ("skipped", "not_cached", None), ("skipped", "not_cached", 1)])
        self.assertEqual(decide(envoy, 0, 2), 0)
        # Actions are handled in order: a skipped one does not stop the next.
        envoy.on_response(10, [blanket(ALLOW_ALL, bucket_id=other), blanket(ALLOW_ALL)])
        self.assertEqual(decide(envoy, 10, 2), 2)

    def test_no_report_on_an_assignment(self):
        envoy = model(DENY_ALL)
        envoy.request(0, 0)
        envoy.on_response(0, [blanket(ALLOW_ALL), token_bucket(5, 10)])
        self.assertEqual(len(envoy.transport.sent), 1)


class Reports(unittest.TestCase):
    def test_every_bucket_each_interval_counts_reset_elapsed_truncated(self):
        envoy = model(ALLOW_ALL, interval_ms=1000)
        envoy.tick(0, [2, 0])
        envoy.tick(700, [0, 3])
        envoy.tick(1000, [1, 0])
        envoy.tick(2000, [0, 0])
        sent = [(at, stream, report.domain, report.usages) for at, stream, report in envoy.transport.sent]
        self.assertEqual(sent, [
            (0, 0, "svc", [(0, A, 1, 0, 0)]),
            (700, 0, "svc", [(1, B, 1, 0, 0)]),
            (1000, 0, "svc", [(0, A, 2, 0, 1), (1, B, 2, 0, 0)]),  # B: 300 ms is 0 s
            (2000, 0, "svc", [(0, A, 0, 0, 1), (1, B, 0, 0, 1)]),
        ])
        self.assertEqual(envoy.reports[-2:], [[2000, 0, 0, 0, 1], [2000, 1, 0, 0, 1]])
        self.assertEqual(envoy.admitted, [[0, 0, 2, 0], [700, 1, 3, 0], [1000, 0, 1, 0]])

    def test_a_broken_stream_keeps_the_assignments_and_reopens_at_the_next_tick(self):
        envoy = model(DENY_ALL, interval_ms=1000)
        envoy.tick(0, [1, 0])
        envoy.on_response(10, [token_bucket(100, 1, seconds=1000, ttl=3)])
        envoy.on_stream_closed(500, 0)
        self.assertIsNone(envoy.stream)
        # Still enforced after the break; a new bucket's immediate report is dropped, its
        # count with it, and opens no stream.
        envoy.tick(600, [2, 1])
        self.assertEqual(envoy.admitted[-2:], [[600, 0, 2, 0], [600, 1, 0, 1]])
        self.assertEqual(envoy.dropped_reports, [[600, 1, 0, 1, 0]])
        self.assertEqual(envoy.transport.started, [0])
        # The tick opens a stream; its first message is every bucket's report.
        envoy.tick(1000, [0, 0])
        self.assertEqual(envoy.transport.started, [0, 1000])
        at, stream, report = envoy.transport.sent[-1]
        self.assertEqual((at, stream), (1000, 1))
        self.assertEqual(report.usages, [(0, A, 2, 0, 1), (1, B, 0, 0, 0)])
        # A close of a stream no longer current changes nothing.
        envoy.on_stream_closed(1100, 0)
        self.assertEqual(envoy.stream, 1)
        self.assertEqual(decide(envoy, 2000, 1), 1)
        self.assertEqual(decide(envoy, 3010, 1), 0)

    def test_a_stream_that_cannot_open_drops_the_reset_counts(self):
        envoy = model(ALLOW_ALL, interval_ms=1000, can_open=False)
        envoy.tick(0, [3, 0])
        envoy.tick(1000, [2, 0])  # decided before the tick's report, so in it
        envoy.tick(1500, [1, 0])
        envoy.tick(2000, [0, 0])
        self.assertEqual(envoy.transport.sent, [])
        self.assertEqual(envoy.dropped_reports, [[0, 0, 1, 0, 0], [1000, 0, 4, 0, 1], [2000, 0, 1, 0, 1]])

    def test_a_killed_envoy_does_nothing_more(self):
        envoy = model(ALLOW_ALL, interval_ms=1000)
        envoy.tick(0, [1, 0])
        envoy.kill(500)
        envoy.tick(1000, [5, 5])
        envoy.on_response(1000, [blanket(DENY_ALL)])
        self.assertEqual((len(envoy.transport.sent), envoy.admitted, envoy.assignments), (1, [[0, 0, 1, 0]], []))


class Loads(unittest.TestCase):
    def test_evenly_spaced_piecewise_and_bounded(self):
        load = Load([[0, 10]])
        self.assertEqual([load.arrived_by(t) for t in (0, 99, 100, 1000)], [1, 1, 2, 11])
        load = Load([[1, 4], [2, 0], [3, 0.5]], start_s=0, end_s=10)
        self.assertEqual([load.arrived_by(t) for t in (999, 1000, 1999, 2500, 3000, 5000, 20_000)],
                         [0, 1, 4, 4, 5, 6, 8])
        self.assertEqual(Load([[0, 100]], start_s=1.5, end_s=2).arrived_by(10_000), 50)


class RlqsServer(rlqs_pb2_grpc.RateLimitQuotaServiceServicer):
    """Serves fixed assignments: a token bucket of 5, 10 tokens per 1 s fill, TTL 3 s, for each
    bucket of the first two messages of the first stream; ends that stream with UNAVAILABLE at
    its fifth message; answers nothing on later streams."""

    def __init__(self):
        self.received = []  # (stream, authorization, RateLimitQuotaUsageReports)
        self.streams = 0
        self.lock = threading.Lock()

    def StreamRateLimitQuotas(self, request_iterator, context):
        with self.lock:
            stream = self.streams
            self.streams += 1
        authorization = dict(context.invocation_metadata()).get("authorization")
        for count, message in enumerate(request_iterator, 1):
            self.received.append((stream, authorization, message))
            if stream == 0 and count <= 2:
                response = rlqs_pb2.RateLimitQuotaResponse()
                for usage in message.bucket_quota_usages:
                    action = response.bucket_action.add()
                    action.bucket_id.CopyFrom(usage.bucket_id)
                    assignment = action.quota_assignment_action
                    assignment.assignment_time_to_live.seconds = 3
                    bucket = assignment.rate_limit_strategy.token_bucket
                    bucket.max_tokens = 5
                    bucket.tokens_per_fill.value = 10
                    bucket.fill_interval.seconds = 1
                yield response
            if stream == 0 and count == 5:
                context.abort(grpc.StatusCode.UNAVAILABLE, "going away")


class Echo(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        answer = json.dumps({"got": json.loads(body), "auth": self.headers["authorization"]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


class EndToEnd(unittest.TestCase):
    def test_streams_against_an_in_process_rlqs_server(self):
        servicer = RlqsServer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        rlqs_pb2_grpc.add_RateLimitQuotaServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
        threading.Thread(target=web.serve_forever, daemon=True).start()
        try:
            simulation = rlqs_envoys.Simulation({
                "duration_s": 5.5, "tick_ms": 10,
                "envoys": [{"name": "e1", "target": f"127.0.0.1:{port}", "token": "secret", "domain": "svc",
                            "report_interval_s": 1, "no_assignment": "DENY_ALL",
                            "buckets": [{"bucket_id": A, "load_rps": 100}]}],
                "http": [{"at_s": 0.5, "method": "PUT", "url": f"http://127.0.0.1:{web.server_port}/v1/x",
                          "headers": {"authorization": "Bearer x", "content-type": "application/json"},
                          "body": {"limit": 5}}],
            })
            began = time.monotonic()
            result = simulation.run()
            self.assertLess(time.monotonic() - began, 8)
        finally:
            server.stop(0)
            web.shutdown()
            web.server_close()
        json.dumps(result)  # all of it is JSON
        envoy = result["envoys"][0]

        # Two streams, both with the token; the first ended by the server, the second opened by
        # the report tick after that and open at the end.
        first, second = envoy["streams"]
        self.assertEqual((first["status"], first["details"], first["responses"]), ("UNAVAILABLE", "going away", 2))
        self.assertEqual((second["opened_ms"], second["status"]), (5000, None))
        self.assertEqual({auth for _, auth, _ in servicer.received}, {"Bearer secret"})

        # What the server received is what the simulator says it sent: the immediate report,
        # then one a second, domain on every message, the first of the new stream a full report.
        # (time_elapsed is on the wire even when 0 s, as Envoy sets it.)
        got = [(stream, m.domain, [(dict(u.bucket_id.bucket), u.num_requests_allowed, u.num_requests_denied,
                                    u.HasField("time_elapsed"), u.time_elapsed.seconds, u.time_elapsed.nanos)
                                   for u in m.bucket_quota_usages])
               for stream, _, m in servicer.received]
        # One bucket, so one usage a message.
        said = [(stream, "svc", [(A, allowed, denied, True, elapsed, 0)])
                for (_, stream, _), (_, _, allowed, denied, elapsed) in zip(envoy["messages"], envoy["reports"])]
        self.assertEqual(got, said)
        self.assertEqual([m[:2] for m in envoy["messages"]], [[0, 0], [1000, 0], [2000, 0], [3000, 0], [4000, 0],
                                                               [5000, 1]])
        self.assertEqual(envoy["reports"][0], [0, 0, 0, 1, 0])
        self.assertEqual({r[4] for r in envoy["reports"][1:]}, {1})
        self.assertEqual(envoy["dropped_reports"], [])

        # The assignment: new and full at first, kept (same bucket, TTL restarted) the second
        # time, expired 3 s after that, DENY_ALL again from then on.
        new, kept = envoy["assignments"]
        self.assertEqual((new["kind"], new["kept"], new["initial_tokens"], new["max_tokens"], new["tokens_per_fill"],
                          new["fill_interval_s"], new["ttl_s"]), ("token_bucket", False, 5, 5, 10, 1, 3))
        self.assertEqual((kept["kind"], kept["kept"]), ("token_bucket", True))
        self.assertLess(new["t_ms"], 500)
        self.assertTrue(1000 <= kept["t_ms"] < 1500)
        self.assertEqual(envoy["expiries"], [[kept["t_ms"] + 3000, 0]])
        expiry = kept["t_ms"] + 3000

        admitted = envoy["admitted"]
        self.assertEqual(sum(a + d for _, _, a, d in admitted), 551)  # 100 a second for 5.5 s, from 0
        self.assertEqual(admitted[0], [0, 0, 0, 1])
        self.assertEqual(sum(a for t, _, a, _ in admitted if t <= new["t_ms"] or t >= expiry), 0)
        # 5 at once, then 10 a second, decided at 10 ms ticks: within one token of that.
        allowed = sum(a for _, _, a, _ in admitted)
        self.assertLessEqual(abs(allowed - (5 + (expiry - new["t_ms"]) / 100)), 1.5)
        reported = sum(r[2] + r[3] for r in envoy["reports"])
        self.assertEqual(reported, sum(a + d for t, _, a, d in admitted if t <= 5000))

        (action,) = result["http"]
        self.assertEqual((action["status"], action["body"]), (200, {"got": {"limit": 5}, "auth": "Bearer x"}))
        self.assertTrue(500 <= action["sent_ms"] < 1000)


class Script(unittest.TestCase):
    def run_script(self, script, timeout=20):
        return subprocess.run([sys.executable, SCRIPT], input=json.dumps(script), capture_output=True, text=True,
                              timeout=timeout)

    def test_no_server_bounded_in_time_and_json_out(self):
        began = time.monotonic()
        done = self.run_script({
            "duration_s": 1.2, "tick_ms": 20,
            "envoys": [{"target": "127.0.0.1:1", "domain": "svc", "report_interval_s": 0.5, "kill_at_s": 1.1,
                        "buckets": [{"bucket_id": A, "load": [[0, 10], [0.5, 0]]}]}],
        })
        self.assertLess(time.monotonic() - began, 10)
        self.assertEqual(done.returncode, 0, done.stderr)
        envoy = json.loads(done.stdout)["envoys"][0]
        self.assertEqual(envoy["name"], "e0")
        self.assertEqual(sum(a for _, _, a, _ in envoy["admitted"]), 5)
        self.assertEqual([m[0] for m in envoy["messages"]], [0, 500, 1000])
        self.assertEqual(envoy["killed_ms"], 1100)
        self.assertTrue(all(s["status"] is not None for s in envoy["streams"]))

    def test_bad_input_exits_2(self):
        done = self.run_script({"duration_s": 1, "envoys": [{"target": "x", "domain": "d", "bukets": []}]})
        self.assertEqual(done.returncode, 2)
        self.assertIn("bukets", done.stderr)


if __name__ == "__main__":
    unittest.main()

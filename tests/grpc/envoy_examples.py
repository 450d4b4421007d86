"""Checks a ShouldRateLimit server against the envoyproxy/ratelimit README examples.

The examples are the YAML files in examples/envoy-ratelimit/ and what the README says of each
is written as requests and expected answers in examples/envoy-ratelimit/expectations.json
(its "format" field says how to read it). This script sends those requests and compares the
answers. Load the example's rules first: each example on its own, since several examples
share a domain (see examples/envoy-ratelimit/README.md).

    python=$(bash tests/grpc/setup.sh)
    PLEXSPHERE_GRPC=127.0.0.1:8081 PLEXSPHERE_DECIDE_TOKEN=... \\
        "$python" tests/grpc/envoy_examples.py 02-messaging
    "$python" tests/grpc/envoy_examples.py --list

Arguments name examples: a full name ("04b-example4"), or a prefix ("04" is 04a and 04b,
"09" all three of Example 9); "all" or none is every example. --fresh also compares the
counts that are known only when the example's buckets were never used before (a new store).

Uses the client of tests/grpc/rls_client.py (Envoy's protos compiled by setup.sh), so it must
run on the python that setup.sh prints. Prints each mismatch, then a closing line
"N passed, N failed" (requests whose every answer matched, and the others); exits 1 when
anything failed, 2 on bad usage.
"""

import argparse
import json
import os
import secrets
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import rls_client  # noqa: E402  (first: it puts the compiled protos on the path)

    import grpc  # noqa: E402
    from envoy.service.ratelimit.v3 import rls_pb2_grpc  # noqa: E402
except ImportError as error:  # pragma: no cover - a usage problem, not a test failure
    sys.exit(
        "envoy_examples: %s\nrun it with the python that `bash tests/grpc/setup.sh` prints" % error
    )

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_EXPECTATIONS = os.path.join(ROOT, "examples", "envoy-ratelimit", "expectations.json")


def select(examples, names):
    """The example names chosen by the command line's names (full names or prefixes)."""
    if not names or names == ["all"]:
        return list(examples)
    chosen = []
    for name in names:
        matches = [e for e in examples if e == name] or [e for e in examples if e.startswith(name)]
        if not matches:
            raise KeyError(name)
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def substitute(text, run):
    return text.replace("{run}", run)


def call_of(request, run):
    """The call rls_client.request_of builds a RateLimitRequest from."""
    descriptors = []
    for descriptor in request["descriptors"]:
        out = {"entries": [[k, substitute(v, run)] for k, v in descriptor["entries"]]}
        for field in ("hits_addend", "limit"):
            if field in descriptor:
                out[field] = descriptor[field]
        descriptors.append(out)
    return {
        "domain": request["domain"],
        "descriptors": descriptors,
        "hits_addend": request.get("hits_addend", 0),
    }


def compare(expect, answer, fresh):
    """Differences between an expected answer and rls_client.answer_of's, as text lines."""
    problems = []
    if answer["overall_code"] != expect["overall"]:
        problems.append("overall: want %s, got %s" % (expect["overall"], answer["overall_code"]))
    want, got = expect["statuses"], answer["statuses"]
    if len(want) != len(got):
        problems.append("statuses: want %d, got %d" % (len(want), len(got)))
        return problems
    for i, (w, g) in enumerate(zip(want, got)):
        where = "statuses[%d]" % i
        if g["code"] != w["code"]:
            problems.append("%s.code: want %s, got %s" % (where, w["code"], g["code"]))
        limit, current = w["limit"], g["current_limit"]
        if limit is None:
            if current is not None:
                problems.append("%s.current_limit: want none, got %s" % (where, json.dumps(current)))
        elif current is None:
            problems.append("%s.current_limit: want %s, got none" % (where, json.dumps(limit)))
        else:
            wanted = {
                "requests_per_unit": limit["requests_per_unit"],
                "unit": limit["unit"],
                "name": limit.get("name", ""),
            }
            for field, value in wanted.items():
                if current[field] != value:
                    problems.append(
                        "%s.current_limit.%s: want %r, got %r" % (where, field, value, current[field])
                    )
        remaining = w.get("limit_remaining")
        if remaining is None and fresh:
            remaining = w.get("limit_remaining_if_fresh")
        if remaining is not None and g["limit_remaining"] != remaining:
            problems.append(
                "%s.limit_remaining: want %d, got %d" % (where, remaining, g["limit_remaining"])
            )
    return problems


def run_example(stub, metadata, name, example, run, fresh, out):
    """Sends the example's requests in order; returns (passed, failed) request counts."""
    passed = failed = 0
    for number, request in enumerate(example["requests"], 1):
        label = "%s #%d %s" % (name, number, request.get("name", ""))
        checked = fresh or not request.get("fresh_only", False)
        call = call_of(request, run)
        repeat = request.get("repeat", 1)
        problems = []
        for attempt in range(1, repeat + 1):
            try:
                response = stub.ShouldRateLimit(
                    rls_client.request_of(call), metadata=metadata, timeout=20
                )
            except grpc.RpcError as error:
                problems.append(
                    "[%d/%d] gRPC %s: %s" % (attempt, repeat, error.code().name, error.details())
                )
                break
            if not checked:
                continue
            answer = rls_client.answer_of(response)
            expectations = []
            if "expect_each" in request:
                expectations.append(request["expect_each"])
            if attempt == repeat and "expect" in request:
                expectations.append(request["expect"])
            for expect in expectations:
                for problem in compare(expect, answer, fresh):
                    problems.append("[%d/%d] %s" % (attempt, repeat, problem))
                if problems:
                    problems.append("    answer: %s" % json.dumps(answer, sort_keys=True))
                    break
            if problems:
                break
        if problems:
            failed += 1
            print("MISMATCH %s (%s)" % (label, request.get("says", "")), file=out)
            for problem in problems:
                print("    " + problem, file=out)
        else:
            passed += 1
            print("ok %s%s" % (label, "" if checked else " (sent, not compared: --fresh only)"), file=out)
    return passed, failed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", nargs="*", help='example names or prefixes; "all" or none: every one')
    parser.add_argument("--fresh", action="store_true", help="also compare counts known only on a new store")
    parser.add_argument("--list", action="store_true", help="list the examples and their files, then stop")
    parser.add_argument("--expectations", default=DEFAULT_EXPECTATIONS, help="path of expectations.json")
    args = parser.parse_args(argv)

    with open(args.expectations) as file:
        examples = json.load(file)["examples"]
    if args.list:
        for name, example in examples.items():
            print("%s\t%s\tdomain %s\t%d requests" % (name, example["file"], example["domain"], len(example["requests"])))
        return 0
    try:
        chosen = select(examples, args.examples)
    except KeyError as error:
        print("envoy_examples: no example named %s (see --list)" % error, file=sys.stderr)
        return 2

    target = os.environ.get("PLEXSPHERE_GRPC")
    if not target:
        print("envoy_examples: set PLEXSPHERE_GRPC to the server's host:port", file=sys.stderr)
        return 2
    token = os.environ.get("PLEXSPHERE_DECIDE_TOKEN")
    metadata = [("authorization", "Bearer " + token)] if token else []
    # New for every run: buckets keyed by a value that carries it start full.
    run = "r%x%s" % (int(time.time()) % 0x100000, secrets.token_hex(2))

    passed = failed = 0
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for name in chosen:
            p, f = run_example(stub, metadata, name, examples[name], run, args.fresh, sys.stdout)
            passed, failed = passed + p, failed + f
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""A client of Envoy's rate limit service protocol, for the tests (tests/it/decide.rs).

Built by grpcio-tools from Envoy's protos (tests/grpc/setup.sh), independently of the
server's generated code. Reads a JSON object from standard input:

    {"target": "127.0.0.1:8081", "calls": [
        {"token": "...", "domain": "directory", "hits_addend": 1,
         "descriptors": [{"entries": [["api", "GET /v1/users"], ["tenant", "contoso"]],
                          "hits_addend": 2, "limit": {"requests_per_unit": 5, "unit": "MINUTE"}}]}]}

makes each call in order on one channel, and prints one JSON array, an object per call: the
gRPC status code's name, its details, and for an OK call the response (overall_code,
statuses with their code, current_limit, limit_remaining and duration_until_reset in
milliseconds, and response_headers_to_add), enum values by their names in the protos.

A call with "until_rule": NAME is made again and again (up to "deadline_ms") until its first
status's limit is that rule's; its answer then also says "seen_at", the wall-clock time (Unix
seconds) of the first response that named it.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(sys.executable), "..", "rls"))

import grpc  # noqa: E402
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: E402
from envoy.type.v3 import ratelimit_unit_pb2  # noqa: E402

Response = rls_pb2.RateLimitResponse


def request_of(call):
    descriptors = []
    for descriptor in call.get("descriptors", []):
        message = ratelimit_pb2.RateLimitDescriptor(
            entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in descriptor["entries"]]
        )
        if "hits_addend" in descriptor:
            message.hits_addend.value = descriptor["hits_addend"]
        if "limit" in descriptor:
            message.limit.requests_per_unit = descriptor["limit"]["requests_per_unit"]
            message.limit.unit = ratelimit_unit_pb2.RateLimitUnit.Value(descriptor["limit"]["unit"])
        descriptors.append(message)
    return rls_pb2.RateLimitRequest(
        domain=call["domain"], descriptors=descriptors, hits_addend=call.get("hits_addend", 0)
    )


def answer_of(response):
    statuses = []
    for status in response.statuses:
        entry = {
            "code": Response.Code.Name(status.code),
            "limit_remaining": status.limit_remaining,
            "duration_until_reset_ms": None,
            "current_limit": None,
        }
        if status.HasField("duration_until_reset"):
            entry["duration_until_reset_ms"] = status.duration_until_reset.ToMilliseconds()
        if status.HasField("current_limit"):
            entry["current_limit"] = {
                "name": status.current_limit.name,
                "requests_per_unit": status.current_limit.requests_per_unit,
                "unit": Response.RateLimit.Unit.Name(status.current_limit.unit),
            }
        statuses.append(entry)
    return {
        "overall_code": Response.Code.Name(response.overall_code),
        "statuses": statuses,
        "response_headers_to_add": [[h.key, h.value] for h in response.response_headers_to_add],
    }


def main():
    script = json.load(sys.stdin)
    results = []
    with grpc.insecure_channel(script["target"]) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for call in script["calls"]:
            metadata = [("authorization", "Bearer " + call["token"])] if call.get("token") else []
            deadline = time.time() + call.get("deadline_ms", 0) / 1000
            while True:
                try:
                    response = stub.ShouldRateLimit(request_of(call), metadata=metadata, timeout=20)
                    result = {"grpc": "OK", "details": "", "response": answer_of(response)}
                except grpc.RpcError as error:
                    result = {"grpc": error.code().name, "details": error.details() or "", "response": None}
                wanted = call.get("until_rule")
                if wanted is None:
                    break
                limit = (result["response"] or {"statuses": [{}]})["statuses"][0].get("current_limit")
                if limit is not None and limit["name"] == wanted:
                    result["seen_at"] = time.time()
                    break
                if time.time() > deadline:
                    break
            results.append(result)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

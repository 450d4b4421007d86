#!/usr/bin/env bash
# An independent client of Envoy's rate limit protocols for the tests (tests/it/decide.rs):
# Python's grpcio, with Envoy's own protos compiled by grpcio-tools, in a virtual environment of
# its own under target/. The protos are those the envoy-types crate ships in its package (the
# server's generated types come from the same crate, but this client is built from the .proto
# files by another compiler, so the wire format is checked against a second implementation).
# Installs what is missing; does nothing when all is there. Prints the python to run.
#
#   bash tests/grpc/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

venv="${PLEXSPHERE_GRPC_VENV:-target/grpc-venv}"
python="$venv/bin/python"
generated="$venv/rls"

if ! "$python" -c 'import grpc, grpc_tools, google.protobuf' >/dev/null 2>&1; then
    if ! python3 -m venv --help >/dev/null 2>&1; then
        echo "setup: python3 with venv is needed (Debian: apt-get install python3-venv)" >&2
        exit 1
    fi
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check grpcio grpcio-tools protobuf >&2
fi

# Where cargo unpacked the envoy-types package this workspace locks.
manifest=$(cargo metadata --format-version 1 --locked 2>/dev/null | "$python" -c '
import json, sys
packages = json.load(sys.stdin)["packages"]
print(next(p["manifest_path"] for p in packages if p["name"] == "envoy-types"))')
protos="$(dirname "$manifest")/proto"

# Compiled again whenever the package (its version is in its path) changes.
stamp="$generated/.compiled-from"
if [ ! -e "$stamp" ] || [ "$(cat "$stamp")" != "$protos" ]; then
    rm -rf "$generated"
    mkdir -p "$generated"
    well_known=$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
    includes=(-I "$protos/data-plane-api" -I "$protos/xds" -I "$protos/protoc-gen-validate"
              -I "$protos/googleapis" -I "$protos/cel-spec/proto" -I "$well_known")
    services=(envoy/service/ratelimit/v3/rls.proto envoy/service/rate_limit_quota/v3/rlqs.proto)
    # Every file the services import, transitively: Python's generated modules import theirs.
    "$python" -m grpc_tools.protoc "${includes[@]}" --include_imports \
        --descriptor_set_out="$generated/all.pb" "${services[@]}"
    mapfile -t files < <("$python" -c '
import sys
from google.protobuf import descriptor_pb2
files = descriptor_pb2.FileDescriptorSet()
files.ParseFromString(open(sys.argv[1], "rb").read())
for file in files.file:
    if not file.name.startswith("google/protobuf/"):
        print(file.name)' "$generated/all.pb")
    "$python" -m grpc_tools.protoc "${includes[@]}" --python_out="$generated" "${files[@]}"
    "$python" -m grpc_tools.protoc "${includes[@]}" --grpc_python_out="$generated" "${services[@]}"
    echo "$protos" > "$stamp"
fi
echo "$python"

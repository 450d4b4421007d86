#!/usr/bin/env bash
# An independent client of Envoy's rate limit service protocol for the tests (tests/it/decide.rs):
# Python's grpcio, with the vendored protos (crates/app/proto) compiled by grpcio-tools, in a
# virtual environment of its own under target/. Installs what is missing; does nothing when all
# is there. Prints the python to run.
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

# The protos compiled again whenever they are newer than what was generated from them.
stamp="$generated/.compiled"
if [ ! -e "$stamp" ] || [ -n "$(find crates/app/proto -name '*.proto' -newer "$stamp")" ]; then
    rm -rf "$generated"
    mkdir -p "$generated"
    well_known=$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
    (cd crates/app/proto && find envoy -name '*.proto' -print0 | xargs -0 "../../../$python" -m grpc_tools.protoc \
        -I . -I "$well_known" --python_out="../../../$generated" --grpc_python_out="../../../$generated")
    touch "$stamp"
fi
echo "$python"

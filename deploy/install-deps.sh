#!/usr/bin/env bash
# Installs every build and test dependency of Stoker from Debian 12 packages.
# Idempotent: packages already present are skipped by apt; safe to run as root
# on a fresh machine, and a no-op (apart from apt's check) on a prepared one.
set -euo pipefail

packages=(
  # Build tools.
  build-essential meson ninja-build pkg-config clang-format
  # Protocol buffers: protobuf-c code generator and runtime, protoc for descriptor sets.
  protobuf-c-compiler libprotobuf-c-dev protobuf-compiler libprotobuf-dev
  # gRPC C core, RocksDB, libuv, libcurl with OpenSSL.
  libgrpc-dev librocksdb-dev libuv1-dev libcurl4-openssl-dev libssl-dev
  # Checksums (ISA-L CRC32C), JSON, regex (GPT-2 pre-tokenizer).
  libisal-dev libcjson-dev libpcre2-dev
  # Tests: an independent gRPC client, certificates, sanitizers' runtime.
  libcmocka-dev python3 python3-grpcio python3-protobuf openssl procps
  python3-boto3 python3-yaml
  # The main job's loss plot (PNG).
  gnuplot-nox
  # The coordinator bench's simulated ranks: HTTP/2 without gRPC's client.
  libnghttp2-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# Node.js and npm run the S3 test server and the reference GPT-2 tokenizer. Any
# working node + npm will do: a machine with NodeSource's nodejs (which bundles
# npm) must not get Debian's npm, whose dependencies conflict with it.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: all ${#packages[@]} packages present"

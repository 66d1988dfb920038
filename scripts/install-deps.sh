#!/usr/bin/env bash
# Installs the Debian 12 packages that tokenselect's build and tests need. Idempotent: packages
# already installed are skipped, and nothing runs apt-get when everything is present.
# Needs root (or password-less sudo) only when something is missing.
#   scripts/install-deps.sh           install what is missing
#   scripts/install-deps.sh --check   list what is missing; exit 1 if anything is
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3
  libabsl-dev libspdlog-dev nlohmann-json3-dev libre2-dev libcpp-httplib-dev
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  python3-grpcio python3-grpc-tools python3-protobuf openssl
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev
  prometheus python3-yaml python3-jsonschema
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "deps: all ${#PACKAGES[@]} Debian packages are installed"
  exit 0
fi
echo "deps: missing: ${missing[*]}"
if [[ ${1:-} == "--check" ]]; then
  exit 1
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "deps: installing packages needs root. Run as root, or install them yourself:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "deps: installed ${#missing[@]} packages"

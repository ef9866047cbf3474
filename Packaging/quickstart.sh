#!/usr/bin/env bash
# One command from a fresh clone to a mounted container:
#   bash Packaging/quickstart.sh ~/Cloud [mount options…]
# Installs the system packages it needs to build and run (not the tests'), builds a release binary, links it as
# /usr/local/bin/ubiquityfs (when writable), and mounts the drive (the default
# container, with a folder per public container) of the default folder store
# at the given directory (created if missing).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 MOUNTPOINT [ubiquityfs mount options…]" >&2; exit 2; }
bash "$repo/Packaging/install-deps.sh" runtime build   # nothing that only the tests need
export PATH="/opt/swift/usr/bin:$PATH"
(cd "$repo" && swift build -c release)
bin="$repo/.build/release/ubiquityfs"
if [ -w /usr/local/bin ]; then ln -sf "$bin" /usr/local/bin/ubiquityfs; bin=ubiquityfs; fi
mkdir -p "$1"
exec "$bin" mount "$@"

#!/usr/bin/env bash
# The whole test suite: core tests (no kernel), then real FUSE mounts
# (POSIX conformance, real tools, durability). Needs root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
bash Packaging/install-deps.sh
export PATH="/opt/swift/usr/bin:$PATH"
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q pytest
swift build --build-tests
swift test --skip-build
python3 -m pytest -q -p no:cacheprovider Tests/posix Tests/mount "$@"

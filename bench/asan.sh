#!/usr/bin/env bash
# AddressSanitizer run of the daemon, its C code (CFuseWire, CHashLanes, CLinux)
# and the CLI over the mount tests' workload: `ubiquityfs` built with
# -sanitize=address in .build-asan, the mount tests run on it (pytest arguments
# pass through: by default the POSIX, sync, durability, recovery, drive, events,
# history and tool tests). Fails if a test fails or ASan reports anything.
# Mounts that inject faults run the plain ubiquityfs-testing (built by
# `swift build --build-tests`), which this run does not cover.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/swift/usr/bin:$PATH
reports=$(mktemp -d /tmp/ubq-asan.XXXXXX)
swift build --sanitize=address --scratch-path .build-asan --product ubiquityfs
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
    tests=(Tests/mount/test_posix_mount.py Tests/mount/test_sync.py Tests/mount/test_durability.py
           Tests/mount/test_recovery.py Tests/mount/test_drive.py Tests/mount/test_events.py
           Tests/mount/test_history.py Tests/mount/test_collector.py Tests/mount/test_tools.py
           Tests/mount/test_passthrough.py Tests/mount/test_streaming.py)
fi
status=0
UBIQUITYFS_BIN="$PWD/.build-asan/debug/ubiquityfs" \
UBIQUITYFS_TESTING_BIN="$PWD/.build/debug/ubiquityfs-testing" \
ASAN_OPTIONS="log_path=$reports/report detect_leaks=0 ${ASAN_OPTIONS:-}" \
    python3 -m pytest -q -p no:cacheprovider "${tests[@]}" || status=$?
if compgen -G "$reports/report*" >/dev/null; then
    echo "AddressSanitizer reported errors (files in $reports):" >&2
    grep -h 'ERROR: AddressSanitizer' "$reports"/report* | sort | uniq -c >&2
    exit 1
fi
echo "AddressSanitizer: no report (tests exit status $status)"
rm -rf "$reports"
exit "$status"

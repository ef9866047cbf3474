#!/usr/bin/env bash
# ThreadSanitizer run of the Swift test suites (core, daemon, stores, kit):
# built with -sanitize=thread in .build-tsan, run with every report written to
# a file. Fails if a test fails or TSan reports anything. Too long for CI (on a
# 2-core VM: about 25 min to build from scratch, 28 min to run); run it before a
# submission that touches threads or locks. S3 servers: as for Tests/run-all.sh
# (UBIQUITYFS_TEST_S3_SERVERS), optional.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/swift/usr/bin:$PATH
reports=$(mktemp -d /tmp/ubq-tsan.XXXXXX)
swift build --build-tests --sanitize=thread --scratch-path .build-tsan
status=0
TSAN_OPTIONS="log_path=$reports/report second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
    swift test --skip-build --sanitize=thread --scratch-path .build-tsan "$@" || status=$?
if compgen -G "$reports/report*" >/dev/null; then
    echo "ThreadSanitizer reported races (files in $reports):" >&2
    grep -h 'WARNING: ThreadSanitizer' "$reports"/report* | sort | uniq -c >&2
    exit 1
fi
echo "ThreadSanitizer: no report (tests exit status $status)"
rm -rf "$reports"
exit "$status"

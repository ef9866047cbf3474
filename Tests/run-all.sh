#!/usr/bin/env bash
# The whole test suite: core tests (no kernel), then real FUSE mounts
# (POSIX conformance, real tools, durability), then the same mount tests
# that matter for sync on a real S3 server. Needs root and /dev/fuse.
#
# S3 servers (SeaweedFS; Ceph RGW when its packages are installed) are
# started here on loopback by Tests/servers/s3servers.py and stopped by PID
# at the end, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
bash Packaging/install-deps.sh
export PATH="/opt/swift/usr/bin:$PATH"
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install -q pytest
python3 -m pip install -q -r Tests/requirements.txt

servers_dir="$(mktemp -d /tmp/ubq-s3-servers.XXXXXX)"
started=()
stop_servers() {
  for dir in "${started[@]}"; do python3 Tests/servers/s3servers.py stop --dir "$dir" >/dev/null 2>&1 || true; done
  rm -rf "$servers_dir"
}
trap stop_servers EXIT
servers=()
for kind in seaweedfs ceph; do
  dir="$servers_dir/$kind"
  mkdir -p "$dir"
  if [ "$kind" = ceph ] && ! command -v radosgw >/dev/null; then
    echo "run-all: Ceph RGW is not installed; its tests are not run" >&2
    continue
  fi
  started+=("$dir")
  python3 Tests/servers/s3servers.py start "$kind" --dir "$dir" >/dev/null
  servers+=("$dir/server.json")
done
export UBIQUITYFS_TEST_S3_SERVERS="$(IFS=,; echo "${servers[*]}")"

swift build --build-tests
swift test --skip-build
# The Debian package, made from the debug build above (relinked with the Swift runtime
# inside: 72 s here, where a release build takes 9-15 minutes); test_deb.py inspects it,
# installs it with apt-get, mounts through its helper and purges it.
build_dir="$(mktemp -d /tmp/ubq-deb.XXXXXX)"
trap 'stop_servers; rm -rf "$build_dir"' EXIT
bash Packaging/deb/build.sh --debug --no-lintian --out "$build_dir"
export UBQ_DEB="$(ls "$build_dir"/ubiquityfs_*.deb)"
# Installing: the package; the mount helpers (mount -t / fstab / umount), the systemd user service, the unit file.
python3 -m pytest -q -p no:cacheprovider Tests/packaging "$@"
python3 -m pytest -q -p no:cacheprovider Tests/servers Tests/posix Tests/mount "$@"
# The file manager's extension (Packaging/nautilus): a stub and the real GObject
# introspection, real mounts, and a real Nautilus under Xvfb.
python3 -m pytest -q -p no:cacheprovider Tests/nautilus "$@"
# Sync on S3: two devices, placeholders (streaming), conflicts, offline, kill -9, scopes,
# the drive, query, real tools, events, UbiquityKit, history, Recently Deleted and the collector, against the first server (SeaweedFS).
# Of the views, query and tools tests only those that cross the store: the rest test the mount,
# which the run above covers (the whole files took about 2.5 minutes more here).
UBQ_TEST_STORE=s3 python3 -m pytest -q -p no:cacheprovider \
  Tests/mount/test_sync.py Tests/mount/test_streaming.py Tests/mount/test_drive.py Tests/mount/test_durability.py \
  Tests/mount/test_views.py::test_container_configuration_is_validated_and_kept_in_the_store \
  Tests/mount/test_views.py::test_documents_scope_enforces_folder_levels_and_data_scope_hides_documents \
  Tests/mount/test_query.py::test_watch_on_one_device_follows_changes_made_on_another \
  Tests/mount/test_tools.py::test_tool_results_survive_remount_and_second_device \
  Tests/mount/test_events.py Tests/mount/test_kit.py Tests/mount/test_history.py Tests/mount/test_collector.py "$@"
# Two devices, conflicts, offline and the S3-only cases on every other server (Ceph RGW).
for server in "${servers[@]:1}"; do
  UBIQUITYFS_TEST_S3_SERVERS="$server" UBQ_TEST_STORE=s3 python3 -m pytest -q -p no:cacheprovider \
    Tests/mount/test_s3.py Tests/mount/test_sync.py "$@"
done

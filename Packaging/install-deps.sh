#!/usr/bin/env bash
# Install the Debian packages UbiquityFS needs to build, run and test.
# Idempotent; run as root (or with sudo).
set -euo pipefail
packages=(
  # build and run
  libfuse3-dev fuse3 libsqlite3-dev pkg-config
  # tests: real tools on the mount, and the peer for benchmarks
  vim git sqlite3 rsync tar attr bindfs rclone fio shared-mime-info python3
  # tests: watchers of remote changes, and the file manager's extension under a headless desktop
  inotify-tools libglib2.0-bin xvfb xauth dbus dbus-x11 python3-gi python3-nautilus gir1.2-nautilus-4.0 nautilus
  # tests: S3 servers -- Tests/servers/s3servers.py runs a throwaway one-node
  # Ceph (monitor, OSD on memstore, RADOS Gateway) on loopback; keep in sync
  # with CEPH_PACKAGES there.  SeaweedFS comes from PyPI (Tests/requirements.txt).
  ceph-mon ceph-osd radosgw ceph-common ceph-base
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ -e /dev/fuse ] || { echo "install-deps: /dev/fuse is missing; FUSE mounts cannot work here" >&2; exit 1; }

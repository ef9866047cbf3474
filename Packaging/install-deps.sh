#!/usr/bin/env bash
# Install the Debian packages UbiquityFS needs, by purpose:
#   bash Packaging/install-deps.sh [runtime] [build] [package] [test] [s3] [vm]   (no argument: all but vm)
# runtime: what the daemon needs to run; build: to compile it; package: to build
# the Debian packages (Packaging/deb/build.sh); test: the tools the tests drive
# on the mount (and bindfs for benchmarks) and those that check the packages;
# s3: the Ceph RGW test server; vm: qemu, for Packaging/deb/vm-boot-test.sh (by hand, not CI).
# Idempotent; run as root (or with sudo).
set -euo pipefail
declare -A groups=(
  [runtime]="fuse3 shared-mime-info"
  [build]="libfuse3-dev libsqlite3-dev pkg-config"
  # dpkg-deb, dpkg-shlibdeps, readelf and strip
  [package]="dpkg-dev binutils"
  # real tools on the mount, watchers of remote changes, the file manager's extension
  # under a headless desktop, the peer for benchmarks; and what checks the packages
  # (Tests/packaging: lintian, man -w, bash/zsh/fish completions, systemd-analyze verify;
  # Packaging/deb/clean-root-test.sh: debootstrap, systemd-nspawn); python3-pyfuse3 (with trio):
  # Tests/powercut/lazyfs.py, the power-cut filesystem under Tests/mount/test_powercut.py's replicas; gvfs-daemons:
  # gio's trash:/// (Recently Deleted in the mount, Tests/mount/test_history.py)
  [test]="vim git sqlite3 rsync tar attr bindfs rclone fio python3 python3-pyfuse3 inotify-tools libglib2.0-bin
          xvfb xauth dbus dbus-x11 gvfs-daemons python3-gi python3-nautilus gir1.2-nautilus-4.0 nautilus
          lintian man-db bash-completion zsh fish systemd debootstrap systemd-container"
  # Tests/servers/s3servers.py runs a throwaway one-node Ceph (monitor, OSD on memstore,
  # RADOS Gateway) on loopback; keep in sync with CEPH_PACKAGES there. SeaweedFS comes
  # from PyPI (Tests/requirements.txt).
  [s3]="ceph-mon ceph-osd radosgw ceph-common ceph-base"
  # boots the package's Debian 12 as a virtual machine, where systemd can run automount units
  [vm]="qemu-system-x86 e2fsprogs"
)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(runtime build package test s3)
packages=()
for group in "${wanted[@]}"; do
  [ -n "${groups[$group]+x}" ] || { echo "install-deps: unknown group '$group' (runtime, build, package, test, s3, vm)" >&2; exit 2; }
  read -r -a list <<< "$(echo ${groups[$group]})"
  packages+=("${list[@]}")
done
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

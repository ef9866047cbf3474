#!/usr/bin/env bash
# One command from a fresh clone to a mounted container:
#   bash Packaging/quickstart.sh [--package] ~/Cloud [mount options…]
# Installs the system packages it needs to build and run (not the tests'), builds a
# release binary and mounts the drive (the default container, with a folder per
# public container) of the default folder store at the given directory (created if
# missing).
#   without --package: links the binary as /usr/local/bin/ubiquityfs (when writable);
#     it uses the toolchain's Swift runtime (/opt/swift).
#   --package: builds the Debian package (Packaging/deb/build.sh) and installs it with
#     apt-get: /usr/bin/ubiquityfs without the toolchain, the mount(8) helpers, the
#     systemd user service, man pages and completions (docs/INSTALL.md).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
package=no
if [ "${1:-}" = --package ]; then package=yes; shift; fi
[ $# -ge 1 ] || { echo "usage: $0 [--package] MOUNTPOINT [ubiquityfs mount options…]" >&2; exit 2; }
export PATH="/opt/swift/usr/bin:$PATH"
if [ "$package" = yes ]; then
  bash "$repo/Packaging/install-deps.sh" runtime build package   # nothing that only the tests need
  bash "$repo/Packaging/deb/build.sh" --no-lintian
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  deb="$(ls -t "$repo"/.build-pkg/ubiquityfs_*.deb | head -n 1)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$deb"
  bin=/usr/bin/ubiquityfs
else
  bash "$repo/Packaging/install-deps.sh" runtime build   # nothing that only the tests need
  (cd "$repo" && swift build -c release --product ubiquityfs)
  bin="$repo/.build/release/ubiquityfs"
  if [ -w /usr/local/bin ]; then ln -sf "$bin" /usr/local/bin/ubiquityfs; bin=/usr/local/bin/ubiquityfs; fi
fi
mkdir -p "$1"
exec "$bin" mount "$@"

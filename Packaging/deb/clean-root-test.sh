#!/usr/bin/env bash
# Install the package on a clean Debian 12 without Swift, mount with it, and remove it:
#   bash Packaging/deb/clean-root-test.sh [ubiquityfs_VERSION_ARCH.deb]
# The clean system is a debootstrap'ed minimal bookworm root, made once in
# .build-pkg/bookworm-root (about 250 MB; kept for the next run: delete it for a
# fresh one), entered with chroot in a mount namespace of its own (so nothing it
# mounts outlives the test). Needs root, /dev/fuse, debootstrap (`bash
# Packaging/install-deps.sh test`) and Debian's mirror. Not part of CI: it
# downloads a system. It times `apt-get install` → a mounted drive, and checks
# that `apt-get purge` leaves none of the package's files.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
deb="${1:-$(ls -t "$repo"/.build-pkg/ubiquityfs_*.deb 2>/dev/null | head -n 1)}"
[ -f "$deb" ] || { echo "clean-root-test: no package (bash Packaging/deb/build.sh)" >&2; exit 1; }
root="$repo/.build-pkg/bookworm-root"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if [ ! -x "$root/usr/bin/apt-get" ]; then
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" "$mirror"
fi
[ ! -e "$root/opt/swift" ] || { echo "clean-root-test: $root has /opt/swift" >&2; exit 1; }
cp "$deb" "$root/tmp/"
cp /etc/resolv.conf "$root/etc/resolv.conf"
name="$(basename "$deb")"
unshare --mount --propagation private bash -euo pipefail -c '
  root="$1"; name="$2"
  mount --rbind /dev "$root/dev"
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  mount -t tmpfs run "$root/run"
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive bash -euo pipefail -c "
    apt-get update -qq
    dpkg-query -W ubiquityfs >/dev/null 2>&1 && apt-get purge -y -qq ubiquityfs >/dev/null
    echo \"clean-root-test: no Swift here: \$(ls /opt 2>/dev/null | wc -l) entries in /opt, \$(ldconfig -p | grep -c swift) Swift libraries\"
    start=\$(date +%s.%N)
    apt-get install -y -qq /tmp/$name >/tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
    installed=\$(date +%s.%N)
    mkdir -p /root/Cloud
    ubiquityfs mount /root/Cloud
    mounted=\$(date +%s.%N)
    awk -v a=\$start -v b=\$installed -v c=\$mounted \"BEGIN { printf \\\"clean-root-test: apt-get install %.1f s, then mounted after %.1f s: %.1f s in all\\n\\\", b - a, c - b, c - a }\"
    echo hello > /root/Cloud/hello.txt
    ubiquityfs status /root/Cloud | head -n 3
    ubiquityfs unmount /root/Cloud
    mkdir -p /root/Notes
    mount -t fuse.ubiquityfs default /root/Notes -o container=com.example.notes,scope=documents,cache-size=1G
    echo note > /root/Notes/n.txt
    umount /root/Notes
    man -w ubiquityfs-mount 2>/dev/null || echo \"clean-root-test: (man-db is not in a minimal root; pages are in /usr/share/man)\"
    files=\$(dpkg -L ubiquityfs)
    apt-get purge -y -qq ubiquityfs >/dev/null
    apt-get autoremove --purge -y -qq >/dev/null   # its dependencies too: the next run starts clean
    left=\$(for f in \$files; do [ -d \"\$f\" ] || [ ! -e \"\$f\" -a ! -L \"\$f\" ] || echo \"\$f\"; done)
    [ -z \"\$left\" ] || { echo \"clean-root-test: left after purge: \$left\"; exit 1; }
    echo \"clean-root-test: purged; none of its \$(echo \"\$files\" | wc -w) paths left; the data stays: \$(ls /root/.local/share/ubiquityfs | tr \"\\n\" \" \")\"
  "
' _ "$root" "$name"
rm -f "$root/tmp/$name"
echo "clean-root-test: passed"

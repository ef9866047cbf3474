#!/usr/bin/env bash
# The package under a real systemd: boots a debootstrapped Debian 12 (systemd as
# PID 1) with systemd-nspawn, with the package installed, and checks there
#   - an fstab line with setuid=alice is mounted at boot, as alice; umount waits for the pushes;
#   - a `user,noauto` line: alice's own `mount DIR` and `umount DIR`;
#   - an fstab line with x-systemd.automount mounts on first access (where systemd
#     supports automount: not in a container, where it says so and the check is skipped);
#   - the user unit: systemctl --user enable --now ubiquityfs (lingering user) mounts
#     service.conf's mountpoint, the journal has the logs, a killed daemon is restarted
#     (Restart=on-failure), systemctl --user stop unmounts after pushing.
#   bash Packaging/deb/systemd-boot-test.sh [--vm] [ubiquityfs_VERSION_ARCH.deb]
# --vm boots it as a virtual machine (qemu: install-deps vm; about 3 minutes) instead, where
# systemd also runs the automount unit.
# Needs root, /dev/fuse, debootstrap and systemd-nspawn (install-deps test), Debian's
# mirror the first time (the roots are kept in .build-pkg/bookworm-systemd and
# bookworm-vm). Not in CI.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
vm=no
if [ "${1:-}" = --vm ]; then vm=yes; shift; fi
deb="${1:-$(ls -t "$repo"/.build-pkg/ubiquityfs_*.deb 2>/dev/null | head -n 1)}"
[ -f "$deb" ] || { echo "systemd-boot-test: no package (bash Packaging/deb/build.sh)" >&2; exit 1; }
root="$repo/.build-pkg/bookworm-systemd"
[ "$vm" = no ] || root="$repo/.build-pkg/bookworm-vm"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
in_root() {
  unshare --mount --propagation private bash -c 'r="$1"; shift; mount --rbind /dev "$r/dev"; mount -t proc proc "$r/proc"
    mount -t sysfs sysfs "$r/sys"; chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"' _ "$root" "$@"
}
if [ ! -x "$root/lib/systemd/systemd" ]; then
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" "$mirror"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  in_root sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd systemd-sysv dbus libpam-systemd man-db >/dev/null'
fi
if [ "$vm" = yes ] && ! ls "$root"/boot/vmlinuz-* >/dev/null 2>&1; then
  in_root sh -c 'apt-get install -y -qq --no-install-recommends linux-image-amd64 initramfs-tools >/dev/null'
fi
cp "$deb" "$root/tmp/ubiquityfs.deb"
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root sh -c 'apt-get install -y -qq /tmp/ubiquityfs.deb >/dev/null'
in_root sh -c 'id alice >/dev/null 2>&1 || useradd -m -s /bin/bash alice; mkdir -p /home/alice/Drive /home/alice/Cloud /home/alice/Own /mnt/cloud; chown alice: /home/alice/Drive /home/alice/Cloud /home/alice/Own'
cat > "$root/etc/fstab" <<'EOF'
default  /home/alice/Drive  fuse.ubiquityfs  setuid=alice,device-name=boot,nofail  0 0
default  /mnt/cloud         fuse.ubiquityfs  x-systemd.automount,nofail  0 0
default  /home/alice/Own    fuse.ubiquityfs  user,noauto,container=com.example.own  0 0
EOF
cat > "$root/root/ubq-test.sh" <<'EOF'
#!/bin/bash
exec > /root/results.txt 2>&1
check() { if eval "$2"; then echo "PASS: $1"; else echo "FAIL: $1"; fi; }
echo "== fstab at boot"
systemctl status --no-pager home-alice-Drive.mount | head -n 6
check "mounted at boot" "findmnt -n -o FSTYPE /home/alice/Drive | grep -qx fuse.ubiquityfs"
check "as alice" "findmnt -n -o FS-OPTIONS /home/alice/Drive | grep -q user_id=$(id -u alice)"
runuser -u alice -- sh -c 'echo at-boot > /home/alice/Drive/boot.txt'
check "umount waits for the pushes" "umount /home/alice/Drive | grep -q 'every change is in the store'"
echo "== a user line (user,noauto): alice mounts and unmounts it herself"
runuser -u alice -- mount /home/alice/Own
check "alice's mount(8) mounted it" "findmnt -n -o FSTYPE /home/alice/Own | grep -qx fuse.ubiquityfs"
check "as alice, the container" "findmnt -n -o FS-OPTIONS /home/alice/Own | grep -q user_id=$(id -u alice) && runuser -u alice -- ubiquityfs status /home/alice/Own | grep -q com.example.own"
runuser -u alice -- sh -c 'echo mine > /home/alice/Own/o.txt'
check "alice's umount waits for the pushes" "runuser -u alice -- umount /home/alice/Own | grep -q 'every change is in the store'"
echo "== automount"
if systemctl status --no-pager mnt-cloud.automount 2>&1 | grep -q "Active: active"; then
  ls /mnt/cloud >/dev/null &
  lister=$!
  sleep 8
  if kill -0 "$lister" 2>/dev/null; then
    # Still waiting: where each process of the mount is (for whoever reads the failure).
    for dir in /proc/[0-9]*; do
      grep -qa -e ubiquityfs -e mount.fuse "$dir/cmdline" 2>/dev/null || continue
      echo "-- ${dir#/proc/} $(tr '\0' ' ' < "$dir/cmdline")"
      for task in "$dir"/task/*; do echo "  task ${task##*/} $(cat "$task/comm")"; head -n 6 "$task/stack" 2>/dev/null | sed 's/^/    /'; done
    done
    tail -n 8 /root/.local/share/ubiquityfs/replicas/*/daemon.log 2>/dev/null
  fi
  wait "$lister"
  check "first access mounted fuse.ubiquityfs" "findmnt -n -o FSTYPE /mnt/cloud | tail -n 1 | grep -qx fuse.ubiquityfs"
  journalctl --no-pager -u mnt-cloud.mount | tail -n 6
  check "umount waits for the pushes" "umount /mnt/cloud | grep -q 'every change is in the store'"
else
  echo "SKIP: systemd does not run mnt-cloud.automount here (in a container it says: Starting of mnt-cloud.automount unsupported)"
fi
echo "== user service"
uid=$(id -u alice)
mkdir -p /home/alice/.config/ubiquityfs
echo "~/Cloud" > /home/alice/.config/ubiquityfs/service.conf
chown -R alice: /home/alice
loginctl enable-linger alice
for i in $(seq 1 50); do [ -S /run/user/$uid/bus ] && break; sleep 0.2; done
as_alice() { runuser -u alice -- env XDG_RUNTIME_DIR=/run/user/$uid DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/$uid/bus "$@"; }
start=$(date +%s.%N)
as_alice systemctl --user enable --now ubiquityfs
end=$(date +%s.%N)
awk -v a=$start -v b=$end 'BEGIN { printf "systemctl --user enable --now took %.1f s\n", b - a }'
as_alice systemctl --user status --no-pager ubiquityfs | head -n 12
check "the service is active" "as_alice systemctl --user is-active ubiquityfs | grep -qx active"
check "~/Cloud is mounted" "findmnt -n -o FSTYPE /home/alice/Cloud | grep -qx fuse.ubiquityfs"
as_alice sh -c 'echo from-the-service > ~/Cloud/s.txt'
pid=$(findmnt -n -o SOURCE /home/alice/Cloud | cut -d: -f2)
sleep 1
check "the journal has the daemon's log" "journalctl --no-pager _UID=$uid | grep -q 'ubiquityfs'"
journalctl --no-pager _UID=$uid | grep -i ubiquityfs | tail -n 8
kill -9 "$pid"
sleep 2
as_alice systemctl --user status --no-pager ubiquityfs | head -n 5
sleep 12
check "restarted after the daemon died" "as_alice systemctl --user is-active ubiquityfs | grep -qx active && findmnt -n -o FSTYPE /home/alice/Cloud | grep -qx fuse.ubiquityfs"
check "the file is there after the restart" "as_alice cat /home/alice/Cloud/s.txt | grep -qx from-the-service"
as_alice systemctl --user stop ubiquityfs
check "stop unmounted it" "! findmnt /home/alice/Cloud >/dev/null"
check "stop pushed first" "journalctl --no-pager _UID=$uid | grep -q 'every change is in the store'"
journalctl --no-pager _UID=$uid | grep -i "ubiquityfs\[" | tail -n 6
echo DONE
systemctl poweroff
EOF
chmod +x "$root/root/ubq-test.sh"
cat > "$root/etc/systemd/system/ubq-test.service" <<'EOF'
[Unit]
Description=UbiquityFS package test
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/root/ubq-test.sh
[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/ubq-test.service "$root/etc/systemd/system/multi-user.target.wants/ubq-test.service"
rm -f "$root/root/results.txt"
if [ "$vm" = yes ]; then
  # The root as an ext4 disk; the guest's own kernel; results read back from the disk.
  img="$repo/.build-pkg/bookworm-vm.img"
  rm -f "$img"
  mke2fs -q -t ext4 -d "$root" "$img" 3G
  kernel="$(ls "$root"/boot/vmlinuz-* | tail -n 1)"
  initrd="$(ls "$root"/boot/initrd.img-* | tail -n 1)"
  # TCG by default: KVM nested in this VM hung before the kernel printed anything (UBQ_VM_ACCEL=kvm to try it)
  accel="${UBQ_VM_ACCEL:-tcg}"
  timeout "${UBQ_VM_TIMEOUT:-900}" qemu-system-x86_64 -accel "$accel" -cpu max -m 2048 -smp 2 -nographic -no-reboot -kernel "$kernel" -initrd "$initrd" \
    -append "root=/dev/vda rw console=ttyS0 earlyprintk=serial panic=-1" -drive "file=$img,format=raw,if=virtio" \
    > "$repo/.build-pkg/systemd-boot.log" 2>&1 || true
  debugfs -R "cat /root/results.txt" "$img" > "$root/root/results.txt" 2>/dev/null || true
  [ -s "$root/root/results.txt" ] || rm -f "$root/root/results.txt"
else
# No systemd on the host: no registration with machined, and a tmpfs for nspawn's
# propagation folder (it refuses to clean one on a disk), in a mount namespace of our own.
mkdir -p /run/systemd/nspawn
timeout 300 unshare --mount --propagation private sh -c 'mount -t tmpfs nspawn /run/systemd/nspawn && exec systemd-nspawn --quiet --register=no --keep-unit -D "$1" --bind=/dev/fuse -b' _ "$root" \
  > "$repo/.build-pkg/systemd-boot.log" 2>&1 || true
fi
cat "$root/root/results.txt" 2>/dev/null || { echo "systemd-boot-test: no results; the boot log:"; tail -n 30 "$repo/.build-pkg/systemd-boot.log"; exit 1; }
! grep -q '^FAIL' "$root/root/results.txt" && grep -q '^DONE' "$root/root/results.txt"

#!/usr/bin/env bash
# Install (or remove) the UbiquityFS file-manager extension and its emblems.
#
#   install.sh [--user | --system | --prefix P] [--file-manager nautilus|nemo|caja|all] [--uninstall]
#
#   --user      (default) for you alone, no root needed:
#                 ${XDG_DATA_HOME:-~/.local/share}/nautilus-python/extensions/ubiquityfs_nautilus.py
#                 ${XDG_DATA_HOME:-~/.local/share}/icons/hicolor/scalable/emblems/emblem-ubiquityfs-*.svg
#   --system    for every user (root): /usr/share/nautilus-python/extensions, /usr/share/icons/hicolor
#   --prefix P  P/share/nautilus-python/extensions and P/share/icons/hicolor (e.g. /usr/local; a
#               file manager finds them when P/share is in XDG_DATA_DIRS)
#   --file-manager  nautilus (default; python3-nautilus), nemo (nemo-python), caja (python-caja),
#               or all: the extension goes to each one's python extension folder
#   --uninstall remove what the same options installed
#
# Then restart the file manager (`nautilus -q`). Needs python3-nautilus (nautilus-python 4.0,
# Nautilus 43+) and gir1.2-nautilus-4.0, and `ubiquityfs` on PATH, in ~/.local/bin, or named by
# UBIQUITYFS_BIN in the file manager's environment.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode=user prefix="" uninstall=0 managers=(nautilus)

usage() { sed -n '2,20s/^# \{0,1\}//p' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --user) mode=user ;;
    --system) mode=system ;;
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a folder" >&2; exit 64; }
              mode=prefix prefix="$2"; shift ;;
    --prefix=*) mode=prefix prefix="${1#--prefix=}" ;;
    --file-manager) [ $# -ge 2 ] || { echo "install.sh: --file-manager needs a name" >&2; exit 64; }
                    case "$2" in
                      nautilus|nemo|caja) managers=("$2") ;;
                      all) managers=(nautilus nemo caja) ;;
                      *) echo "install.sh: unknown file manager '$2' (nautilus, nemo, caja or all)" >&2; exit 64 ;;
                    esac
                    shift ;;
    --uninstall) uninstall=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage >&2; exit 64 ;;
  esac
  shift
done

case "$mode" in
  user) share="${XDG_DATA_HOME:-${HOME:?HOME is not set}/.local/share}" ;;
  system) share=/usr/share ;;
  prefix) [ -n "$prefix" ] || { echo "install.sh: empty --prefix" >&2; exit 64; }
          share="${prefix%/}/share" ;;
esac
icons="$share/icons/hicolor"
emblems="$icons/scalable/emblems"

refresh_icon_cache() {
  # Only a theme folder that already has a cache needs it rebuilt (GTK ignores a stale cache
  # for the folders changed after it, but rebuilding keeps lookups fast).
  if [ -f "$icons/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null; then
    gtk-update-icon-cache -q -f -t "$icons" || true
  fi
}

for fm in "${managers[@]}"; do
  extdir="$share/$fm-python/extensions"
  if [ "$uninstall" = 1 ]; then
    rm -f "$extdir/ubiquityfs_nautilus.py"
    rm -rf "$extdir/__pycache__/ubiquityfs_nautilus."*
    echo "removed $extdir/ubiquityfs_nautilus.py"
  else
    install -d -m 0755 "$extdir"
    install -m 0644 "$here/ubiquityfs_nautilus.py" "$extdir/ubiquityfs_nautilus.py"
    echo "installed $extdir/ubiquityfs_nautilus.py"
  fi
done

if [ "$uninstall" = 1 ]; then
  rm -f "$emblems"/emblem-ubiquityfs-*.svg
  echo "removed $emblems/emblem-ubiquityfs-*.svg"
else
  install -d -m 0755 "$emblems"
  install -m 0644 "$here"/icons/hicolor/scalable/emblems/emblem-ubiquityfs-*.svg "$emblems/"
  echo "installed $(ls "$here"/icons/hicolor/scalable/emblems | wc -l) emblems in $emblems"
fi
refresh_icon_cache
if [ "$uninstall" = 0 ]; then
  echo "restart the file manager to load it: nautilus -q"
fi

#!/usr/bin/env bash
# Build the Debian packages from this checkout:
#   ubiquityfs_VERSION_ARCH.deb         the command (static Swift runtime), mount(8) helpers,
#                                        systemd user unit, man pages, shell completions
#   ubiquityfs-nautilus_VERSION_all.deb  the Nautilus extension (emblems and menu)
#
#   bash Packaging/deb/build.sh [--out DIR] [--no-lintian] [--debug]
#
# --debug packages the debug build the tests use (.build/debug, relinked with
# the Swift runtime inside: seconds instead of a release build's minutes). CI
# does that (Tests/run-all.sh) to check the packaging end to end; what users
# get is the release build.
#
# Needs the Swift toolchain (/opt/swift) and the build and package tools:
# `bash Packaging/install-deps.sh build package`. The first build takes about
# 15 minutes on 2 cores (most of it compiling the vendored BoringSSL twice, for
# swift-crypto and for swift-nio-ssl); later ones only what changed. It builds
# in .build-release (never .build). Environment: DEB_VERSION (default: the
# version `ubiquityfs --version` says), DEB_MAINTAINER (default: the last
# commit's author), SOURCE_DATE_EPOCH (default: the last commit's date).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
here="$repo/Packaging"
out="$repo/.build-pkg"
lintian=yes
config=release
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    --no-lintian) lintian=no; shift ;;
    --debug) config=debug; shift ;;
    -h|--help) sed -n '2,22s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument '$1'" >&2; exit 64 ;;
  esac
done
export PATH="/opt/swift/usr/bin:$PATH"
for tool in swift dpkg-deb dpkg-shlibdeps readelf strip gzip; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool is missing (bash Packaging/install-deps.sh build package)" >&2; exit 1; }
done
cd "$repo"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
maintainer="${DEB_MAINTAINER:-$(git log -1 --format='%an <%ae>' 2>/dev/null || echo 'UbiquityFS maintainers <root@localhost>')}"
arch="$(dpkg --print-architecture)"
start=$SECONDS

# 1. The binary, with the Swift runtime and Foundation linked in.
if [ "$config" = release ]; then
  scratch="$repo/.build-release"
  echo "build.sh: swift build -c release --static-swift-stdlib"
  swift build -c release --static-swift-stdlib --scratch-path "$scratch" --product ubiquityfs -Xlinker -z -Xlinker now
else
  # A debug link does not put Foundation's static archives in an order that
  # resolves (undefined ICU, CShims and CoreFoundation symbols); name them, each
  # before what it uses. The next plain `swift build` links it dynamically again.
  scratch="$repo/.build"
  foundation=()
  for lib in Foundation CoreFoundation FoundationInternationalization FoundationEssentials \
             _FoundationICU _FoundationCShims _FoundationCollections swiftDispatch dispatch BlocksRuntime; do
    foundation+=(-Xlinker "-l$lib")
  done
  echo "build.sh: swift build --static-swift-stdlib (debug)"
  swift build --static-swift-stdlib --scratch-path "$scratch" --product ubiquityfs -Xlinker -z -Xlinker now "${foundation[@]}"
fi
bin="$scratch/$config/ubiquityfs"
if readelf -d "$bin" | grep -E 'NEEDED.*\[(libswift|libFoundation|lib_Foundation|libdispatch|libBlocksRuntime)'; then
  echo "build.sh: $bin still needs the Swift runtime (above)" >&2; exit 1
fi
version="${DEB_VERSION:-$("$bin" --version | awk '{print $2}')}"
echo "build.sh: version $version ($commit), $arch"

# 2. Man pages: swift-argument-parser's generate-manual, the tool its
#    `generate-manual` plugin runs (the plugin would first rebuild every product
#    without --static-swift-stdlib, recompiling all Swift modules twice per run).
#    Built from the resolved checkout, in a scratch folder of its own.
echo "build.sh: man pages (swift-argument-parser's generate-manual)"
sap="$repo/.build-pkg/swift-argument-parser"
rm -rf "$sap"
mkdir -p "$sap"
tar -C "$scratch/checkouts/swift-argument-parser" --exclude=.git -cf - . | tar -C "$sap" -xf -
swift build --package-path "$sap" --scratch-path "$repo/.build-pkg/argument-parser-build" -c release \
  --product generate-manual > "$repo/.build-pkg/generate-manual.log" 2>&1 \
  || { tail -n 30 "$repo/.build-pkg/generate-manual.log" >&2; exit 1; }
manuals="$repo/.build-pkg/manuals"
rm -rf "$manuals"
mkdir -p "$manuals"
"$repo/.build-pkg/argument-parser-build/release/generate-manual" "$bin" --multi-page \
  --date "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" --authors "$maintainer" --output-directory "$manuals"
rm -f "$manuals/ubiquityfs.help.1"   # `ubiquityfs help` is --help; no page

stage="$(mktemp -d /tmp/ubiquityfs-deb.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
root="$stage/ubiquityfs"
install -d -m 0755 "$root/DEBIAN" "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib/systemd/user" \
  "$root/usr/share/man/man1" "$root/usr/share/man/man8" "$root/usr/share/doc/ubiquityfs" \
  "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
  "$root/usr/share/fish/vendor_completions.d"
install -m 0755 "$bin" "$root/usr/bin/ubiquityfs"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/ubiquityfs"
install -m 0755 "$here/mount/mount.fuse.ubiquityfs" "$here/mount/umount.fuse.ubiquityfs" "$root/usr/sbin/"
ln -s mount.fuse.ubiquityfs "$root/usr/sbin/mount.ubiquityfs"
ln -s umount.fuse.ubiquityfs "$root/usr/sbin/umount.ubiquityfs"
install -m 0644 "$here/systemd/ubiquityfs.service" "$root/usr/lib/systemd/user/"

# Man pages: the command and each subcommand, named as Debian does (ubiquityfs-mount(1),
# ubiquityfs-container-create(1); the tool names them ubiquityfs.mount), the helpers (8).
for page in "$manuals"/*.1; do
  name="$(basename "$page" .1)"
  # NAME says ubiquityfs-mount (what whatis and man -k find), SYNOPSIS the command, "ubiquityfs mount".
  title="$(sed -n -E 's/^\.Nm "([^"]+)"$/\1/p' "$page" | head -n 1)"
  if [ -n "$title" ]; then
    naming=(-e "0,/^\.Nm \"$title\"\$/s//.Nm ${title// /-}/" -e "s/^\.Nm\$/.Nm \"$title\"/")
  else
    naming=(-e '')
  fi
  sed -E '/^\.Xr ubiquityfs\.help /d; /^\.Xr /{:a; s/^(\.Xr [a-z-]+)\.([a-z])/\1-\2/; ta}; /^\.Dt /{:b; s/^(\.Dt [A-Z-]+)\.([A-Z])/\1-\2/; tb}' "$page" \
    | sed "${naming[@]}" | gzip -9n > "$root/usr/share/man/man1/${name//./-}.1.gz"
done
for page in "$here"/mount/*.8; do gzip -9n < "$page" > "$root/usr/share/man/man8/$(basename "$page").gz"; done
ln -s mount.fuse.ubiquityfs.8.gz "$root/usr/share/man/man8/mount.ubiquityfs.8.gz"
ln -s mount.fuse.ubiquityfs.8.gz "$root/usr/share/man/man8/umount.fuse.ubiquityfs.8.gz"
ln -s mount.fuse.ubiquityfs.8.gz "$root/usr/share/man/man8/umount.ubiquityfs.8.gz"

# Completions in the shells' vendor folders.
"$bin" --generate-completion-script bash | sed '1{/^#!/d}' > "$root/usr/share/bash-completion/completions/ubiquityfs"
"$bin" --generate-completion-script zsh > "$root/usr/share/zsh/vendor-completions/_ubiquityfs"
"$bin" --generate-completion-script fish > "$root/usr/share/fish/vendor_completions.d/ubiquityfs.fish"
chmod 0644 "$root"/usr/share/*/completions/* "$root"/usr/share/zsh/vendor-completions/* "$root"/usr/share/fish/vendor_completions.d/*

# copyright (machine-readable) and changelog.
bash "$here/deb/copyright.sh" "$scratch/checkouts" "$maintainer" > "$root/usr/share/doc/ubiquityfs/copyright"
changelog() {   # package
  printf '%s (%s) unstable; urgency=medium\n\n  * Built from commit %s of the UbiquityFS repository.\n\n -- %s  %s\n' \
    "$1" "$version" "$commit" "$maintainer" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")"
}
changelog ubiquityfs | gzip -9n > "$root/usr/share/doc/ubiquityfs/changelog.gz"

# Depends: what the binary links (dpkg-shlibdeps reads debian/control), plus the
# programs and data it uses at run time.
mkdir -p "$stage/src/debian"
printf 'Source: ubiquityfs\n\nPackage: ubiquityfs\nArchitecture: any\n' > "$stage/src/debian/control"
shlibs="$(cd "$stage/src" && dpkg-shlibdeps -O "$root/usr/bin/ubiquityfs" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')"
[ -n "$shlibs" ] || { echo "build.sh: dpkg-shlibdeps found no libraries" >&2; exit 1; }
size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
cat > "$root/DEBIAN/control" <<EOF
Package: ubiquityfs
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $shlibs, fuse3, shared-mime-info
Suggests: ubiquityfs-nautilus
Section: utils
Priority: optional
Description: synced containers mounted as ordinary folders (iCloud Documents for Linux)
 UbiquityFS mounts a synced container - a folder store or an S3 bucket shared
 by several devices - as an ordinary directory through FUSE. Everything done
 on the mount is committed to a local replica at once and pushed to the store;
 other devices' changes appear as placeholders that download when opened.
 .
 This package has the ubiquityfs command (mount, unmount, status, download,
 evict, pin, query, versions, resolve), the mount(8) helpers for fstab lines
 of type fuse.ubiquityfs, and the systemd user service that mounts this
 device's remembered mounts at login.
EOF
install -d -m 0755 "$root/usr/share/lintian/overrides"
install -m 0644 "$here/deb/lintian-overrides" "$root/usr/share/lintian/overrides/ubiquityfs"
(cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"

# The Nautilus extension: a package of its own, so that the command does not
# bring Nautilus and Python with it onto servers.
nroot="$stage/ubiquityfs-nautilus"
install -d -m 0755 "$nroot/DEBIAN" "$nroot/usr/share/doc/ubiquityfs-nautilus"
bash "$here/nautilus/install.sh" --prefix "$nroot/usr" >/dev/null
rm -f "$nroot/usr/share/icons/hicolor/icon-theme.cache"
cp "$root/usr/share/doc/ubiquityfs/copyright" "$nroot/usr/share/doc/ubiquityfs-nautilus/copyright"
changelog ubiquityfs-nautilus | gzip -9n > "$nroot/usr/share/doc/ubiquityfs-nautilus/changelog.gz"
cat > "$nroot/DEBIAN/control" <<EOF
Package: ubiquityfs-nautilus
Version: $version
Architecture: all
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$nroot" | cut -f1)
Depends: ubiquityfs (= $version), python3-nautilus, gir1.2-nautilus-4.0, python3-gi
Enhances: nautilus
Section: gnome
Priority: optional
Description: UbiquityFS sync emblems and menu for Nautilus
 Shows the sync state of files on UbiquityFS mounts in the Nautilus file
 manager (placeholder, downloading, downloaded, pinned, uploading, conflict,
 error) and adds Download now, Free up space, Keep on this device, Resolve
 conflict and Show versions to the context menu.
EOF
(cd "$nroot" && find usr -type f -print0 | sort -z | xargs -0 md5sum) > "$nroot/DEBIAN/md5sums"
chmod 0644 "$nroot/DEBIAN/control" "$nroot/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/ubiquityfs_${version}_${arch}.deb"
ndeb="$out/ubiquityfs-nautilus_${version}_all.deb"
find "$root" "$nroot" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
dpkg-deb --root-owner-group -Zxz --build "$nroot" "$ndeb" >/dev/null
echo "build.sh: built in $((SECONDS - start)) s:"
ls -l "$deb" "$ndeb"
if [ "$lintian" = yes ]; then
  if command -v lintian >/dev/null; then
    lintian --info --display-info "$deb" "$ndeb" || true   # each tag is explained in Packaging/deb/README.md
  else
    echo "build.sh: lintian is not installed (bash Packaging/install-deps.sh package)" >&2
  fi
fi

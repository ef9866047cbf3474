#!/usr/bin/env bash
# Print the package's machine-readable copyright file (DEP-5): UbiquityFS itself,
# and each library the static binary carries (the Swift runtime and Foundation,
# the Swift packages in Package.resolved, BoringSSL vendored in two of them).
#   copyright.sh CHECKOUTS_DIR "MAINTAINER <EMAIL>"
set -euo pipefail
checkouts="$1"
maintainer="$2"
cat <<HEADER
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: ubiquityfs
Upstream-Contact: $maintainer
Comment: The ubiquityfs binary is linked with the Swift standard library,
 Foundation and Dispatch statically (swift build --static-swift-stdlib), and
 with the Swift packages below; their licenses are listed here.

Files: *
Copyright: 2025-$(date -u +%Y) $maintainer
License: UbiquityFS
 The UbiquityFS repository does not state a license yet. Until it does, this
 package may be used as its authors allowed you to; it must not be uploaded
 to an archive.
HEADER
# The binary: UbiquityFS with everything it is linked with statically.
holders=""
components=""
for dir in "$checkouts"/*/; do
  name="$(basename "$dir")"
  file="$(ls "$dir" | grep -i -m1 '^licen[sc]e' || true)"
  [ -n "$file" ] || continue
  if grep -q 'Apache License' "$dir/$file"; then license="Apache-2.0"
  elif grep -q 'Permission is hereby granted, free of charge' "$dir/$file"; then license="Expat"
  else license="see its $file"; fi
  components="$components\n $name: $license"
  if [ "$license" = Expat ]; then
    holders="$holders\n $(grep -m1 -i '^copyright' "$dir/$file" | sed 's/^[Cc]opyright[[:space:]]*//')"
  fi
done
printf '\nFiles: usr/bin/ubiquityfs\nCopyright: 2025-%s %s\n Apple Inc. and the Swift project authors%b\n The BoringSSL Authors; The OpenSSL Project Authors\n' "$(date -u +%Y)" "$maintainer" "$holders"
printf 'License: UbiquityFS and Apache-2.0 and Apache-2.0-with-RLE and Expat and ISC\n'
printf 'Comment: Linked in statically:\n the Swift standard library, Foundation and Dispatch: Apache-2.0-with-RLE%b\n BoringSSL (vendored in swift-crypto and swift-nio-ssl): ISC and Apache-2.0\n' "$components"
cat <<'LICENSES'

License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the "License"); you may not
 use this file except in compliance with the License. You may obtain a copy of
 the License at https://www.apache.org/licenses/LICENSE-2.0
 .
 On Debian systems, the complete text of the Apache License 2.0 can be found
 in /usr/share/common-licenses/Apache-2.0.

License: Apache-2.0-with-RLE
 The Apache License 2.0 (see above), with this exception:
 .
 As an exception, if you use this Software to compile your source code and
 portions of this Software are embedded into the binary product as a result,
 you may redistribute such product without providing attribution as would
 otherwise be required by Sections 4(a), 4(b) and 4(d) of the License.

License: Expat
 Permission is hereby granted, free of charge, to any person obtaining a copy
 of this software and associated documentation files (the "Software"), to deal
 in the Software without restriction, including without limitation the rights
 to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
 copies of the Software, and to permit persons to whom the Software is
 furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in
 all copies or substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
 AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
 OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
 SOFTWARE.

License: ISC
 Permission to use, copy, modify, and/or distribute this software for any
 purpose with or without fee is hereby granted, provided that the above
 copyright notice and this permission notice appear in all copies.
 .
 THE SOFTWARE IS PROVIDED "AS IS" AND THE AUTHOR DISCLAIMS ALL WARRANTIES
 WITH REGARD TO THIS SOFTWARE INCLUDING ALL IMPLIED WARRANTIES OF
 MERCHANTABILITY AND FITNESS. IN NO EVENT SHALL THE AUTHOR BE LIABLE FOR ANY
 SPECIAL, DIRECT, INDIRECT, OR CONSEQUENTIAL DAMAGES OR ANY DAMAGES
 WHATSOEVER RESULTING FROM LOSS OF USE, DATA OR PROFITS, WHETHER IN AN ACTION
 OF CONTRACT, NEGLIGENCE OR OTHER TORTIOUS ACTION, ARISING OUT OF OR IN
 CONNECTION WITH THE USE OR PERFORMANCE OF THIS SOFTWARE.
LICENSES

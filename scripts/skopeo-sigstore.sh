#!/usr/bin/env bash
# An independent verifier of cosign signatures for the signing tests: Debian trixie's skopeo.
#
# Bookworm's skopeo 1.9.3 cannot verify sigstore signatures: Debian patched it out of
# containers/image 5.23 ("Debian-local change: sigstore disabled"), since the sigstore Go
# libraries were not packaged then. Trixie's skopeo 1.18 (containers/image 5.34) verifies them,
# but needs trixie's glibc; so its package and the libraries it links are unpacked into
# $DEST and run through trixie's own dynamic loader, touching nothing on the host.
# Prints the path of the wrapper it writes ($DEST/skopeo).
set -euo pipefail
DEST="${ENVBUILD_SKOPEO_SIGSTORE_DIR:-/opt/envbuild/skopeo-trixie}"
PACKAGES=(skopeo libc6 libgpgme11t64 libassuan9 libgpg-error0 libsqlite3-0)
if [ -x "$DEST/skopeo" ] && "$DEST/skopeo" --version >/dev/null 2>&1; then
  echo "$DEST/skopeo"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
  > "$work/trixie.list"
apt=(-q -o "Dir::Etc::sourcelist=$work/trixie.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$work/lists"
     -o APT::Sandbox::User=root)
apt-get "${apt[@]}" update >/dev/null
(cd "$work/debs" && apt-get "${apt[@]}" download "${PACKAGES[@]}" >/dev/null)
rm -rf "$DEST.new"
mkdir -p "$DEST.new"
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$DEST.new/root"; done
cat > "$DEST.new/skopeo" <<WRAPPER
#!/bin/sh
# Debian trixie's skopeo on its own glibc (scripts/skopeo-sigstore.sh).
lib="$DEST/root/usr/lib/x86_64-linux-gnu"
exec "\$lib/ld-linux-x86-64.so.2" --library-path "\$lib" "$DEST/root/usr/bin/skopeo" "\$@"
WRAPPER
chmod +x "$DEST.new/skopeo"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
"$DEST/skopeo" --version >/dev/null
echo "$DEST/skopeo"

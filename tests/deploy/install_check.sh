#!/usr/bin/env bash
# `meson install` ships what an operator and a trainer need, and the
# installed libstoker-client works on its own: installs the build into a
# temporary DESTDIR, checks the programs, headers, pkg-config file, example
# configs and systemd units are there (units naming this prefix's paths),
# that the installed headers name no protobuf-c types and no internal
# headers, that the shared library has its soname and exports exactly the
# stk_* functions of those headers, then builds install_smoke.c with nothing
# but `pkg-config --cflags --libs stoker-client` and runs it against the
# installed library.
#
# Usage: install_check.sh MESON BUILD_DIR SMOKE_C CC PREFIX BINDIR LIBDIR
#          INCLUDEDIR DATADIR SYSCONFDIR UNIT_DIR SONAME SANITIZE
# Directories as meson's options (relative to PREFIX, or absolute);
# SANITIZE is b_sanitize ("none", or what the library was built with).
set -euo pipefail
export LC_ALL=C
meson=$1 build=$2 smoke=$3 cc=$4 prefix=$5 bindir=$6 libdir=$7 includedir=$8
datadir=$9 sysconfdir=${10} unitdir=${11} soname=${12} sanitize=${13}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest
fail() { echo "FAIL: $*" >&2; exit 1; }
abs() { case $1 in /*) echo "$1" ;; *) echo "$prefix/$1" ;; esac; }
bin=$(abs "$bindir") lib=$(abs "$libdir") inc=$(abs "$includedir")
data=$(abs "$datadir") etc=$(abs "$sysconfdir") units=$(abs "$unitdir")

"$meson" install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "meson install --destdir"; }
echo "ok   meson install into DESTDIR"

# 1. What is installed where.
for p in stoker-coordinator stoker-dataloader stoker-checkpoint stokerctl stoker-train; do
  [ -x "$dest$bin/$p" ] || fail "$bin/$p not installed"
done
for h in stoker_client.h stoker_loader.h stoker_ckpt.h stoker_error.h; do
  [ -f "$dest$inc/stoker/$h" ] || fail "$inc/stoker/$h not installed"
done
[ ! -e "$dest$inc/stoker/stoker_admin.h" ] || fail "the internal stoker_admin.h is installed"
[ -f "$dest$lib/pkgconfig/stoker-client.pc" ] || fail "stoker-client.pc not installed"
so=$dest$lib/$soname
[ -f "$so" ] || fail "$lib/$soname not installed"
[ -e "$dest$lib/libstoker-client.so" ] || fail "$lib/libstoker-client.so (link) not installed"
for c in coordinator dataloader checkpoint; do
  [ -f "$dest$data/stoker/examples/$c.conf" ] || fail "$data/stoker/examples/$c.conf not installed"
  u=$dest$units/stoker-$c.service
  [ -f "$u" ] || fail "$units/stoker-$c.service not installed"
  grep -q "^ExecStart=$bin/stoker-$c --config $etc/stoker/$c.conf " "$u" ||
    fail "stoker-$c.service does not start $bin/stoker-$c with $etc/stoker/$c.conf"
  ! grep -n '@[A-Z_]*@' "$u" || fail "stoker-$c.service has an unreplaced @VAR@"
done
echo "ok   programs, library, headers, pkg-config file, example configs and units installed"

# 2. The installed headers stand alone: no protobuf-c, no internal header,
# each compiles by itself (comments are stripped before looking at names).
mkdir "$tmp/code"
for h in "$dest$inc"/stoker/*.h; do
  "$cc" -x c -fpreprocessed -dD -E -P "$h" >"$tmp/code/${h##*/}" || fail "cannot read $h"
  "$cc" -x c -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$dest$inc/stoker" "$h" ||
    fail "${h##*/} does not compile on its own"
done
if grep -nE 'pb-c\.h|protobuf|Stoker__|STOKER__|Grpc__|"rpc\.h"|stk_error\.h' "$tmp"/code/*.h; then
  fail "an installed header names protobuf-c types or internal headers"
fi
grep -h '^#include' "$tmp"/code/*.h | while read -r _ name; do
  case $name in
    \<*\>) ;;
    *) [ -f "$dest$inc/stoker/${name//\"/}" ] || fail "installed header includes $name" ;;
  esac
done
echo "ok   installed headers compile alone and name only stk_ types and installed headers"

# 3. The shared library: soname, and exactly the functions of the headers.
# (Outputs are captured first: `grep -q` leaving a pipe early would fail it.)
dyn=$(readelf -d "$so")
grep -q "(SONAME).*\[$soname\]" <<<"$dyn" || fail "$soname: soname not set to $soname"
nm -D --defined-only "$so" | awk '{print $3}' | sed 's/@.*//' | sort -u >"$tmp/exported"
node=$(head -1 "$tmp/exported")
[[ $node == STOKER_CLIENT_* ]] || fail "no STOKER_CLIENT_* version node (first symbol: $node)"
grep -v '^STOKER_CLIENT_' "$tmp/exported" >"$tmp/exported_fns" || true
if grep -v '^stk_' "$tmp/exported_fns"; then fail "$soname exports names outside stk_*"; fi
cat "$tmp"/code/*.h | grep -oE '\bstk_[a-z0-9_]+\(' | tr -d '(' | sort -u >"$tmp/declared"
if ! diff -u "$tmp/declared" "$tmp/exported_fns"; then
  fail "exported symbols (+) differ from the functions the installed headers declare (-)"
fi
echo "ok   $soname: soname set, exports the $(wc -l <"$tmp/exported_fns") stk_* functions of the headers, version node $node"

# 4. A trainer builds with pkg-config alone and runs against the installed library.
export PKG_CONFIG_PATH=$dest$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
flags=$(pkg-config --cflags --libs stoker-client) || fail "pkg-config stoker-client"
echo "     pkg-config --cflags --libs stoker-client: $flags"
san=()
[ "$sanitize" = none ] || san=(-fsanitize="$sanitize")
# shellcheck disable=SC2086 # $flags is a list of words.
"$cc" -std=c11 -Wall -Wextra -Werror -pedantic "${san[@]}" -o "$tmp/smoke" "$smoke" $flags ||
  fail "install_smoke.c does not build against the installed library"
deps=$(LD_LIBRARY_PATH=$dest$lib ldd "$tmp/smoke")
grep -q "$soname => $dest$lib/$soname" <<<"$deps" ||
  fail "smoke program does not resolve $soname to the installed copy"
LD_LIBRARY_PATH=$dest$lib "$tmp/smoke" || fail "smoke program against the installed library"
echo "ok   a program built with pkg-config runs against the installed library"

#!/bin/sh
# Installs the C library under PREFIX (default /usr/local):
#   PREFIX/lib/libbpfmaps.so, PREFIX/lib/libbpfmaps.a,
#   PREFIX/include/bpfmaps.h, PREFIX/include/bpfmaps/libbpf_compat.h,
#   PREFIX/lib/pkgconfig/bpfmaps.pc
# then `cc prog.c $(pkg-config --cflags --libs bpfmaps)` (add --static to
# link the static library). It builds the library first with
# `cargo build --release -p bpfmaps-c`, unless BPFMAPS_LIB_DIR names a
# directory that already holds it (the C tests install what they built).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-/usr/local}
if [ -z "${BPFMAPS_LIB_DIR:-}" ]; then
    cargo build --release -p bpfmaps-c --manifest-path "$here/cdylib/Cargo.toml"
    BPFMAPS_LIB_DIR=$(cd "$here/../.." && pwd)/target/release
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$here/../../Cargo.toml" | head -n 1)

mkdir -p "$prefix/lib/pkgconfig" "$prefix/include/bpfmaps"
cp "$BPFMAPS_LIB_DIR/libbpfmaps.so" "$BPFMAPS_LIB_DIR/libbpfmaps.a" "$prefix/lib/"
cp "$here/include/bpfmaps.h" "$prefix/include/"
cp "$here/include/bpfmaps/libbpf_compat.h" "$prefix/include/bpfmaps/"
cat > "$prefix/lib/pkgconfig/bpfmaps.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: bpfmaps
Description: BPF-style maps in userspace: libbpf's map calls with a bpfmaps_ prefix
Version: $version
Libs: -L\${libdir} -lbpfmaps
Libs.private: -lpthread -ldl -lm
Cflags: -I\${includedir}
PC
echo "installed bpfmaps $version under $prefix"

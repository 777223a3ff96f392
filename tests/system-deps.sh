#!/usr/bin/env bash
# System packages some tests need, from Debian's packages: jemalloc and tcmalloc (the `allocator` knob is
# proven by preloading them), numactl (memory binding), PostgreSQL (a shared study of two workers), zsh (its
# completion script is loaded), chromium (the HTML report is rendered headless).
# Installs only what is missing, and only where it can (root with apt-get); elsewhere the tests that need
# a package say so and skip.
set -u
want=()
[ -e /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ] || [ -e /usr/lib/aarch64-linux-gnu/libjemalloc.so.2 ] || want+=(libjemalloc2)
ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 >/dev/null 2>&1 || want+=(libtcmalloc-minimal4)
command -v numactl >/dev/null || want+=(numactl)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || want+=(postgresql)
command -v zsh >/dev/null || want+=(zsh)
command -v chromium >/dev/null || want+=(chromium)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "tests/system-deps.sh: not root with apt-get; tests needing ${want[*]} will skip" >&2
    exit 0
fi
echo "tests/system-deps.sh: installing ${want[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
log=/tmp/autotune-system-deps.log
install() { apt-get install -y -qq --no-install-recommends "$@" >>"$log" 2>&1; }
apt-get update -qq >"$log" 2>&1
# All at once; if that fails, one at a time, so that a package this system lacks (chromium is a snap on
# Ubuntu) does not leave the others out.
if ! install "${want[@]}"; then
    for package in "${want[@]}"; do
        install "$package" || echo "tests/system-deps.sh: $package could not be installed (see $log); tests needing it will skip" >&2
    done
fi
# Installing postgresql must not leave a cluster running: the tests start their own server on loopback.
if command -v pg_ctlcluster >/dev/null; then
    pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | while read -r v c; do pg_ctlcluster "$v" "$c" stop >/dev/null 2>&1; done
fi
exit 0

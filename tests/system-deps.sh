#!/usr/bin/env bash
# System packages some tests need, from Debian's packages: jemalloc and tcmalloc (the `allocator` knob is
# proven by preloading them), numactl (memory binding), PostgreSQL (a shared study of two workers), zsh (its
# completion script is loaded).
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
# Installing postgresql must not leave a cluster running: the tests start their own server on loopback.
{ apt-get update -qq && apt-get install -y -qq --no-install-recommends "${want[@]}" && \
  { command -v pg_ctlcluster >/dev/null && pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | \
    while read -r v c; do pg_ctlcluster "$v" "$c" stop 2>/dev/null; done; true; }; } >/tmp/autotune-system-deps.log 2>&1 \
  || echo "tests/system-deps.sh: apt-get failed (see /tmp/autotune-system-deps.log); tests needing ${want[*]} will skip" >&2
exit 0

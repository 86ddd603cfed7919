#!/bin/bash
# Install the Debian packages named (those missing; nothing when all are there), as root, waiting for another
# apt-get or dpkg to finish rather than failing: apt's DPkg::Lock::Timeout makes `apt-get install` wait for dpkg's
# lock, and `apt-get update`, which that option does not cover (apt 2.6 fails at once on /var/lib/apt/lists/lock),
# is tried again while the lock is held. APT_WAIT_S caps the wait (default 15 min). Prints what it installed.
set -euo pipefail
APT_WAIT_S=${APT_WAIT_S:-900}
deadline=$(( $(date +%s) + APT_WAIT_S ))
apt_get() {
  local out
  while true; do
    if out=$(DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout="$APT_WAIT_S" "$@" 2>&1); then return 0; fi
    if ! grep -q "Could not get lock" <<<"$out" || [ "$(date +%s)" -ge "$deadline" ]; then echo "$out" >&2; return 1; fi
    echo "cluster: apt-get $1 waits for another apt/dpkg ($(grep -m1 -o 'held by process [0-9]* ([^)]*)' <<<"$out" || echo 'lock held'))"
    sleep 3
  done
}
missing=$(for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"; done)
[ -n "$missing" ] || exit 0
echo "cluster: installing $(echo $missing)"
apt_get update
# shellcheck disable=SC2086
apt_get install -y $missing

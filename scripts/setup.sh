#!/usr/bin/env bash
# Installs the Debian packages that are missing, when they are missing. Idempotent.
#   scripts/setup.sh           what the build and the tests need
#   scripts/setup.sh --build   what the build needs, nothing more (scripts/install.sh)
set -euo pipefail
# The build: the C libraries (their -dev packages bring the runtime libraries) and pkg-config.
packages=(libsqlite3-dev libsodium-dev libmicrohttpd-dev libcurl4-openssl-dev pkg-config libpng-dev libturbojpeg0-dev libpq-dev libncurses-dev)
case "${1:-}" in
  --build) ;;
  # The tests: a certificate (openssl), folders kept in step (unison, syncthing), a real terminal
  # (tmux), PostgreSQL, /usr/bin/time, the manual page and completion tests (man-db, zsh, fish),
  # the units' checks (systemd-analyze), the console in a real browser (chromium, its driver, Selenium).
  "") packages+=(openssl unison syncthing tmux postgresql time man-db zsh fish systemd chromium chromium-driver python3-selenium) ;;
  *) echo "Error: unknown option '$1' (--build, or nothing)" >&2; exit 64 ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v swift >/dev/null || { echo "setup: swift is not on PATH (Swift 6 toolchain required)" >&2; exit 1; }
